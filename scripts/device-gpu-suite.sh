#!/bin/bash
# On the GPU machine, from the checkout with .deps carried beside it:
#   bash scripts/device-gpu-suite.sh [sanitize] [bench NAME...] [peers]
# Builds with CUDA, runs `meson test --suite gpu`, optionally compute-sanitizer (memcheck,
# racecheck, initcheck and synccheck on the small-shape GPU tests; $SA_SANITIZE_TOOLS picks
# others) and benchmarks. Logs go to $OUT (or ./device-logs).
# SA_GPU_ONLY="gpu_a gpu_b" limits the gpu suite and the sanitizer to those tests (to fit a short
# device run); unset, every gpu test runs. SA_SANITIZE_ONLY="gpu_a ..." limits only the
# sanitizer runs.
# Extra flags: $SA_BENCH_ARGS goes to every `sparseattn bench NAME` (e.g. "--json"),
# $SA_PEERS_ARGS to bench/peers.py (e.g. "--mode sparse --budget-s 200"). The last lines repeat
# the test counts and each sanitizer run's summary.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device-logs}
source scripts/device-pack.sh # more than 8 files in $OUT: packed on exit
mkdir -p "$out"
source scripts/device-env.sh || { echo "cannot unpack .deps (run scripts/fetch-check-debs.sh here first)"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$out/gpu.txt"
t0=$(date +%s)
if ! { meson setup build-gpu -Dcuda=enabled -Dtests=enabled --wipe >"$out/setup.log" 2>&1 ||
       meson setup build-gpu -Dcuda=enabled -Dtests=enabled >"$out/setup.log" 2>&1; }; then
    tail -30 "$out/setup.log"; exit 1
fi
# -k 0: a target that fails to build (say, a file mid-edit in a shared tree) does not stop the
# others; its tests then fail to run and the build errors are printed.
if ! ninja -C build-gpu -k 0 >"$out/build.log" 2>&1; then
    status_build=1
    echo "BUILD ERRORS (continuing with what built):"
    grep -E "FAILED|error" "$out/build.log" | head -20
fi
echo "build: $(( $(date +%s) - t0 )) s"
status=0
meson test -C build-gpu --no-rebuild --suite gpu --print-errorlogs ${SA_GPU_ONLY:-} >"$out/gpu-tests.log" 2>&1 || status=1
grep -E "^ *[0-9]+/[0-9]+ |^Ok:|^Fail:|^Skipped:|FAILED|seed" "$out/gpu-tests.log" | tail -40
cp build-gpu/meson-logs/testlog.txt "$out/gpu-testlog.txt" 2>/dev/null
shift_args=("$@")
i=0
while [ $i -lt ${#shift_args[@]} ]; do
    a=${shift_args[$i]}
    case "$a" in
    sanitize)
        # Small shapes only: SA_SMALL asks each gpu test for its smallest case.
        for t in build-gpu/tests/test_gpu_*; do
            [ -f "$t" ] && [ -x "$t" ] || continue # not the *.p object folders
            if [ -n "${SA_GPU_ONLY:-}" ] && [[ " $SA_GPU_ONLY " != *" ${t##*/test_} "* ]]; then
                continue
            fi
            if [ -n "${SA_SANITIZE_ONLY:-}" ] && [[ " $SA_SANITIZE_ONLY " != *" ${t##*/test_} "* ]]; then
                continue
            fi
            for tool in ${SA_SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}; do
                SA_SMALL=1 timeout ${SA_SANITIZE_TIMEOUT:-150} compute-sanitizer --tool $tool --error-exitcode 9 "$t" \
                    >"$out/sanitize-$(basename "$t")-$tool.log" 2>&1
                echo "compute-sanitizer $tool $(basename "$t"): rc=$? $(grep -E 'SUMMARY' "$out/sanitize-$(basename "$t")-$tool.log" | tail -1)"
            done
        done ;;
    bench)
        i=$((i + 1))
        b=${shift_args[$i]}
        build-gpu/tools/sparseattn bench "$b" ${SA_BENCH_ARGS:-} 2>&1 | tee "$out/bench-$b.txt" ;;
    peers)
        PYTHONUNBUFFERED=1 python3 bench/peers.py --lib build-gpu/libsparseattn.so ${SA_PEERS_ARGS:-} \
            2>&1 | tee "$out/peers.txt" ;;
    *)
        echo "device-gpu-suite.sh: unknown word '$a' (sanitize, bench NAME, peers; peers' flags go in \$SA_PEERS_ARGS)"
        exit 2 ;;
    esac
    i=$((i + 1))
done
# The verdicts again, last: the device tool returns only the tail of a run's output, and the
# benchmarks above can push the test and sanitizer lines out of it.
echo "== summary"
grep -E "^Ok:|^Fail:|^Skipped:" "$out/gpu-tests.log"
for f in "$out"/sanitize-*.log; do
    [ -f "$f" ] || continue
    echo "$(basename "$f" .log): $(grep -E 'SUMMARY' "$f" | tail -1)"
done
exit $(( status || ${status_build:-0} ))
