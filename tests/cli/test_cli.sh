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
# A command line whose flags are all valid: it either ran (exit 0, on a GPU; the sizes below keep
# that short) or says why it could not (exit 1: no CUDA in the build, or no GPU), never exit 2.
expect_parsed() { # description command...
    local what=$1
    shift
    local err rc
    err=$("$@" 2>&1 >/dev/null)
    rc=$?
    case "$rc:$err" in
        0:*|1:*"built without CUDA"*|1:*"no usable CUDA device"*) ;;
        *) echo "FAIL: $what: exit $rc, expected its flags to parse ($*): $err"; fail=1 ;;
    esac
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
expect 2 "infinite strength" "$cli" run --strength inf
expect 2 "select-eval NaN strength" "$cli" select-eval --strength nan
expect 2 "bench GEMM rate below its range" "$cli" bench sparse --gemm-tflops 0.5
expect 2 "bench kvcentric GEMM rate not a number" "$cli" bench kvcentric --gemm-tflops fast
expect 2 "unknown benchmark" "$cli" bench nope
expect 2 "bench reference bad flag" "$cli" bench reference --nope
expect 2 "bench longctx bad flag" "$cli" bench longctx --nope
expect 2 "bench longctx bad length" "$cli" bench longctx --lens 16384,1000
expect 2 "bench longctx bad structure" "$cli" bench longctx --structures overlap17
expect 2 "bench longctx unknown contender" "$cli" bench longctx --contenders dense,bogus
expect 0 "bench longctx help" "$cli" bench longctx --help
expect 0 "bench longctx takes --gemm-tflops" "$cli" bench longctx --gemm-tflops 800 --help
expect 2 "bench longctx GEMM rate out of range" "$cli" bench longctx --gemm-tflops 0
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
# bench takes --help, -h and help, as the top level does.
expect 0 "bench --help" "$cli" bench --help
expect 0 "bench -h" "$cli" bench -h
expect 0 "bench help" "$cli" bench help

# Flags are judged alike with and without CUDA: what only a CUDA build knows (the stage registry,
# which selectors have a GPU function) is taken on trust without it, so these command lines parse
# in both builds (docs/benchmarks.md).
quick=(--reps 1 --warmup 0)
selq=(--no-pipeline --batch 1 --len-q 256 --len-kv 2048 --index-heads 0 "${quick[@]}")
expect_parsed "bench selectors GPU selectors" "$cli" bench selectors --selectors r1,nvfp4 "${selq[@]}"
expect_parsed "bench selectors a row" "$cli" bench selectors --selectors nvfp4_query/i1 "${selq[@]}"
# --timeline: 1..200 calls, and only in a build configured with -Dtimeline=true; elsewhere one
# line that names the option.
expect 2 "bench selectors --timeline 0" "$cli" bench selectors --timeline 0 "${selq[@]}"
err=$("$cli" bench selectors --timeline 3 "${selq[@]}" 2>&1 >/dev/null)
case "$?:$err" in
    2:*"-Dtimeline=true"*|0:*|1:*"built without CUDA"*|1:*"no usable CUDA device"*) ;;
    *) echo "FAIL: bench selectors --timeline 3: $err"; fail=1 ;;
esac
# The ids of the registry, from the help (none without CUDA, where any id in 1..99 parses).
sparse_id=$("$cli" run --help | sed -n 's/^sparse stages: \([0-9]*\) .*/\1/p')
dense_id=$("$cli" bench dense --help | sed -n 's/^dense stages: \([0-9]*\) .*/\1/p')
tile_id=$("$cli" bench dense --help |
    sed -n 's/^default tile-list stage (every block listed): \([0-9]*\) .*/\1/p')
expect_parsed "bench selectors --stage" "$cli" bench selectors --stage "${sparse_id:-17}" \
    --selectors r1 "${selq[@]}"
expect_parsed "bench dense --stage (the tile-list stage)" "$cli" bench dense \
    --stage "${tile_id:-17}" "${quick[@]}"
expect_parsed "bench sparse --stage" "$cli" bench sparse --stage "${sparse_id:-15}" --no-validate \
    "${quick[@]}"
expect 2 "bench --stage 0" "$cli" bench sparse --stage 0
expect 2 "bench --stage past the range" "$cli" bench dense --stage 100
if [ -n "$sparse_id" ]; then # with CUDA: the registry judges the id and the selectors' names
    [ -n "$dense_id" ] && [ -n "$tile_id" ] ||
        { echo "FAIL: bench dense --help names no dense or tile-list stage"; fail=1; }
    expect 2 "bench dense a sparse stage" "$cli" bench dense --stage "$sparse_id"
    expect 2 "bench sparse a dense stage" "$cli" bench sparse --stage "$dense_id"
    expect 2 "bench selectors a dense stage" "$cli" bench selectors --stage "$dense_id"
    expect 2 "bench sparse an id the registry lacks" "$cli" bench sparse --stage 99
    expect 2 "bench selectors no GPU function" "$cli" bench selectors --selectors oracle
    expect 2 "run a dense stage" "$cli" run --stage "$dense_id" "${small[@]}"
else
    expect_parsed "bench selectors a CPU-only selector without CUDA" "$cli" bench selectors \
        --selectors oracle "${selq[@]}"
fi
# bench selectors judges its sizes after parsing, before any GPU work, in both builds: each
# shape passes sa_shape_check, len-kv gives 16..8192 blocks, the index heads divide 16.
expect 2 "bench selectors too few blocks" "$cli" bench selectors --len-kv 1920
expect 2 "bench selectors too many blocks" "$cli" bench selectors --len-kv 1048577
expect 2 "bench selectors bad shape" "$cli" bench selectors --batch 65536 --len-q 1073741824
expect 2 "bench selectors bad shape at a default length" "$cli" bench selectors --batch 8 \
    --len-q 100000000
expect 2 "bench selectors index heads" "$cli" bench selectors --index-heads 3
expect_parsed "bench selectors smallest len-kv" "$cli" bench selectors --selectors r1 \
    --no-pipeline --batch 1 --len-q 256 --len-kv 1921 "${quick[@]}"
expect_parsed "bench selectors index heads 2" "$cli" bench selectors --selectors nvfp4/i2 \
    --no-pipeline --batch 1 --len-q 256 --len-kv 2048 --index-heads 2 "${quick[@]}"
# run --stage: a sparse stage for the GPU; with --device cpu a usage error, and a notice where
# --device auto takes the CPU (here always: nvfp4_query writes per-query lists).
expect 2 "run --stage with --device cpu" "$cli" run --stage "${sparse_id:-17}" --device cpu \
    "${small[@]}"
err=$("$cli" run --stage "${sparse_id:-17}" --selector nvfp4_query "${small[@]}" 2>&1 >/dev/null)
case "$err" in *"--stage ${sparse_id:-17} is not used: the run is on the CPU"*) ;;
    *) echo "FAIL: run --stage on the CPU gives no notice: $err"; fail=1 ;; esac
# --index-heads shapes the qk / proj index vectors: without such an --index choice it is a usage
# error, not silently unused.
sel_small=(--len-q 256 --len-kv 512 --topk 2 --workload local --selector r1)
expect 2 "select-eval --index-heads without --index" "$cli" select-eval "${sel_small[@]}" \
    --index-heads 1
expect 2 "select-eval --index-heads with --index own" "$cli" select-eval "${sel_small[@]}" \
    --index own --index-heads 1
expect 0 "select-eval --index-heads with --index qk" "$cli" select-eval "${sel_small[@]}" \
    --index qk --index-heads 1
# The selector column fits the longest registered name (nvfp4_mass_q8, 13 characters, when this
# was written): a row's columns end where the header's do.
longest=$("$cli" run --help | sed -n 's/^selectors: //p' | tr ' ' '\n' |
    awk 'length > m { m = length; n = $0 } END { print n }')
aligned() { # the table on stdin, the number of leading fields to compare
    awk -v n="$1" 'function end(s,  i, pos) { # the column where field n ends
            for (i = 1; i <= n; i++) {
                if (!match(s, /^ *[^ ]+/))
                    return -1
                pos += RLENGTH
                s = substr(s, RLENGTH + 1)
            }
            return pos }
        /^(lists|workload) / { h = end($0); next } h && !NF { h_done = 1 }
        h && !h_done && NF { if (end($0) != h) bad = 1; rows++ }
        END { exit !(h > 0 && rows > 0 && !bad) }'
}
"$cli" run --selector "$longest" --len-q 256 --len-kv 1024 --heads-q 4 --topk 2 --device cpu |
    aligned 2 || { echo "FAIL: run: the lists column does not fit $longest"; fail=1; }
"$cli" select-eval --len-q 256 --len-kv 512 --topk 2 --workload local --selector "$longest" |
    aligned 3 || { echo "FAIL: select-eval: the selector column does not fit $longest"; fail=1; }

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
