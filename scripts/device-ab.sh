#!/bin/bash
# On the GPU machine: time compile-time variants of the library against the default build.
#   bash scripts/device-ab.sh "CUDA_ARGS" BENCH [BENCH...]
#   bash scripts/device-ab.sh "CUDA_ARGS_B" "CUDA_ARGS_C" ... -- BENCH [BENCH...]
# Builds build-a (default) and build-b, build-c, ... (meson -Dcuda_args="CUDA_ARGS", e.g.
# "-DMY_SWITCH=0", for a switch you put in the code), then runs `sparseattn bench BENCH` for each
# BENCH, alternating the builds for $SA_AB_ROUNDS rounds (default 3), so that a drift of the
# card's clock falls on all of them. Each output line is prefixed [a rN], [b rN], ...; full logs
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
dir_a=build-a
if [ -n "${SA_AB_BASE:-}" ]; then
    [ -x "$SA_AB_BASE/tools/sparseattn" ] || { echo "SA_AB_BASE=$SA_AB_BASE has no tools/sparseattn"; exit 1; }
    dir_a=$SA_AB_BASE
fi
for i in "${!names[@]}"; do
    v=${names[$i]}
    [ "$v" = a ] && [ -n "${SA_AB_BASE:-}" ] && continue
    extra=()
    [ "$i" -gt 0 ] && extra=(-Dcuda_args="${variants[$((i - 1))]}")
    [ "$i" -gt 0 ] && echo "build-$v: ${variants[$((i - 1))]}"
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
    for v in "${names[@]}"; do
        for bench in "$@"; do
            dir=build-$v
            [ "$v" = a ] && dir=$dir_a
            $dir/tools/sparseattn bench "$bench" ${SA_BENCH_ARGS:-} 2>&1 |
                tee -a "$out/ab-$bench-$v.txt" | sed "s/^/[$v r$r] /"
        done
    done
done
