#!/usr/bin/env python3
"""Causal attention: our causal stage against its peers, measured in one process on one GPU.

    python3 bench/causal.py --lib build-gpu/libsparseattn.so [--mode dense,sparse] [--json PATH]

Dense (shapes (8,16,4096,128), (4,16,8192,128), (2,16,16384,128), MHA): the registry's causal
sparse stage with every visible block listed (tile t lists blocks 0..t, the diagonal first)
against cuDNN SDPA causal (torch SDPA, cuDNN backend) and FA4 causal (flash_attn.cute); TFLOP/s
count half of the dense FLOPs, as the peers report causal rates.
Sparse (the study's shape: B 2, 16 query heads on 1 KV head, len_q 4096, len_kv 4K/8K/16K):
each Q tile lists up to 16 blocks it can see (bottom-right aligned), its diagonal block always
among them; our stage against FA4 block-sparse with causal=True (our non-diagonal blocks as full
blocks, the diagonal one as a mask block) and FlexAttention (a causal mask_mod on the same block
lists). Useful TFLOP/s count only visible (query, key) pairs of the listed blocks.
Timing, checks and JSON records as bench/peers.py (whose harness this imports): interleaved
rounds, each batch behind a device sleep (GPU time without host overhead), host time per call
printed beside it, every output compared with ours and with FP32 slices.
"""
import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers as P  # noqa: E402

TILE = P.TILE
TOPK = 16


def causal_stage(lib):
    """The first registered sparse stage whose check accepts causal (a probe of its check)."""
    for st in lib.stages():
        if not (P.stage_roles(st) or 0) & P.SA_ROLE_SPARSE:
            continue
        a = P.SaGpuAttn()
        lib.dll.sa_gpu_attn_default(a)
        a.shape = P.SaShape(1, 1, 1, 128, 128, 128)
        a.q = a.k = a.v = a.o = 1 << 20  # aligned non-NULL addresses: check() reads nothing
        a.lists = P.SaTileLists(1 << 20, None, 1, 1)
        a.causal = 1
        if st.check(a) == 0:
            return st
    return None


def visible_blocks(sq, skv, t):
    """Blocks [0, n) that tile t can see (its last valid row's last visible key)."""
    last = min(t * TILE + TILE - 1, sq - 1) + (skv - sq)
    return 0 if last < 0 else last // TILE + 1


def causal_lists(torch, B, LH, sq, skv, k, g):
    """(indices (B, LH, T, k) int32, counts (B, LH, T) int32) on the GPU: per row min(k, n)
    visible blocks, the diagonal n - 1 first, the rest drawn without repeats from [0, n - 1)."""
    T = (sq + TILE - 1) // TILE
    idx = torch.zeros(B, LH, T, k, dtype=torch.int32)
    cnt = torch.zeros(B, LH, T, dtype=torch.int32)
    for t in range(T):
        n = visible_blocks(sq, skv, t)
        m = min(k, n)
        cnt[:, :, t] = m
        if m == 0:
            continue
        for b in range(B):
            for h in range(LH):
                others = torch.randperm(n - 1, generator=g)[:m - 1].to(torch.int32)
                idx[b, h, t, 0] = n - 1
                idx[b, h, t, 1:m] = others
    return idx.cuda(), cnt.cuda()


def useful_flops(sq, skv, D, Hq, idx_cpu, cnt_cpu):
    """4 D Hq x the visible (query, key) pairs of the listed blocks (lists shared by the group)."""
    B, LH, T, _ = idx_cpu.shape
    per = Hq // LH
    pairs = 0
    off = skv - sq
    for t in range(T):
        rows = range(t * TILE, min(t * TILE + TILE, sq))
        for b in range(B):
            for h in range(LH):
                for j in range(int(cnt_cpu[b, h, t])):
                    blk = int(idx_cpu[b, h, t, j])
                    lo, hi = blk * TILE, min(blk * TILE + TILE, skv)
                    # keys of the block that row i sees: clamp(i + off - lo + 1, 0, hi - lo)
                    pairs += sum(max(0, min(i + off - lo + 1, hi - lo)) for i in rows)
    return 4.0 * D * pairs * per


def our_call(torch, lib, st, q, k, v, idx, cnt, verdict):
    B, Hq, Sq, D = q.shape
    o = torch.full_like(q, float("nan"))
    lse = torch.full((B, Hq, Sq), float("nan"), device="cuda", dtype=torch.float32)
    a = P.SaGpuAttn()
    lib.dll.sa_gpu_attn_default(a)
    a.shape = P.SaShape(B, Hq, k.shape[1], Sq, k.shape[2], D)
    a.q, a.k, a.v, a.o, a.lse = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), \
        lse.data_ptr()
    a.lists = P.SaTileLists(idx.data_ptr(), cnt.data_ptr(), idx.shape[1], idx.shape[3])
    a.validate, a.causal = 1, 1
    a.verdict = verdict
    a.stream = torch.cuda.current_stream().cuda_stream
    a._keep = (q, k, v, o, lse, idx, cnt)
    launch = st.launch

    def call():
        rc = launch(a)
        if rc:
            raise RuntimeError("stage %d: %s" % (st.id, lib.strerror(rc)))
        return o, lse
    return call


def fa4_causal_call(torch, fwd, qkv_bshd, block_sparse=None, pack_gqa=None):
    q, k, v = qkv_bshd
    B, S, H, _ = q.shape
    o = torch.full_like(q, float("nan"))
    lse = torch.full((B, H, S), float("nan"), device="cuda", dtype=torch.float32)
    kw = dict(causal=True, return_lse=True, out=o, lse=lse)
    if block_sparse is not None:
        kw["block_sparse_tensors"] = block_sparse
    if pack_gqa is not None:
        kw["pack_gqa"] = pack_gqa

    def call():
        fwd(q, k, v, **kw)
        return o.transpose(1, 2), lse
    return call


def fa4_causal_metadata(idx, cnt):
    """FA4 block-sparse tensors for causal lists: the diagonal block (slot 0) as a mask block
    (FA4 applies its causal mask there), the others as full blocks."""
    mask_cnt = (cnt > 0).to(cnt.dtype).contiguous()
    mask_idx = idx[..., :1].contiguous()
    full_cnt = (cnt - mask_cnt).contiguous()
    full_idx = idx.roll(-1, dims=-1).contiguous()  # slots 1.. first; the wrapped one is unused
    return mask_cnt, mask_idx, full_cnt, full_idx


def slices_of(q):
    B, H, S, _ = q.shape
    return [(0, 0, 0, min(64, S)), (B - 1, H - 1, max(0, S - 64), S), (0, H // 2, S // 2,
                                                                          S // 2 + 32)]


def causal_slice_reference(torch, q, k, v, b, h, q0, q1):
    """FP32 causal attention (bottom-right aligned) for queries [q0, q1) of (b, h)."""
    Hq, Hkv = q.shape[1], k.shape[1]
    hk = h // (Hq // Hkv)
    sq, skv = q.shape[2], k.shape[2]
    qs = q[b, h, q0:q1].float()
    ks, vs = k[b, hk].float(), v[b, hk].float()
    s = qs @ ks.T / (q.shape[3] ** 0.5)
    i = torch.arange(q0, q1, device="cuda")[:, None] + (skv - sq)
    j = torch.arange(skv, device="cuda")[None, :]
    s = s.masked_fill(j > i, float("-inf"))
    lse = torch.logsumexp(s, dim=1)
    p = torch.softmax(s, dim=1).nan_to_num(0.0)
    return p @ vs, lse


def check_dense(torch, o, lse, q, k, v):
    worst_o = worst_l = 0.0
    for b, h, q0, q1 in slices_of(q):
        ro, rl = causal_slice_reference(torch, q, k, v, b, h, q0, q1)
        worst_o = max(worst_o, P.rel_l2(torch, o[b, h, q0:q1].float(), ro))
        if lse is not None:
            fin = torch.isfinite(rl)
            worst_l = max(worst_l, float((lse[b, h, q0:q1][fin] - rl[fin]).abs().max()))
    return worst_o, worst_l


def timed(torch, args, named):
    info = {}
    res = P.time_interleaved(torch, named, args.warmup, args.reps, args.rounds,
                             warmup_s=args.warmup_s, info_out=info)
    return res, info


def run_dense(torch, F, lib, st, args, gemm, summary, verdict):
    fa4 = None
    try:
        fa4 = P.load_fa4()[0]
    except Exception as e:  # noqa: BLE001
        P.log("dense causal: FA4 n/a (%s)" % P.first_line(e))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for (B, H, S, D) in P.DENSE_SHAPES:
        q, k, v = P.make_inputs(torch, (B, H, S, D), H, S, args.seed, 1)[0]
        T = S // TILE
        idx = torch.zeros(B, H, T, T, dtype=torch.int32, device="cuda")
        for t in range(T):
            idx[:, :, t, 0] = t  # the diagonal first
            if t:
                idx[:, :, t, 1:t + 1] = torch.arange(t, dtype=torch.int32, device="cuda")
        cnt = (torch.arange(T, dtype=torch.int32, device="cuda") + 1).expand(B, H, T).contiguous()
        calls = {"ours": our_call(torch, lib, st, q, k, v, idx, cnt, verdict)}

        def cudnn_call():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True), None
        calls["cudnn"] = cudnn_call
        if fa4 is not None:
            calls["fa4"] = fa4_causal_call(torch, fa4, P.bshd((q, k, v)))
        flops = 4.0 * B * H * S * S * D / 2
        ok = {}
        for name, c in list(calls.items()):
            try:
                o, lse = c()
                torch.cuda.synchronize()
                eo, el = check_dense(torch, o, lse, q, k, v)
                ok[name] = (eo, el)
                if eo > 1e-2 or el > P.LSE_TOL:
                    P.log("dense causal %s: %s FAILS its check (O %.2e, LSE %.2e)"
                          % ((B, H, S, D), name, eo, el))
                    del calls[name]
            except Exception as e:  # noqa: BLE001
                P.log("dense causal %s: %s n/a (%s)" % ((B, H, S, D), name, P.first_line(e)))
                del calls[name]
        res, info = timed(torch, args, {n: [c] for n, c in calls.items()})
        row = {"shape": [B, H, S, D], "tflops": {}, "host_us": {}, "check": ok}
        for n, (ms, spread) in res.items():
            row["tflops"][n] = flops / (ms * 1e9)
            row["host_us"][n] = info[n]["host_us"]
            P.log("dense causal %-18s %-6s %.3f ms %6.1f TFLOP/s (half the dense FLOPs; spread "
                  "%.1f%%, host %.0f us/call) check O %.2e LSE %.2e"
                  % ((B, H, S, D), n, ms, flops / (ms * 1e9), 100 * spread, info[n]["host_us"],
                     ok[n][0], ok[n][1]))
        summary["dense"].append(row)
        del q, k, v, idx, cnt, calls
        torch.cuda.empty_cache()


def run_sparse(torch, F, lib, st, args, gemm, summary, verdict):
    fa4 = None
    try:
        fa4 = P.load_fa4()
    except Exception as e:  # noqa: BLE001
        P.log("sparse causal: FA4 n/a (%s)" % P.first_line(e))
    B, Hq, Hkv, Sq, D = 2, 16, 1, 4096, 128
    g = torch.Generator().manual_seed(args.seed)
    for skv in P.SPARSE_LEN_KV:
        q, k, v = P.make_inputs(torch, (B, Hq, Sq, D), Hkv, skv, args.seed + skv, 1)[0]
        idx, cnt = causal_lists(torch, B, Hkv, Sq, skv, TOPK, g)
        flops = useful_flops(Sq, skv, D, Hq, idx.cpu(), cnt.cpu())
        calls = {"ours": our_call(torch, lib, st, q, k, v, idx, cnt, verdict)}
        if fa4 is not None:
            fwd, BST = fa4
            m = fa4_causal_metadata(idx, cnt)
            bst = BST(mask_block_cnt=m[0], mask_block_idx=m[1], full_block_cnt=m[2],
                      full_block_idx=m[3], block_size=(TILE, TILE))
            qkv = P.bshd((q, k, v))
            for pk in (True, False):
                calls["fa4 bs pack_gqa %s" % ("on" if pk else "off")] = fa4_causal_call(
                    torch, fwd, qkv, block_sparse=bst, pack_gqa=pk)
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            nb = (skv + TILE - 1) // TILE
            T = Sq // TILE
            sel = torch.zeros(B, T, nb, dtype=torch.bool, device="cuda")
            for t in range(T):
                for j in range(int(cnt[0, 0, t])):
                    sel[:, t, idx[:, 0, t, j].long()] = True
            off = skv - Sq

            def mask_mod(b, h, qi, kj):
                return (kj <= qi + off) & sel[b, qi // TILE, kj // TILE]
            bm = create_block_mask(mask_mod, B, None, Sq, skv, device="cuda", BLOCK_SIZE=TILE)
            flex = torch.compile(flex_attention, dynamic=False)
            calls["flex"] = lambda: (flex(q, k, v, block_mask=bm, enable_gqa=True), None)
        except Exception as e:  # noqa: BLE001
            P.log("sparse causal: flex n/a (%s)" % P.first_line(e))
        ref_o = None
        ok = {}
        for name in list(calls):
            try:
                o, lse = calls[name]()
                torch.cuda.synchronize()
                o = o.clone()
                if ref_o is None:
                    ref_o = o
                    ok[name] = 0.0
                else:
                    ok[name] = P.rel_l2(torch, o.float(), ref_o.float())
                if not torch.isfinite(o).all() or ok[name] > 1e-2:
                    P.log("sparse causal %d: %s FAILS (rel L2 vs ours %.2e)"
                          % (skv, name, ok[name]))
                    del calls[name]
            except Exception as e:  # noqa: BLE001
                P.log("sparse causal %d: %s n/a (%s)" % (skv, name, P.first_line(e)))
                del calls[name]
        res, info = timed(torch, args, {n: [c] for n, c in calls.items()})
        row = {"len_kv": skv, "useful_gflop": flops / 1e9, "tflops": {}, "host_us": {},
               "err_vs_ours": ok}
        for n, (ms, spread) in res.items():
            row["tflops"][n] = flops / (ms * 1e9)
            row["host_us"][n] = info[n]["host_us"]
            P.log("sparse causal len_kv %5d %-18s %.3f ms useful %6.1f TFLOP/s (spread %.1f%%, "
                  "host %.0f us/call) O vs ours %.2e"
                  % (skv, n, ms, flops / (ms * 1e9), 100 * spread, info[n]["host_us"], ok[n]))
        summary["sparse"].append(row)
        del q, k, v, calls
        torch.cuda.empty_cache()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", required=True)
    ap.add_argument("--mode", default="dense,sparse")
    ap.add_argument("--reps", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--warmup-s", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    import json

    import torch
    import torch.nn.functional as F
    lib = P.Lib(args.lib)
    bad = lib.abi_mismatches()
    if bad:
        P.log("causal: ctypes mirrors differ from the library: " + "; ".join(bad))
        return 1
    st = causal_stage(lib)
    if st is None:
        P.log("causal: no registered stage accepts causal")
        return 1
    P.log("causal: our stage %d %s" % (st.id, st.name.decode()))
    verdict = lib.verdict_create()
    summary = {"dense": [], "sparse": []}
    gemm, _ = P.measure_ceilings(torch, args)
    try:
        if "sparse" in args.mode:
            run_sparse(torch, F, lib, st, args, gemm, summary, verdict)
        if "dense" in args.mode:
            run_dense(torch, F, lib, st, args, gemm, summary, verdict)
    except Exception:  # noqa: BLE001 - still report what was measured
        traceback.print_exc()
    rc = lib.verdict_read(verdict, None)
    P.log("causal: verdict over every call of ours: %d (%s)" % (rc, lib.strerror(rc)))
    lib.verdict_destroy(verdict)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "gemm_tflops": gemm,
                       "time": time.strftime("%Y-%m-%d %H:%M"), **summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
