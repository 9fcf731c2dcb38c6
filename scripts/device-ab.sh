#!/bin/bash
# On the GPU machine: time a compile-time variant of the library against the default build.
#   bash scripts/device-ab.sh "CUDA_ARGS" BENCH [BENCH...]
# Builds build-a (default) and build-b (meson -Dcuda_args="CUDA_ARGS", e.g. "-DMY_SWITCH=0",
# for a switch you put in the code), then runs `sparseattn bench BENCH` for each BENCH,
# alternating a and b for $SA_AB_ROUNDS rounds (default 3), so that a drift of the card's clock
# falls on both. Each output line is prefixed [a rN] or [b rN]; full logs go to $OUT.
# Needs no Check: both builds leave the tests out. Extra bench flags: $SA_BENCH_ARGS.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: bash scripts/device-ab.sh \"CUDA_ARGS\" BENCH [BENCH...]"; exit 2; }
out=${OUT:-device-logs}
mkdir -p "$out"
args_b=$1
shift
for v in a b; do
    extra=()
    [ $v = b ] && extra=(-Dcuda_args="$args_b")
    if ! { meson setup build-$v -Dcuda=enabled -Dtests=disabled "${extra[@]}" >"$out/ab-setup-$v.log" 2>&1 ||
           meson setup build-$v --reconfigure -Dcuda=enabled -Dtests=disabled "${extra[@]}" \
               >"$out/ab-setup-$v.log" 2>&1; }; then
        echo "meson setup of build-$v failed"; tail -20 "$out/ab-setup-$v.log"; exit 1
    fi
    ninja -C build-$v >"$out/ab-build-$v.log" 2>&1 ||
        { echo "build-$v failed"; grep -E "error" "$out/ab-build-$v.log" | head -20; exit 1; }
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
for r in $(seq 1 "${SA_AB_ROUNDS:-3}"); do
    for v in a b; do
        for bench in "$@"; do
            build-$v/tools/sparseattn bench "$bench" ${SA_BENCH_ARGS:-} 2>&1 |
                tee -a "$out/ab-$bench-$v.txt" | sed "s/^/[$v r$r] /"
        done
    done
done
