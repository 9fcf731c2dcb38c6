#!/bin/bash
# The command-line program: bad flags give one line on stderr and exit code 2, never a crash;
# a small run succeeds and its --json line carries the fields scripts read.
set -u
cli=$1
fail=0
expect() { # expected-code description command...
    local want=$1 what=$2
    shift 2
    local err rc
    err=$("$@" 2>&1 >/dev/null)
    rc=$?
    if [ "$rc" != "$want" ]; then
        echo "FAIL: $what: exit $rc, expected $want ($*)"
        fail=1
    elif [ "$want" = 2 ] && [ $# -gt 1 ] && [ "$(printf '%s\n' "$err" | wc -l)" != 1 ]; then
        echo "FAIL: $what: expected one line on stderr, got: $err"
        fail=1
    fi
}
small=(--len-q 256 --len-kv 640 --heads-q 4 --topk 2 --no-dense)
expect 2 "no command" "$cli" # prints the usage, several lines
expect 2 "unknown command" "$cli" frobnicate
expect 2 "unknown flag" "$cli" run --frobnicate
expect 2 "missing value" "$cli" run --batch
expect 2 "non-numeric size" "$cli" run --batch two
expect 2 "negative size" "$cli" run --len-q -5
expect 2 "zero size" "$cli" run --heads-kv 0
expect 2 "trailing garbage" "$cli" run --topk 4x
expect 2 "negative seed" "$cli" run --seed -1
expect 2 "top-k above the block count" "$cli" run --len-kv 1024 --topk 9
expect 2 "GQA mismatch" "$cli" run --heads-q 6 --heads-kv 4
expect 2 "bad head dim" "$cli" run --head-dim 96
expect 2 "unknown selector" "$cli" run --selector nope
expect 2 "unknown workload" "$cli" run --workload nope
expect 2 "bad device" "$cli" run --device tpu
expect 2 "unknown benchmark" "$cli" bench nope
expect 2 "bench reference bad flag" "$cli" bench reference --nope
expect 2 "select-eval bad flag" "$cli" select-eval --nope
expect 0 "help" "$cli" --help
expect 0 "run help" "$cli" run --help

json=$("$cli" run "${small[@]}" --selector r4 --workload local --json) || { echo "FAIL: small run"; fail=1; }
for field in '"selector":"r4"' '"workload":"local"' '"useful_gflops":' '"attention_s":'; do
    case "$json" in *"$field"*) ;; *) echo "FAIL: run --json lacks $field: $json"; fail=1 ;; esac
done
table=$("$cli" run --len-q 256 --len-kv 1024 --heads-q 4 --topk 2) || { echo "FAIL: small run with dense"; fail=1; }
case "$table" in *"relative L2 error"*) ;; *) echo "FAIL: run table: $table"; fail=1 ;; esac
[ $fail = 0 ] && echo "cli: all checks passed"
exit $fail
