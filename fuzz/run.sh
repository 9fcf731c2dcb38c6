#!/bin/bash
# Runs every fuzz target for a bounded time: fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET] [JOBS]
# (defaults 60 s and 1 job). New inputs go to BUILD_DIR/corpus/TARGET (the seeds in
# fuzz/corpus/TARGET are read, never written); a crash is saved as BUILD_DIR/artifacts/TARGET-*
# and fails the run. docs/fuzzing.md says how to run longer and how to turn a crash into a test.
set -euo pipefail
build=${1:?usage: fuzz/run.sh BUILD_DIR [SECONDS] [JOBS]}
secs=${2:-60}
jobs=${3:-1}
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$build" && pwd)
# With several jobs libFuzzer writes fuzz-N.log into the working directory: keep them in the build.
par=()
if [ "$jobs" -gt 1 ]; then
    par=(-jobs="$jobs" -workers="$jobs")
fi
cd "$build"
status=0
for t in shape tile_lists query_lists cli; do
    exe="$build/fuzz_$t"
    mkdir -p "$build/corpus/$t" "$build/artifacts"
    echo "fuzz_$t: ${secs} s"
    # -rss_limit_mb: a validator's scratch is at most a few MiB, so more is a finding.
    if ! "$exe" -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
        "${par[@]}" -print_final_stats=1 \
        -artifact_prefix="$build/artifacts/$t-" "$build/corpus/$t" "$here/corpus/$t" \
        >"$build/fuzz_$t.log" 2>&1; then
        echo "fuzz_$t FAILED; the input is in $build/artifacts/, the log in $build/fuzz_$t.log"
        tail -40 "$build/fuzz_$t.log"
        status=1
    else
        grep -E "stat::number_of_executed_units|stat::new_units_added" "$build/fuzz_$t.log" |
            tr '\n' ' ' || true
        echo
    fi
done
exit $status
