#!/bin/bash
# The command-line program: bad flags give one line on stderr and exit code 2, never a crash;
# the default run (README's first command) succeeds and shows its table, a small run's --json
# line carries the fields scripts read.
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
expect 2 "negative seed after a space" "$cli" run --seed ' -1'
expect 2 "hexadecimal seed" "$cli" run --seed 0x10
expect 2 "top-k above the block count" "$cli" run --len-kv 1024 --topk 9
expect 2 "GQA mismatch" "$cli" run --heads-q 6 --heads-kv 4
expect 2 "bad head dim" "$cli" run --head-dim 96
expect 2 "unknown selector" "$cli" run --selector nope
expect 2 "unknown workload" "$cli" run --workload nope
expect 2 "bad device" "$cli" run --device tpu
expect 2 "negative strength" "$cli" run --strength -1
expect 2 "non-numeric strength" "$cli" run --strength strong
expect 2 "unknown benchmark" "$cli" bench nope
expect 2 "bench reference bad flag" "$cli" bench reference --nope
expect 2 "bench longctx bad flag" "$cli" bench longctx --nope
expect 2 "bench longctx bad length" "$cli" bench longctx --lens 16384,1000
expect 2 "bench longctx bad structure" "$cli" bench longctx --structures overlap17
expect 2 "bench longctx unknown contender" "$cli" bench longctx --contenders dense,bogus
expect 0 "bench longctx help" "$cli" bench longctx --help
# Flags are judged alike with and without CUDA, before "built without CUDA" or "no usable CUDA
# device"; an unknown contender's message names the valid ones.
err=$("$cli" bench longctx --contenders bogus 2>&1 >/dev/null)
case "$err" in *"no contender 'bogus' (contenders: dense, qcentric-union,"*"qcentric-masked)") ;;
    *) echo "FAIL: bench longctx --contenders bogus: $err"; fail=1 ;; esac
expect 2 "bench selectors unknown selector" "$cli" bench selectors --selectors nope
expect 2 "bench selectors unknown workload" "$cli" bench selectors --workloads gaussian,nope
expect 2 "bench selectors empty entry" "$cli" bench selectors --selectors r1,
# Every comma-separated flag splits its value in one place (cli_list, tools/cli.c): an empty entry
# (leading, trailing or doubled comma) or an empty list is a usage error, never skipped.
expect 2 "bench longctx empty contender" "$cli" bench longctx --contenders dense,
expect 2 "bench longctx doubled comma in --lens" "$cli" bench longctx --lens 16384,,32768
expect 2 "bench longctx leading comma in --structures" "$cli" bench longctx --structures ,local
expect 2 "bench longctx empty --lens" "$cli" bench longctx --lens ''
expect 2 "bench selectors leading comma in --workloads" "$cli" bench selectors --workloads ,gaussian
expect 2 "select-eval empty --index entry" "$cli" select-eval --len-q 256 --len-kv 512 --topk 2 \
    --workload local --selector r1 --index own,
expect 2 "select-eval doubled comma in --index" "$cli" select-eval --len-q 256 --len-kv 512 \
    --topk 2 --workload local --selector r1 --index own,,qk
# --activations: the list flags are judged before the file is opened (exit 2, not 1).
expect 2 "select-eval empty --layers entry" "$cli" select-eval --activations /nonexistent \
    --layers 1,
expect 2 "select-eval bad --layers range" "$cli" select-eval --activations /nonexistent --layers 1-
expect 2 "select-eval empty --budgets entry" "$cli" select-eval --activations /nonexistent \
    --budgets 8,
expect 2 "select-eval empty --head-lists entry" "$cli" select-eval --activations /nonexistent \
    --head-lists group,
expect 1 "select-eval good lists, no file" "$cli" select-eval --activations /nonexistent \
    --layers 0,2-3 --budgets 8,16 --head-lists group,pooled
err=$("$cli" bench longctx --lens 16384,,32768 2>&1 >/dev/null)
case "$err" in *"--lens: '16384,,32768' has an empty entry"*) ;;
    *) echo "FAIL: bench longctx --lens 16384,,32768: $err"; fail=1 ;; esac
expect 2 "bench selectors missing list" "$cli" bench selectors --selectors
expect 2 "bench selectors --no-validate" "$cli" bench selectors --no-validate
expect 2 "select-eval bad flag" "$cli" select-eval --nope
expect 2 "select-eval --index all with others" "$cli" select-eval --index all,proj:32
expect 2 "select-eval empty --head-lists" "$cli" select-eval --activations /nonexistent --head-lists ''
expect 0 "help" "$cli" --help
expect 0 "run help" "$cli" run --help

json=$("$cli" run "${small[@]}" --selector r4 --workload local --seed 010 --json) || { echo "FAIL: small run"; fail=1; }
for field in '"selector":"r4"' '"workload":"local"' '"useful_gflops":' '"attention_s":' '"seed":10,'; do
    case "$json" in *"$field"*) ;; *) echo "FAIL: run --json lacks $field: $json"; fail=1 ;; esac
done
table=$("$cli" run --len-q 256 --len-kv 1024 --heads-q 4 --topk 2) || { echo "FAIL: small run with dense"; fail=1; }
for row in 'err_vs_dense' $'\nr1 ' $'\noracle ' $'\nrandom ' $'\ndense '; do
    case "$table" in *"$row"*) ;; *) echo "FAIL: run table lacks '$row': $table"; fail=1 ;; esac
done
table=$("$cli" run --len-q 256 --len-kv 1024 --heads-q 4 --topk 2 --no-dense --device cpu) || { echo "FAIL: run --no-dense"; fail=1; }
case "$table" in *$'\noracle '*) echo "FAIL: run --no-dense has an oracle row: $table"; fail=1 ;; esac
case "$table" in *"device cpu"*) ;; *) echo "FAIL: run --device cpu: $table"; fail=1 ;; esac
# --causal on the CPU (the GPU's: tests/cli/test_cli_gpu.sh), every row causal; a causal run's
# dense row does about half the work of the same run without it.
cj=$("$cli" run --len-q 512 --len-kv 512 --heads-q 2 --topk 2 --causal --device cpu --json) || { echo "FAIL: run --causal"; fail=1; }
nj=$("$cli" run --len-q 512 --len-kv 512 --heads-q 2 --topk 2 --device cpu --json) || { echo "FAIL: run without --causal"; fail=1; }
case "$cj" in *'"causal":true'*'"device":"cpu"'*|*'"device":"cpu"'*'"causal":true'*) ;; *) echo "FAIL: run --causal --json: $cj"; fail=1 ;; esac
case "$nj" in *'"causal":false'*) ;; *) echo "FAIL: run --json without --causal: $nj"; fail=1 ;; esac
python3 - "$cj" "$nj" <<'PY' || { echo "FAIL: causal dense work is not about half"; fail=1; }
import json, sys
c, n = (json.loads(a) for a in sys.argv[1:3])
# useful GFLOP/s x seconds = the work: causal 512 x 512 attends 512 * 513 / 2 pairs of 512 * 512.
wc, wn = c["dense_gflops"] * c["dense_s"], n["dense_gflops"] * n["dense_s"]
assert abs(wc / wn - 513 / 1024) < 1e-3, (wc, wn)
assert 0 < c["recall_mean"] <= 1
PY

# The default run, what README's first command shows: the r1 row beside the oracle's, on the CPU
# where no GPU is present (its smaller default shape), in a few seconds.
t0=$(date +%s)
table=$("$cli" run) || { echo "FAIL: the default run"; fail=1; }
echo "default run: $(( $(date +%s) - t0 )) s"
for row in $'\nr1 ' $'\noracle ' $'\nrandom ' $'\ndense ' 'workload local' 'recall'; do
    case "$table" in *"$row"*) ;; *) echo "FAIL: default run lacks '$row': $table"; fail=1 ;; esac
done
json=$("$cli" run --json) || { echo "FAIL: default run --json"; fail=1; }
for field in '"selector":"r1"' '"workload":"local"' '"recall_mean":0.' '"oracle_recall_mean":0.' \
    '"rel_err_vs_dense":0.' '"oracle_rel_err_vs_dense":0.' '"random_recall_mean":0.'; do
    case "$json" in *"$field"*) ;; *) echo "FAIL: default run --json lacks $field: $json"; fail=1 ;; esac
done
if command -v python3 >/dev/null; then
    printf '%s' "$json" | python3 -c 'import json, sys; json.load(sys.stdin)' ||
        { echo "FAIL: default run --json is not JSON: $json"; fail=1; }
fi
# The oracle maximizes each tile's mass: no tile selector's mean recall exceeds it.
field() { printf '%s' "$json" | sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }
awk -v s="$(field recall_mean)" -v o="$(field oracle_recall_mean)" 'BEGIN { exit !(s <= o + 1e-6 && o > 0.5) }' ||
    { echo "FAIL: default run: r1's recall $(field recall_mean) vs the oracle's $(field oracle_recall_mean)"; fail=1; }
[ $fail = 0 ] && echo "cli: all checks passed"
exit $fail
