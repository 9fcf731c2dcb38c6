#!/bin/bash
# On the GPU machine: time the checkout against an earlier revision of it, in the same call.
#   here:  git archive REV -o .probe/base.tar      (any folder the run carries; REV: e.g. main)
#   there: bash scripts/device-ab-rev.sh .probe/base.tar "ARGS" ["ARGS"...]
# Builds the revision in a temporary folder and the checkout in build-ab (both -Dcuda=enabled,
# -Dtests=disabled, in parallel), checks that both sparseattn programs exist, then runs
# `sparseattn ARGS` (e.g. "bench selectors --len-kv 16384 --selectors nvfp4/i1") with each
# program for $SA_AB_ROUNDS rounds (default 4). The order of the two programs swaps every round:
# a card that warms up or throttles over a run would otherwise favour the program that always
# runs first (session 26 saw a 3% "regression" that was only that). Each line is prefixed
# [base rN] or [new rN]; full logs go to $OUT (or ./device-logs), packed as device-pack.sh does.
# Extra meson options for both builds: $SA_AB_MESON (e.g. "-Dtimeline=true").
set -uo pipefail
cd "$(dirname "$0")/.."
usage='usage: bash scripts/device-ab-rev.sh BASE.tar "SPARSEATTN ARGS" ["SPARSEATTN ARGS"...]'
[ $# -ge 2 ] || { echo "$usage"; exit 2; }
tarball=$1
shift
[ -f "$tarball" ] || { echo "device-ab-rev: no file $tarball (make it with git archive)"; exit 2; }
out=${OUT:-device-logs}
source scripts/device-pack.sh # more than 8 files in $OUT: packed on exit
mkdir -p "$out"
base_dir=$(mktemp -d)
tar -xf "$tarball" -C "$base_dir" || { echo "device-ab-rev: cannot unpack $tarball"; exit 1; }
# shellcheck disable=SC2086 # SA_AB_MESON is a list of options
build() { # source-dir build-dir log-name
    { meson setup "$2" "$1" -Dcuda=enabled -Dtests=disabled ${SA_AB_MESON:-} &&
        ninja -C "$2"; } >"$out/ab-rev-build-$3.log" 2>&1
}
build "$base_dir" "$base_dir/build" base &
pid_base=$!
build . build-ab new &
pid_new=$!
wait $pid_base || { echo "device-ab-rev: the base build failed:"; tail -20 "$out/ab-rev-build-base.log"; exit 1; }
wait $pid_new || { echo "device-ab-rev: the checkout's build failed:"; tail -20 "$out/ab-rev-build-new.log"; exit 1; }
prog_base=$base_dir/build/tools/sparseattn
prog_new=build-ab/tools/sparseattn
for p in "$prog_base" "$prog_new"; do
    [ -x "$p" ] || { echo "device-ab-rev: $p was not built"; exit 1; }
done
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
rounds=${SA_AB_ROUNDS:-4}
for r in $(seq 1 "$rounds"); do
    order="base new"
    [ $((r % 2)) = 0 ] && order="new base"
    for args in "$@"; do
        for v in $order; do
            prog=$prog_new
            [ "$v" = base ] && prog=$prog_base
            # shellcheck disable=SC2086 # args is one command line of sparseattn's
            "$prog" $args 2>&1 | tee -a "$out/ab-rev-$v.txt" | sed "s/^/[$v r$r] /"
        done
    done
done
