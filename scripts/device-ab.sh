#!/bin/bash
# On the GPU machine: time compile-time variants of the library against the default build.
#   bash scripts/device-ab.sh "CUDA_ARGS" BENCH [BENCH...]
#   bash scripts/device-ab.sh "CUDA_ARGS_B" "CUDA_ARGS_C" ... -- BENCH [BENCH...]
# Builds build-a (default) and build-b, build-c, ... (meson -Dcuda_args="CUDA_ARGS", e.g.
# "-DMY_SWITCH=0", for a switch you put in the code), then runs `sparseattn bench BENCH` for each
# BENCH, alternating the builds for $SA_AB_ROUNDS rounds (default 3). The builds run in parallel.
# Each round starts one build later than the last (a b c, b c a, c a b, ...): a card that warms
# up or throttles over a run would otherwise favour the build that always runs first (session 26
# measured a false 3% from that). Each output line is prefixed [a rN], [b rN], ...; full logs
# go to $OUT. Needs no Check: the builds leave the tests out. Extra bench flags: $SA_BENCH_ARGS.
# SA_AB_BASE=DIR times an existing build (e.g. build-gpu of scripts/device-gpu-suite.sh, made in
# the same call) as variant a instead of building build-a.
set -uo pipefail
cd "$(dirname "$0")/.."
usage='usage: bash scripts/device-ab.sh "CUDA_ARGS" [...] [--] BENCH [BENCH...]'
[ $# -ge 2 ] || { echo "$usage"; exit 2; }
out=${OUT:-device-logs}
source scripts/device-pack.sh # more than 8 files in $OUT: packed on exit
mkdir -p "$out"
variants=()
if [[ " $* " == *" -- "* ]]; then
    while [ "$1" != "--" ]; do variants+=("$1"); shift; done
    shift
else
    variants=("$1")
    shift
fi
[ $# -ge 1 ] || { echo "$usage"; exit 2; }
names=(a)
letters=(b c d e f g h)
for i in "${!variants[@]}"; do names+=("${letters[$i]}"); done
dirs=()
for v in "${names[@]}"; do dirs+=("build-$v"); done
if [ -n "${SA_AB_BASE:-}" ]; then
    [ -x "$SA_AB_BASE/tools/sparseattn" ] || { echo "SA_AB_BASE=$SA_AB_BASE has no tools/sparseattn"; exit 1; }
    dirs[0]=$SA_AB_BASE
fi
build_variant() { # index: meson setup and ninja of build-<name>, in the background
    local i=$1 v=${names[$1]} extra=()
    [ "$i" -gt 0 ] && extra=(-Dcuda_args="${variants[$((i - 1))]}")
    if ! { meson setup build-$v -Dcuda=enabled -Dtests=disabled "${extra[@]}" >"$out/ab-setup-$v.log" 2>&1 ||
           meson setup build-$v --reconfigure -Dcuda=enabled -Dtests=disabled "${extra[@]}" \
               >"$out/ab-setup-$v.log" 2>&1; }; then
        echo "meson setup of build-$v failed"; tail -20 "$out/ab-setup-$v.log"; return 1
    fi
    ninja -C build-$v >"$out/ab-build-$v.log" 2>&1 ||
        { echo "build-$v failed"; grep -E "FAILED|error:|fatal" "$out/ab-build-$v.log" | head -20; return 1; }
}
pids=()
for i in "${!names[@]}"; do
    v=${names[$i]}
    [ "$v" = a ] && [ -n "${SA_AB_BASE:-}" ] && continue
    [ "$i" -gt 0 ] && echo "build-$v: ${variants[$((i - 1))]}"
    build_variant "$i" &
    pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ $failed = 0 ] || exit 1
for dir in "${dirs[@]}"; do
    [ -x "$dir/tools/sparseattn" ] || { echo "device-ab: $dir/tools/sparseattn was not built"; exit 1; }
done
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
for r in $(seq 1 "${SA_AB_ROUNDS:-3}"); do
    for k in "${!names[@]}"; do
        i=$(((k + r - 1) % ${#names[@]}))
        v=${names[$i]}
        for bench in "$@"; do
            "${dirs[$i]}"/tools/sparseattn bench "$bench" ${SA_BENCH_ARGS:-} 2>&1 |
                tee -a "$out/ab-$bench-$v.txt" | sed "s/^/[$v r$r] /"
        done
    done
done
