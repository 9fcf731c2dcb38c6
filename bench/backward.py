#!/usr/bin/env python3
"""The GPU backward of tile-list attention (sa_gpu_tile_sparse_backward, issue #20) against the
block-sparse backwards of its peers, on the study's shape (bench/shapes.h: B 2, 16 query heads,
D 128, len_q 4096, 16 independent blocks of 128 per Q tile) at each len_kv:

    python3 bench/backward.py --lib build-gpu/libsparseattn.so [--len-kv 4096,8192,16384]
        [--heads-kv 1,16] [--rounds 3] [--reps 12] [--json PATH]

Contenders, each only when importable, each from the same Q, K, V, dO and lists, each fed the
O and LSE of its own forward:
  ours     validation off (its GPU time), and the host time of a validated call beside it,
           synchronous and into a verdict (sa_gpu_attn_bwd.verdict: no synchronization);
  fa4      FlashAttention-4's CuTe backward with block-sparse tensors (the lists transposed
           to the KV-major form its backward takes, every block full);
  bsa      cuDNN BSA backward (SM90: MHA only, so it runs only where Hkv = Hq);
  flex     FlexAttention's backward (torch autograd of flex_attention over a BlockMask).
Every peer's dQ, dK, dV are checked against ours (relative L2). GPU time is the median over
interleaved rounds, each batch queued behind a device sleep (peers.time_interleaved), so the
host's launch cost stays out of it; host time per call is printed beside it. Useful TFLOP/s
count 2.5x the forward's useful FLOPs (the convention of FlashAttention's papers): 4 B Hq Sq K
128 D for the forward."""
import argparse
import ctypes
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peers  # noqa: E402  (timing, the peers' loaders and metadata, the shapes)

TILE = peers.TILE
PEERS = ("fa4", "bsa", "flex")  # the backwards this script can time beside ours


def log(msg):
    print(msg, flush=True)


def random_lists(torch, B, LH, T, nb, K, seed):
    """Independent lists: K distinct blocks of nb per (batch, list head, tile), ascending."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    rows = [torch.randperm(nb, generator=g)[:K].sort().values for _ in range(B * LH * T)]
    return torch.stack(rows).to(torch.int32).reshape(B, LH, T, K).cuda()


def ours_calls(torch, sa, q, k, v, o, lse, do, lists, dq_pass="auto"):
    """(call validated, call unvalidated, call validated into a verdict) of our backward into
    preallocated gradients, through the dQ pass `dq_pass` (auto, stored or recompute:
    docs/backward.md). The verdict's code is read once the timing is done (check_verdict)."""
    from sparseattn import _backward_gpu as bg
    bg._bind()
    lib = sa._core.lib
    dq = torch.empty(q.shape, dtype=torch.float32, device="cuda")
    dk = torch.empty(k.shape, dtype=torch.float32, device="cuda")
    dv = torch.empty(v.shape, dtype=torch.float32, device="cuda")
    B, Hq, Sq, D = q.shape
    args = []
    verdict = ctypes.c_void_p()
    lib.sa_gpu_verdict_create.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.sa_gpu_verdict_read.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    if lib.sa_gpu_verdict_create(ctypes.byref(verdict)):
        raise RuntimeError("sa_gpu_verdict_create failed")
    for validate, with_verdict in ((1, 0), (0, 0), (1, 1)):
        a = bg.SaGpuAttnBwd()
        lib.sa_gpu_attn_bwd_default(ctypes.byref(a))
        a.shape = sa._capi.SaShape(B, Hq, k.shape[1], Sq, k.shape[2], D)
        a.q, a.k, a.v, a.o, a.lse, a.d_o = (x.data_ptr() for x in (q, k, v, o, lse, do))
        a.lists = sa._capi.SaTileLists(lists.data_ptr(), None, lists.shape[1], lists.shape[3])
        a.dq, a.dk, a.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
        a.validate = validate
        a.verdict = verdict if with_verdict else None
        a.dq_pass = bg.DQ_PASSES[dq_pass]
        a.stream = torch.cuda.current_stream().cuda_stream
        size = ctypes.c_size_t()
        rc = lib.sa_gpu_backward_workspace_size(ctypes.byref(a), ctypes.byref(size))
        if rc:
            raise RuntimeError("workspace size: " + sa.strerror(rc))
        ws = torch.empty(size.value, dtype=torch.uint8, device="cuda")
        a.workspace, a.workspace_bytes = ws.data_ptr(), size.value
        a._keep = ws
        args.append(a)

    def make(a):
        ref = ctypes.byref(a)
        fn = lib.sa_gpu_tile_sparse_backward

        def call():
            rc = fn(ref)
            if rc:
                raise RuntimeError("sa_gpu_tile_sparse_backward: " + sa.strerror(rc))
            return dq, dk, dv
        return call

    def check_verdict():
        rc = lib.sa_gpu_verdict_read(verdict, torch.cuda.current_stream().cuda_stream)
        if rc:
            raise RuntimeError("the validated calls' verdict: " + sa.strerror(rc))
    rec = make(args[2])
    rec.check = check_verdict
    return make(args[0]), make(args[1]), rec


def fa4_bwd_tensors(torch, BST, lists, Hq, n_blocks):
    """FA4's backward block-sparse tensors: per (batch, head, KV block) the Q tiles that list it
    (ascending), all as full blocks; the mask tensors empty."""
    B, LH, T, K = lists.shape
    member = torch.zeros(B, LH, n_blocks, T, dtype=torch.bool, device="cuda")
    for t in range(T):  # member[b, lh, blk, t] = tile t lists blk
        member[:, :, :, t].scatter_(2, lists[:, :, t, :].long(), True)
    cnt = member.sum(-1, dtype=torch.int32)
    order = torch.argsort((~member).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    cnt, order = (x.expand(B, Hq, *x.shape[2:]).contiguous() if LH != Hq else x
                  for x in (cnt, order))
    z_cnt = torch.zeros_like(cnt)
    z_idx = torch.zeros(*cnt.shape, 1, dtype=torch.int32, device="cuda")
    return BST(z_cnt, z_idx, cnt, order, block_size=(TILE, TILE))


def rel(torch, x, ref):
    x, ref = x.float(), ref.float()
    return float(torch.linalg.vector_norm(x - ref) / max(float(torch.linalg.vector_norm(ref)),
                                                         1e-30))


def run_shape(torch, sa, args, hkv, skv, summary):
    B, Hq, Sq, D, K = (peers.SPARSE_B, peers.SPARSE_HQ, peers.SPARSE_SQ, peers.SPARSE_D,
                       peers.SPARSE_K)
    T, nb = Sq // TILE, skv // TILE
    torch.manual_seed(args.seed + skv + hkv)
    q = torch.randn(B, Hq, Sq, D, device="cuda").bfloat16()
    k = torch.randn(B, hkv, skv, D, device="cuda").bfloat16()
    v = torch.randn(B, hkv, skv, D, device="cuda").bfloat16()
    do = torch.randn(B, Hq, Sq, D, device="cuda").bfloat16()
    LH = hkv  # a list per KV head (shared by its group)
    lists = random_lists(torch, B, LH, T, nb, K, args.seed + skv)
    fwd_useful = 4.0 * B * Hq * Sq * K * TILE * D
    flops = 2.5 * fwd_useful
    label = "B%d Hq%d Hkv%d Sq%d Skv%d K%d" % (B, Hq, hkv, Sq, skv, K)
    floor = flops / (args.gemm * 1e9)  # the 5 GEMMs of the useful FLOPs at the GEMM rate
    log("%s: backward useful %.2f TFLOP per call; floor %.3f ms at the GEMM rate" % (
        label, flops / 1e12, floor))
    o, lse = sa.block_sparse_attention(q, k, v, lists)
    ours_val, ours, ours_rec = ours_calls(torch, sa, q, k, v, o, lse, do, lists)
    dq, dk, dv = (x.clone() for x in ours())
    ours_val()
    torch.cuda.synchronize()
    timers = {"ours": [ours]}
    notes = {}
    if args.recompute:  # the 7-GEMM dQ pass beside the default, in the same interleaved rounds
        _, ours_rc, _ = ours_calls(torch, sa, q, k, v, o, lse, do, lists, "recompute")
        r = ours_rc()
        torch.cuda.synchronize()
        notes["ours-rc"] = "dQ %.1e dK %.1e dV %.1e vs ours" % (
            rel(torch, r[0], dq), rel(torch, r[1], dk), rel(torch, r[2], dv))
        timers["ours-rc"] = [ours_rc]
    if args.profile:  # where our time goes, kernel by kernel (torch's profiler, CUPTI)
        from torch.profiler import ProfilerActivity, profile
        for name, (fn,) in timers.items():
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
            for ev in prof.key_averages():
                us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
                if us > 0:
                    log("  profile %s: %-40s %8.3f ms per call" % (name, ev.key[:40], us / 3e3))
    # FA4
    if "fa4" in args.peers:
        try:
            from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch as BST
            from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd
            qb, kb, vb, dob = peers.bshd((q, k, v, do))
            mc, mi, fc, fi = (x.cuda() for x in peers.fa4_sparse_metadata(lists, None, torch))
            fwd_bs = BST(mc, mi, fc, fi, block_size=(TILE, TILE))
            o4, l4 = _flash_attn_fwd(qb, kb, vb, return_lse=True, block_sparse_tensors=fwd_bs)[:2]
            bwd_bs = fa4_bwd_tensors(torch, BST, lists, Hq, nb)

            def fa4():
                return _flash_attn_bwd(qb, kb, vb, o4, dob, l4, block_sparse_tensors=bwd_bs)
            t0 = time.time()
            r = fa4()
            torch.cuda.synchronize()
            notes["fa4"] = "first call %.1f s; dQ %.1e dK %.1e dV %.1e vs ours" % (
                time.time() - t0, rel(torch, r[0].transpose(1, 2), dq),
                rel(torch, r[1].transpose(1, 2), dk), rel(torch, r[2].transpose(1, 2), dv))
            timers["fa4"] = [fa4]
        except Exception as e:  # noqa: BLE001
            notes["fa4"] = "n/a: %s" % peers.first_line(e)
    # cuDNN BSA (MHA only on SM90)
    if "bsa" in args.peers:
        if hkv != Hq:
            notes["bsa"] = "n/a: SM90 backward is MHA only (Hkv = Hq)"
        else:
            try:
                import cudnn
                idx, nums = peers.bsa_metadata(lists, None, Hq, TILE, torch)
                idx = idx.contiguous()
                r = cudnn.BSA.block_sparse_attention_forward(q, k, v, idx,
                                                             sparse_block_size=TILE)
                ob, lb = r["o_tensor"], r["lse_tensor"]

                def bsa():
                    return cudnn.BSA.block_sparse_attention_backward(
                        do, q, k, v, ob, lb, idx, sparse_block_size=TILE)
                t0 = time.time()
                r = bsa()
                torch.cuda.synchronize()
                notes["bsa"] = "first call %.1f s; dQ %.1e dK %.1e dV %.1e vs ours" % (
                    time.time() - t0, rel(torch, r["dq_tensor"], dq),
                    rel(torch, r["dk_tensor"], dk), rel(torch, r["dv_tensor"], dv))
                timers["bsa"] = [bsa]
            except Exception as e:  # noqa: BLE001
                notes["bsa"] = "n/a: %s" % peers.first_line(e)
    # FlexAttention
    if "flex" in args.peers:
        try:
            from torch.nn.attention.flex_attention import flex_attention
            # The backward is timed again and again on one graph (retain_graph): compiled
            # backwards donate their buffers by default, which forbids that.
            import torch._functorch.config  # not imported by torch itself until compiled
            torch._functorch.config.donated_buffer = False
            fl = torch.compile(flex_attention)
            bm = peers.block_mask_from_lists(torch, lists, skv, q_blocks=True)
            qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
            o_flex = fl(qg, kg, vg, block_mask=bm, enable_gqa=hkv != Hq)

            def flex():
                return torch.autograd.grad(o_flex, (qg, kg, vg), do, retain_graph=True)
            t0 = time.time()
            r = flex()
            torch.cuda.synchronize()
            notes["flex"] = "first call %.1f s; dQ %.1e dK %.1e dV %.1e vs ours" % (
                time.time() - t0, rel(torch, r[0], dq), rel(torch, r[1], dk),
                rel(torch, r[2], dv))
            timers["flex"] = [flex]
        except Exception as e:  # noqa: BLE001
            notes["flex"] = "n/a: %s" % peers.first_line(e)
    info = {}
    times = peers.time_interleaved(torch, timers, 3, args.reps, args.rounds, 0.3, None, 0.0,
                                   info)
    host_val = peers.host_us_per_call(torch, [ours_val], 8)
    host_rec = peers.host_us_per_call(torch, [ours_rec], 8)
    ours_rec.check()
    row = {"shape": label, "hkv": hkv, "len_kv": skv, "flops": flops, "floor_ms": floor,
           "results": {}}
    for name, (ms, spread) in times.items():
        tf = flops / (ms * 1e9)
        row["results"][name] = {"ms": ms, "tflops": tf, "spread": spread,
                                "host_us": info.get(name, {}).get("host_us"),
                                "note": notes.get(name, "")}
        log("  %-6s %8.3f ms %7.1f useful TFLOP/s, %2.0f%% of the GEMM rate (spread %.1f%%, "
            "host %.0f us/call) %s" % (name, ms, tf, 100 * tf / args.gemm, 100 * spread,
                                       info.get(name, {}).get("host_us") or 0, notes.get(name, "")))
    log("  ours validated: host %.0f us per call (lists checked on the GPU, one sync); into a "
        "verdict: host %.0f us per call (no sync)" % (host_val, host_rec))
    row["results"]["ours"]["host_us_validated"] = host_val
    row["results"]["ours"]["host_us_validated_verdict"] = host_rec
    for name, n in notes.items():
        if name not in times:
            log("  %-6s %s" % (name, n))
            row["results"][name] = {"note": n}
    best = max((r["tflops"] for n, r in row["results"].items()
                if not n.startswith("ours") and "tflops" in r),
               default=None)
    if best:
        log("  ours / best peer: %.2f" % (row["results"]["ours"]["tflops"] / best))
    summary.append(row)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", required=True)
    ap.add_argument("--len-kv", default=",".join(str(x) for x in peers.SPARSE_LEN_KV))
    ap.add_argument("--heads-kv", default="1,16", help="1: the study's GQA; 16: MHA (cuDNN)")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help="comma list of %s, or none (ours only)" % ",".join(PEERS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--profile", action="store_true", help="our kernels' times (torch.profiler)")
    ap.add_argument("--recompute", action="store_true",
                    help="also time our backward with dq_pass=recompute (ours-rc)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    args.peers = set(peers.peer_names(ap, args.peers, PEERS))
    os.environ["SPARSEATTN_LIB"] = os.path.abspath(args.lib)
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import torch
    import sparseattn as sa
    summary = []
    args.gemm, copy = peers.measure_ceilings(torch, args)
    for hkv in (int(x) for x in args.heads_kv.split(",")):
        for skv in (int(x) for x in args.len_kv.split(",")):
            run_shape(torch, sa, args, hkv, skv, summary)
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "gemm_tflops": args.gemm,
                       "copy_bytes_per_s": copy, "rows": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
