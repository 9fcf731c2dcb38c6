#!/bin/bash
# The CLI's GPU paths with --causal (issue #15), on a GPU; exits 77 (skipped) without one.
#   run: the selector's lists on the default tile stage, checked against the CPU reference on the
#     same lists; the causal dense row is that stage over every visible block, so the oracle
#     with topk = every block must match it to rounding.
#   select-eval: the GPU selectors' causal lists (with counts) against the CPU's; with index
#     vectors (--index qk, one index head per KV group) the nvfp4 rows on the GPU, r1 / r4 on
#     the CPU.
cli=$1
fail=0
shape=(--len-q 1024 --len-kv 2048 --heads-q 16 --heads-kv 1)
errf=$(mktemp)
if ! out=$("$cli" run --device cuda --causal "${shape[@]}" --topk 4 --json 2>"$errf"); then
    err=$(cat "$errf")
    rm -f "$errf"
    case "$err" in *"no usable CUDA device"*|*"built without CUDA"*) echo "skip: $err"; exit 77 ;; esac
    echo "FAIL: run --device cuda --causal: $err"
    exit 1
fi
rm -f "$errf"
all=$("$cli" run --device cuda --causal "${shape[@]}" --selector oracle --topk 16 --json) ||
    { echo "FAIL: run --device cuda --causal --selector oracle --topk 16"; fail=1; }
python3 - "$out" "$all" <<'PY' || fail=1
import json, sys
r, a = (json.loads(x) for x in sys.argv[1:3])
for j in (r, a):
    assert j["device"] == "cuda" and j["causal"] is True, j
    # The GPU's output on the lists against the CPU reference on the same lists.
    assert j["rel_err_vs_reference"] is not None and j["rel_err_vs_reference"] < 1e-2, j
    assert j["dense_s"] is not None and 0 < j["recall_mean"] <= 1, j
# Every visible block: the dense row's kernel on the same blocks (in the oracle's order, so the
# sums differ by rounding only).
assert a["rel_err_vs_dense"] < 1e-2 and abs(a["recall_mean"] - 1) < 1e-6, a
assert 0 < r["rel_err_vs_dense"] < 1, r
print("run --causal on the GPU: sparse vs reference %.2e, every block vs dense %.1e"
      % (r["rel_err_vs_reference"], a["rel_err_vs_dense"]))
PY
sel=$("$cli" select-eval --device cuda --causal --len-q 1024 --len-kv 2048 --heads-q 4 --heads-kv 1 \
      --topk 4 --workload clustered --json) || { echo "FAIL: select-eval --device cuda --causal"; fail=1; }
python3 - "$sel" <<'PY' || fail=1
import json, sys
rows = [json.loads(l) for l in sys.argv[1].splitlines() if l.startswith("{")]
gpu = [r for r in rows if r["device"] == "cuda"]
assert {r["selector"] for r in gpu} >= {"r1", "r4"}, rows
for r in gpu:
    # Rows equal to the CPU's (count and entries); nvfp4's FP4 rounding may flip a near tie.
    need = 0.9 if r["selector"].startswith("nvfp4") else 0.99
    assert r["cpu_match"] >= need, r
    assert 0 < r["recall_mean"] <= 1, r
    print("select-eval --causal %s on the GPU: cpu_match %.4f recall %.3f"
          % (r["selector"], r["cpu_match"], r["recall_mean"]))
PY
idx=$("$cli" select-eval --device cuda --len-q 512 --len-kv 1024 --heads-q 4 --heads-kv 2 \
      --topk 3 --workload clustered --index qk --json) || { echo "FAIL: select-eval --index qk"; fail=1; }
python3 - "$idx" <<'PY' || fail=1
import json, sys
rows = [json.loads(l) for l in sys.argv[1].splitlines() if l.startswith("{")]
qk = [r for r in rows if r.get("index") == "qk"]
dev = {r["selector"]: r["device"] for r in qk}
assert dev.get("nvfp4") == "cuda" and dev.get("nvfp4_query") == "cuda", rows
assert dev.get("r1") == "cpu" and dev.get("r4") == "cpu", rows
for r in qk:
    if r["device"] == "cuda":
        assert r["cpu_match"] >= 0.9 and 0 < r["recall_mean"] <= 1, r
        print("select-eval --index qk %s on the GPU: cpu_match %.4f" % (r["selector"], r["cpu_match"]))
PY
exit $fail
