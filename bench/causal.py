#!/usr/bin/env python3
"""Causal attention: our causal stage against its peers, measured in one process on one GPU.

    python3 bench/causal.py --lib build-gpu/libsparseattn.so [--mode dense,sparse] [--json PATH]
                            [--peers cudnn,fa4,flex|none]
    python3 bench/causal.py --self-test   # no GPU: the lists, the FA4 metadata and the Flex
                                          # mask against a plain masked softmax (torch on CPU)

Shapes from bench/shapes.h (as bench/peers.py reads them). Our stage, its arguments and the
verdict come from the sparseattn package (python/sparseattn), loaded on --lib.
Dense (shapes (8,16,4096,128), (4,16,8192,128), (2,16,16384,128), MHA): the registry's causal
sparse stage with every visible block listed (tile t lists blocks 0..t, the diagonal first)
against cuDNN SDPA causal (torch SDPA, cuDNN backend) and FA4 causal (flash_attn.cute); TFLOP/s
count half of the dense FLOPs, as the peers report causal rates.
Sparse (the study's shape: B 2, 16 query heads on 1 KV head, len_q 4096, len_kv 4K/8K/16K):
each Q tile lists up to 16 blocks it can see (bottom-right aligned), its diagonal block always
among them; our stage against FA4 block-sparse with causal=True (our non-diagonal blocks as full
blocks, the diagonal one as a mask block) and FlexAttention (a causal mask_mod on the same block
lists, each batch its own: flex_block_mask). Useful TFLOP/s count only visible (query, key)
pairs of the listed blocks.
Timing, checks and JSON records as bench/peers.py (whose harness this imports): interleaved
rounds, each batch behind a device sleep (GPU time without host overhead), host time per call
printed beside it, every output compared with ours and with FP32 slices.
"""
import argparse
import os
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers as P  # noqa: E402

TILE = P.TILE
TOPK = P.SPARSE_K
PEERS = ("cudnn", "fa4", "flex")  # --peers: cuDNN SDPA (dense), FA4 (both), FlexAttention (sparse)


def causal_stage(sa, stage_id=None):
    """The registry's default tile-list stage when its check accepts causal (a probe of its
    check), else the first sparse stage that does (stages 15 and 16 mask causally too, but the
    default is the fast one); sa: the sparseattn package (P.import_sparseattn)."""
    def accepts(st):
        a = sa._gpu.gpu_attn_default()
        a.shape = sa._capi.SaShape(1, 1, 1, 128, 128, 128)
        a.q = a.k = a.v = a.o = 1 << 20  # aligned non-NULL addresses: check() reads nothing
        a.lists = sa._capi.SaTileLists(1 << 20, None, 1, 1)
        a.causal = 1
        return st.check(a) == 0
    sparse = [st for st in sa.stages() if st.sparse and stage_id in (None, st.id)]
    for st in sorted(sparse, key=lambda st: not st.default_tile):
        if accepts(st):
            return st
    return None


def visible_blocks(sq, skv, t):
    """Blocks [0, n) that tile t can see (its last valid row's last visible key)."""
    last = min(t * TILE + TILE - 1, sq - 1) + (skv - sq)
    return 0 if last < 0 else last // TILE + 1


def causal_lists(torch, B, LH, sq, skv, k, g, device="cuda"):
    """(indices (B, LH, T, k) int32, counts (B, LH, T) int32) on `device`: per row min(k, n)
    visible blocks, the diagonal n - 1 first, the rest drawn without repeats from [0, n - 1)
    (each (batch, list head) its own draw)."""
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
    return idx.to(device), cnt.to(device)


def flex_block_table(torch, idx, cnt, nb):
    """(B, LH, T, nb) bool, True where row (b, lh, t) lists block j among its first cnt
    entries: each (batch, list head) its own row. (The first version indexed
    sel[:, t, idx[:, 0, t, j]], which marks every batch's block in every batch, so that each
    batch attended to the union of the batches' lists: issue #15.)"""
    B, LH, T, K = idx.shape
    slot = torch.arange(K, device=idx.device)
    where = torch.where(slot < cnt[..., None].long(), idx.long(), nb)  # past count: column nb
    sel = torch.zeros(B, LH, T, nb + 1, dtype=torch.bool, device=idx.device)
    sel.scatter_(-1, where, True)
    return sel[..., :nb].contiguous()


def flex_causal_mask_mod(sel, off, group):
    """FlexAttention mask_mod: query qi of head h sees key kj when kj <= qi + off (bottom-right
    aligned, off = len_kv - len_q) and its tile's list (list head h // group) holds kj's block."""
    def mask_mod(b, h, qi, kj):
        return (kj <= qi + off) & sel[b, h // group, qi // TILE, kj // TILE]
    return mask_mod


def flex_block_mask(torch, create_block_mask, idx, cnt, heads_q, sq, skv):
    """(BlockMask, mask_mod) for causal tile lists idx (B, LH, T, K), cnt (B, LH, T) on their
    device: the query heads of a group share their list head's row (H None when LH is 1)."""
    B, LH = idx.shape[0], idx.shape[1]
    nb = (skv + TILE - 1) // TILE
    mm = flex_causal_mask_mod(flex_block_table(torch, idx, cnt, nb), skv - sq, heads_q // LH)
    bm = create_block_mask(mm, B, None if LH == 1 else heads_q, sq, skv, device=idx.device,
                           BLOCK_SIZE=TILE)
    return bm, mm


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


def our_call(torch, sa, st, q, k, v, idx, cnt, verdict):
    """call() -> (O, LSE) of our stage st (a sparseattn Stage), causal, validated, recording
    into verdict (a sparseattn.Verdict); SparseAttnError for a bad status."""
    B, Hq, Sq, D = q.shape
    o = torch.full_like(q, float("nan"))
    lse = torch.full((B, Hq, Sq), float("nan"), device="cuda", dtype=torch.float32)
    a = sa._gpu.gpu_attn_default()
    a.shape = sa._capi.SaShape(B, Hq, k.shape[1], Sq, k.shape[2], D)
    a.q, a.k, a.v, a.o, a.lse = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), \
        lse.data_ptr()
    a.lists = sa._capi.SaTileLists(idx.data_ptr(), cnt.data_ptr(), idx.shape[1], idx.shape[3])
    a.validate, a.causal = 1, 1
    a.verdict = verdict.handle
    a.stream = torch.cuda.current_stream().cuda_stream
    a._keep = (q, k, v, o, lse, idx, cnt, verdict)
    launch = st.launcher(a)

    def call():
        launch()
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
                             warmup_s=args.warmup_s, settle_s=args.settle_s, info_out=info)
    return res, info


def clock_note(inf):
    """', 1712 MHz, 690 W' where --clocks sampled the contender, else ''."""
    text = P.clock_text(inf)
    return ", " + text if text else ""


def clock_fields(row, n, inf):
    """The contender's mean clock and power in the JSON row (--clocks), beside its rate."""
    if inf.get("clock_samples"):
        row.setdefault("sm_mhz", {})[n] = inf["sm_mhz"]
        row.setdefault("power_w", {})[n] = inf["power_w"]


def run_dense(torch, F, sa, st, args, gemm, summary, verdict):
    fa4 = None
    try:
        if "fa4" in args.peers:
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
        calls = {"ours": our_call(torch, sa, st, q, k, v, idx, cnt, verdict)}

        def cudnn_call():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True), None
        if "cudnn" in args.peers:
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
                if not (eo <= P.REL_L2_TOL and el <= P.LSE_TOL):  # NaN fails too
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
            clock_fields(row, n, info[n])
            P.log("dense causal %-18s %-6s %.3f ms %6.1f TFLOP/s (half the dense FLOPs; spread "
                  "%.1f%%, host %.0f us/call%s) check O %.2e LSE %.2e"
                  % ((B, H, S, D), n, ms, flops / (ms * 1e9), 100 * spread, info[n]["host_us"],
                     clock_note(info[n]), ok[n][0], ok[n][1]))
        summary["dense"].append(row)
        del q, k, v, idx, cnt, calls
        torch.cuda.empty_cache()


def run_sparse(torch, F, sa, st, args, gemm, summary, verdict):
    fa4 = None
    try:
        if "fa4" in args.peers:
            fa4 = P.load_fa4()
    except Exception as e:  # noqa: BLE001
        P.log("sparse causal: FA4 n/a (%s)" % P.first_line(e))
    B, Hq, Hkv, Sq, D = P.SPARSE_B, P.SPARSE_HQ, P.SPARSE_HKV, P.SPARSE_SQ, P.SPARSE_D
    g = torch.Generator().manual_seed(args.seed)
    for skv in P.SPARSE_LEN_KV:
        q, k, v = P.make_inputs(torch, (B, Hq, Sq, D), Hkv, skv, args.seed + skv, 1)[0]
        idx, cnt = causal_lists(torch, B, Hkv, Sq, skv, TOPK, g)
        flops = useful_flops(Sq, skv, D, Hq, idx.cpu(), cnt.cpu())
        calls = {"ours": our_call(torch, sa, st, q, k, v, idx, cnt, verdict)}
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
            if "flex" not in args.peers:
                raise RuntimeError("not asked for (--peers)")
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            bm, _ = flex_block_mask(torch, create_block_mask, idx, cnt, Hq, Sq, skv)
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
                if not torch.isfinite(o).all() or ok[name] > P.REL_L2_TOL:
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
            clock_fields(row, n, info[n])
            P.log("sparse causal len_kv %5d %-18s %.3f ms useful %6.1f TFLOP/s (spread %.1f%%, "
                  "host %.0f us/call%s) O vs ours %.2e"
                  % (skv, n, ms, flops / (ms * 1e9), 100 * spread, info[n]["host_us"],
                     clock_note(info[n]), ok[n]))
        summary["sparse"].append(row)
        del q, k, v, calls
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- self-test (no GPU)
def reference_mask(torch, idx, cnt, heads_q, sq, skv):
    """(B, heads_q, sq, skv) bool, written out plainly: query i of head h sees key j when
    j <= i + (skv - sq) and the list of i's tile (list head h // (heads_q / LH)) holds j's
    block among its first cnt entries."""
    B, LH, T, _ = idx.shape
    g = heads_q // LH
    m = torch.zeros(B, heads_q, sq, skv, dtype=torch.bool)
    for b in range(B):
        for h in range(heads_q):
            for t in range(T):
                for blk in idx[b, h // g, t, :int(cnt[b, h // g, t])].tolist():
                    m[b, h, t * TILE:min(sq, t * TILE + TILE), blk * TILE:min(skv, blk * TILE
                                                                             + TILE)] = True
    i = torch.arange(sq)[:, None]
    j = torch.arange(skv)[None, :]
    return m & (j <= i + (skv - sq))


def self_test():
    """What runs without a GPU: the visible-block count, the bench shapes, and with torch (on
    the CPU) the causal lists, the FA4 metadata, useful_flops and the FlexAttention mask against
    reference_mask on small cases (the mask_mod on every (query, key), the BlockMask's blocks,
    and flex_attention's output against a masked softmax). [ok, ...]."""
    results = []

    def check(name, cond):
        results.append(bool(cond))
        P.log("self-test %-62s %s" % (name, "ok" if cond else "FAIL"))

    check("visible_blocks: bottom-right aligned, partial tiles",
          [visible_blocks(512, 512, t) for t in range(4)] == [1, 2, 3, 4]
          and [visible_blocks(256, 1024, t) for t in range(2)] == [7, 8]
          and visible_blocks(300, 300, 2) == 3 and visible_blocks(512, 256, 0) == 0)
    check("shapes from bench/shapes.h: 16 of 128 blocks, len_kv >= len_q",
          TOPK == P.SPARSE_K and min(P.SPARSE_LEN_KV) >= P.SPARSE_SQ)
    try:
        import torch
    except ImportError as e:
        P.log("self-test: torch is not importable (%s): the list and Flex mask checks skipped"
              % e)
        return results
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:
        create_block_mask = flex_attention = None
        P.log("self-test: torch %s has no FlexAttention (%s): its checks skipped"
              % (torch.__version__, e))
    g = torch.Generator().manual_seed(15)
    # (B, Hq, Hkv = LH, len_q, len_kv, K): GQA with one list head (the bench's form), a list
    # head per KV head, and partial tiles and blocks.
    for B, Hq, LH, sq, skv, K in ((2, 4, 1, 512, 1024, 3), (2, 4, 2, 384, 384, 2),
                                  (2, 2, 1, 320, 448, 2)):
        case = "B%d Hq%d LH%d %dx%d K%d" % (B, Hq, LH, sq, skv, K)
        idx, cnt = causal_lists(torch, B, LH, sq, skv, K, g, device="cpu")
        T = idx.shape[2]
        ok = True
        for b in range(B):
            for h in range(LH):
                for t in range(T):
                    n, c = visible_blocks(sq, skv, t), int(cnt[b, h, t])
                    row = idx[b, h, t, :c].tolist()
                    ok = ok and c == min(K, n) and row[0] == n - 1 and len(set(row)) == c \
                        and all(0 <= x < n for x in row)
        check("causal_lists %s: diagonal first, distinct visible blocks" % case, ok)
        ref = reference_mask(torch, idx, cnt, Hq, sq, skv)
        check("useful_flops %s: 4 D x the reference's pairs" % case,
              useful_flops(sq, skv, 64, Hq, idx, cnt) == 4.0 * 64 * int(ref.sum()))
        mc, mi, fc, fi = fa4_causal_metadata(idx, cnt)
        ok = True
        for b in range(B):
            for h in range(LH):
                for t in range(T):
                    got = mi[b, h, t, :int(mc[b, h, t])].tolist() + \
                        fi[b, h, t, :int(fc[b, h, t])].tolist()
                    ok = ok and got[:1] == [visible_blocks(sq, skv, t) - 1] and \
                        sorted(got) == sorted(idx[b, h, t, :int(cnt[b, h, t])].tolist())
        check("fa4_causal_metadata %s: diagonal masked, rest full" % case, ok)
        if create_block_mask is None:
            continue
        bm, mm = flex_block_mask(torch, create_block_mask, idx, cnt, Hq, sq, skv)
        bb = torch.arange(B)[:, None, None, None]
        hh = torch.arange(Hq)[None, :, None, None]
        qi = torch.arange(sq)[None, None, :, None]
        kj = torch.arange(skv)[None, None, None, :]
        got = mm(bb, hh, qi, kj)
        check("flex mask_mod %s == reference mask" % case, bool((got == ref).all()))
        # The compiled kernel visits only the BlockMask's blocks and skips mask_mod on its full
        # ones: every block with a visible pair must be there, and a full block must be
        # visible throughout (its pairs inside the lengths).
        nb = (skv + TILE - 1) // TILE
        pad = torch.zeros(B, Hq, T * TILE, nb * TILE, dtype=torch.bool)
        pad[:, :, :sq, :skv] = ref
        inside = torch.zeros_like(pad)
        inside[:, :, :sq, :skv] = True
        pad = pad.reshape(B, Hq, T, TILE, nb, TILE)
        inside = inside.reshape(B, Hq, T, TILE, nb, TILE)
        need = pad.any(5).any(3)
        whole = (pad | ~inside).all(5).all(3)

        def blocks(num, ind):
            if num is None:
                return torch.zeros(B, Hq, T, nb, dtype=torch.bool)
            out = flex_block_table(torch, ind, num, nb)
            return out.expand(B, Hq, *out.shape[2:])[:, :, :T]
        part = blocks(bm.kv_num_blocks, bm.kv_indices)
        full = blocks(bm.full_kv_num_blocks, bm.full_kv_indices)
        check("flex BlockMask %s: listed visible blocks, full ones whole" % case,
              bool(((part | full) | ~need).all()) and bool((~full | whole).all()))
        q = torch.randn(B, Hq, sq, 64, generator=g)
        k = torch.randn(B, LH, skv, 64, generator=g)  # a list head per KV head
        v = torch.randn(k.shape, generator=g)
        with warnings.catch_warnings():  # eager flex_attention: "without torch.compile()"
            warnings.simplefilter("ignore")
            o = flex_attention(q, k, v, block_mask=bm, enable_gqa=True)
        kr = k.repeat_interleave(Hq // k.shape[1], 1)
        vr = v.repeat_interleave(Hq // k.shape[1], 1)
        sc = (q @ kr.transpose(-1, -2) / 8.0).masked_fill(~ref, float("-inf"))
        ro = torch.softmax(sc, -1) @ vr
        e = float((o - ro).norm() / ro.norm())
        check("flex_attention %s vs masked softmax: rel L2 %.1e" % (case, e), e < 1e-5)
        if B > 1:
            # The first version's table: every batch's blocks marked in every batch.
            union = flex_block_table(torch, idx, cnt, nb).any(0, keepdim=True).expand(
                B, -1, -1, -1)
            umm = flex_causal_mask_mod(union, skv - sq, Hq // LH)
            bad = umm(bb, hh, qi, kj)
            ubm = create_block_mask(umm, B, None if LH == 1 else Hq, sq, skv, device="cpu",
                                    BLOCK_SIZE=TILE)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                eu = float((flex_attention(q, k, v, block_mask=ubm, enable_gqa=True) - ro).norm()
                           / ro.norm())
            check("issue #15's batch-union table is caught (%d extra pairs, rel L2 %.2f)"
                  % (int((bad & ~ref).sum()), eu), bool((bad != ref).any()) and eu > 1e-2)
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", help="path to libsparseattn.so (a CUDA build); required")
    ap.add_argument("--mode", default="dense,sparse",
                    help="dense, sparse or dense,sparse (default)")
    ap.add_argument("--reps", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--warmup-s", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle-s", type=float, default=0.0,
                    help="seconds of untimed calls of a contender before its timed calls in each "
                         "round (as bench/peers.py: timed at the clock it holds on its own)")
    ap.add_argument("--clocks", action="store_true",
                    help="sample the SM clock and power (nvidia-smi) and print each "
                         "contender's mean (as bench/peers.py --clocks)")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--stage", type=int, metavar="ID",
                    help="our stage (a sparse stage that masks causally; default: the registry's "
                         "default tile stage)")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help="the peers to run beside ours, comma-separated from %s, or none "
                         "(default: all)" % ",".join(PEERS))
    ap.add_argument("--self-test", action="store_true",
                    help="check the causal lists, the FA4 metadata and the Flex mask against a "
                         "plain masked softmax on small cases (torch on the CPU; no GPU or "
                         "library) and exit")
    args = ap.parse_args(argv)
    modes = args.mode.split(",")
    if not modes or any(m not in ("dense", "sparse") for m in modes):
        ap.error("--mode: %r is not dense, sparse or dense,sparse" % args.mode)
    args.peers = P.peer_names(ap, args.peers, PEERS)
    if args.self_test:
        res = self_test()
        P.log("self-test: %d passed, %d failed" % (sum(res), len(res) - sum(res)))
        return 0 if all(res) else 1
    if not args.lib:
        ap.error("--lib is required")
    import json

    import torch
    import torch.nn.functional as F
    try:
        sa = P.import_sparseattn(args.lib)
    except ImportError as e:  # no library, ABI mismatch with the package's mirror, no numpy
        P.log("causal: cannot use %s through the sparseattn package: %s"
              % (args.lib, " ".join(str(e).split())))
        return 1
    st = causal_stage(sa, args.stage)
    if st is None:
        what = ("no registered stage" if args.stage is None
                else "stage %d is not a sparse stage that" % args.stage)
        P.log("causal: %s accepts causal" % what)
        return 1
    P.log("causal: our stage %d %s" % (st.id, st.name))
    verdict = sa.Verdict()
    summary = {"dense": [], "sparse": []}
    gemm, _ = P.measure_ceilings(torch, args)
    try:
        with P.clock_sampling(args.clocks):
            if "sparse" in args.mode:
                run_sparse(torch, F, sa, st, args, gemm, summary, verdict)
            if "dense" in args.mode:
                run_dense(torch, F, sa, st, args, gemm, summary, verdict)
    except Exception:  # noqa: BLE001 - still report what was measured
        traceback.print_exc()
    rc = verdict.read()
    P.log("causal: verdict over every call of ours: %d (%s)" % (rc, sa.strerror(rc)))
    verdict.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "gemm_tflops": gemm,
                       "time": time.strftime("%Y-%m-%d %H:%M"), **summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
