#!/usr/bin/env python3
"""Our GPU stages against their peers, measured in one process on one GPU.

    python3 bench/peers.py --lib build-gpu/libsparseattn.so [--mode dense|sparse|all]

Loads libsparseattn through ctypes (the stage registry: sa_stage_count / sa_stage_at), allocates
BF16 BHSD inputs with PyTorch and measures, in this order:
  ceilings  bf16 GEMM rate (8192^3 torch.matmul, random data) and device-to-device copy bandwidth
            (bytes read + written);
  dense     the three dense shapes (B, H, S, D) = (8,16,4096,128) (4,16,8192,128)
            (2,16,16384,128): every dense stage against SDPA with the cuDNN backend, SDPA with
            the FlashAttention backend and FlexAttention (torch.compile, no mask); our O must
            match cuDNN's (relative L2 <= 1e-2) and our O and LSE an FP32 reference on slices;
  sparse    batch 2, 16 query heads on 1 KV head, D 128, len_q 4096, len_kv 4K/8K/16K, 16 blocks
            of 128 per Q tile shared by the GQA group, lists from sa_random_tile_lists
            (independent and paired): every sparse stage against FlexAttention with the same
            blocks as a BlockMask of full blocks, in useful TFLOP/s, and against the dense
            stage at the same len_kv.
Timing: CUDA events around each call, warm-up, median; input sets rotated so that at least twice
the L2 passes between two uses of one set. The contenders of one shape are timed in interleaved
rounds (--rounds), so a drift of the card's clock during the run falls on all of them alike;
for the dense stages the ratio to cuDNN is also given per round (paired: both timed within the
same round), with its median and range. The sparse part runs first (so --budget-s keeps it);
a short summary table is printed last.
"""
import argparse
import ctypes
import math
import statistics
import sys
import time
import traceback

TILE = 128
REL_L2_TOL = 1e-2  # the project's BF16 output tolerance
LSE_TOL = 1e-2  # absolute, natural-log units
DENSE_SHAPES = [(8, 16, 4096, 128), (4, 16, 8192, 128), (2, 16, 16384, 128)]
SPARSE_B, SPARSE_HQ, SPARSE_HKV, SPARSE_SQ, SPARSE_D, SPARSE_K = 2, 16, 1, 4096, 128, 16
SPARSE_LEN_KV = [4096, 8192, 16384]
PATTERNS = [(0, "independent"), (1, "paired")]  # SA_LISTS_INDEPENDENT, SA_LISTS_PAIRED
GEMM_N = 8192
COPY_BYTES = 1 << 30
MAX_SETS = 8


# ---------------------------------------------------------------- ctypes mirror of sparseattn.h
class SaShape(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int), ("heads_q", ctypes.c_int), ("heads_kv", ctypes.c_int),
                ("len_q", ctypes.c_int), ("len_kv", ctypes.c_int), ("head_dim", ctypes.c_int)]


class SaTileLists(ctypes.Structure):
    _fields_ = [("indices", ctypes.c_void_p), ("counts", ctypes.c_void_p),
                ("list_heads", ctypes.c_int), ("max_blocks", ctypes.c_int)]


class SaGpuAttn(ctypes.Structure):
    _fields_ = [("shape", SaShape), ("q", ctypes.c_void_p), ("k", ctypes.c_void_p),
                ("v", ctypes.c_void_p), ("lists", SaTileLists), ("o", ctypes.c_void_p),
                ("lse", ctypes.c_void_p), ("validate", ctypes.c_int),
                ("allow_empty_rows", ctypes.c_int), ("stream", ctypes.c_void_p)]


STAGE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(SaGpuAttn))


# SA_ROLE_* of sparseattn.h: stages are picked by role, never by id.
SA_ROLE_SPARSE, SA_ROLE_DEFAULT_DENSE, SA_ROLE_DEFAULT_TILE, SA_ROLE_GPU_VERDICT = 1, 2, 4, 8


class SaStage(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("name", ctypes.c_char_p), ("summary", ctypes.c_char_p),
                ("roles", ctypes.c_uint), ("check", STAGE_FN), ("launch", STAGE_FN)]

    @property
    def sparse(self):
        """True for a stage that consumes tile lists (SA_ROLE_SPARSE)."""
        return bool(self.roles & SA_ROLE_SPARSE)


class Lib:
    """The parts of libsparseattn the benchmark uses."""

    def __init__(self, path):
        self.dll = ctypes.CDLL(path)
        d = self.dll
        d.sa_strerror.restype = ctypes.c_char_p
        d.sa_strerror.argtypes = [ctypes.c_int]
        d.sa_gpu_available.restype = ctypes.c_int
        d.sa_stage_count.restype = ctypes.c_int
        d.sa_stage_at.restype = ctypes.POINTER(SaStage)
        d.sa_stage_at.argtypes = [ctypes.c_int]
        d.sa_gpu_attn_default.argtypes = [ctypes.POINTER(SaGpuAttn)]
        d.sa_random_tile_lists.restype = ctypes.c_int
        d.sa_random_tile_lists.argtypes = [ctypes.POINTER(SaShape), ctypes.c_int, ctypes.c_int,
                                           ctypes.c_int, ctypes.c_uint64,
                                           ctypes.POINTER(ctypes.c_int32)]

    def strerror(self, rc):
        return self.dll.sa_strerror(rc).decode()

    def stages(self):
        out = []
        for i in range(self.dll.sa_stage_count()):
            p = self.dll.sa_stage_at(i)
            if p:
                out.append(p.contents)
        return out

    def random_tile_lists(self, shape, list_heads, k, pattern, seed):
        tiles = (shape.len_q + TILE - 1) // TILE
        n = shape.batch * list_heads * tiles * k
        buf = (ctypes.c_int32 * n)()
        rc = self.dll.sa_random_tile_lists(ctypes.byref(shape), list_heads, k, pattern, seed, buf)
        if rc:
            raise RuntimeError("sa_random_tile_lists: " + self.strerror(rc))
        return buf, (shape.batch, list_heads, tiles, k)


def log(msg):
    print(msg, flush=True)


T_START = time.time()


def over_budget(args, what):
    """True (and says so) once --budget-s seconds have passed: the rest is skipped, so the
    summary still prints inside a time-limited lease."""
    if args.budget_s and time.time() - T_START > args.budget_s:
        log("budget of %.0f s spent: skipping %s" % (args.budget_s, what))
        return True
    return False


def fmt(x, spec=".1f"):
    return "n/a" if x is None else format(x, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


# ---------------------------------------------------------------- timing and checks (need torch)
def time_calls(torch, calls, warmup, reps):
    """Median ms of calls[i % len(calls)]() over reps, each between its own CUDA events."""
    return statistics.median(time_samples(torch, calls, max(warmup, len(calls)), reps))


def time_interleaved(torch, named_calls, warmup, reps, rounds, warmup_s=0.0, round_out=None,
                     settle_s=0.0):
    """{name: (median ms, spread)} for each name's calls, timed in `rounds` interleaved rounds.

    Round r times every name in turn (the order rotated by r), reps / rounds calls each after a
    short warm-up, so slow drifts of the card (clock and temperature) fall on every name alike
    instead of on whichever ran last. The median is over all of a name's calls; the spread is
    (max - min) / median of its per-round medians, the run's own noise figure. A dict passed as
    round_out receives each name's list of per-round medians (for paired ratios).

    settle_s > 0 runs each name's calls untimed for that many seconds before its timed calls in
    every round. On a card at its power limit the clock then settles to the one this kernel
    sustains on its own, as in a long run of it; with 0 (short bursts in turn) every name is
    timed at a clock that the mix of all of them sets."""
    names = list(named_calls)
    # The card idles at a low clock between shapes; run the contenders in turn for warmup_s
    # seconds first so that the first round is not timed while the clock ramps up.
    t_end = time.time() + warmup_s
    while names and time.time() < t_end:
        for n in names:
            for f in named_calls[n]:
                f()
        torch.cuda.synchronize()
    per_round = max(1, -(-reps // max(1, rounds)))
    samples = {n: [] for n in names}
    round_medians = {n: [] for n in names}
    for r in range(max(1, rounds)):
        order = names[r % len(names):] + names[:r % len(names)] if names else []
        for n in order:
            calls = named_calls[n]
            t_end = time.time() + settle_s
            i = 0
            while time.time() < t_end:
                calls[i % len(calls)]()
                i += 1
                if i % 8 == 0:
                    torch.cuda.synchronize()  # keep the queue short, so the timing follows
            ms = time_samples(torch, calls, warmup if r == 0 else min(2, warmup), per_round)
            samples[n] += ms
            round_medians[n].append(statistics.median(ms))
    if round_out is not None:
        round_out.update(round_medians)
    out = {}
    for n in names:
        med = statistics.median(samples[n])
        rm = round_medians[n]
        out[n] = (med, (max(rm) - min(rm)) / med if med > 0 else 0.0)
    return out


def time_samples(torch, calls, warmup, reps):
    """Per-call ms of calls[i % len(calls)]() over reps, each between its own CUDA events."""
    for i in range(max(warmup, 1)):
        calls[i % len(calls)]()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for r in range(reps):
        ev[r][0].record()
        calls[r % len(calls)]()
        ev[r][1].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in ev]


def sets_needed(torch, set_bytes):
    l2 = torch.cuda.get_device_properties(0).L2_cache_size or (60 << 20)
    return max(2, min(MAX_SETS, 1 + -(-2 * l2 // set_bytes)))


def rel_l2(torch, x, ref):
    x = x.float()
    ref = ref.float()
    return ((x - ref).norm() / ref.norm()).item()


def slice_reference(torch, q, k, v, b, h, q0, q1, keys=None):
    """FP32 O and LSE of queries q0..q1 of (b, h); keys: optional index tensor of the keys used."""
    g = q.shape[1] // k.shape[1]
    qs = q[b, h, q0:q1].float()
    ks = k[b, h // g].float()
    vs = v[b, h // g].float()
    if keys is not None:
        ks = ks[keys]
        vs = vs[keys]
    s = qs @ ks.T * (1.0 / math.sqrt(q.shape[-1]))
    return torch.softmax(s, -1) @ vs, torch.logsumexp(s, -1)


def nonfinite(torch, o, lse):
    """Outputs left NaN/inf (the buffers were poisoned with NaN before the launch)."""
    n = int((~torch.isfinite(o)).sum().item())
    return n + (int(torch.isnan(lse).sum().item()) if lse is not None else 0)


def check_slices(torch, o, lse, q, k, v, slices):
    """Worst rel L2 of O and worst |LSE error| over (b, h, q0, q1, keys) slices."""
    worst_o, worst_l = 0.0, 0.0
    for b, h, q0, q1, keys in slices:
        ro, rl = slice_reference(torch, q, k, v, b, h, q0, q1, keys)
        worst_o = max(worst_o, rel_l2(torch, o[b, h, q0:q1], ro))
        if lse is not None:
            worst_l = max(worst_l, (lse[b, h, q0:q1] - rl).abs().max().item())
    return worst_o, worst_l


class OurStage:
    """One registered stage bound to torch tensors through sa_gpu_attn."""

    def __init__(self, torch, lib, stage):
        self.torch, self.lib, self.st = torch, lib, stage
        self.id, self.name = stage.id, stage.name.decode()
        self.label = "stage %d %s" % (self.id, self.name)

    def attn(self, q, k, v, o, lse, lists=None, validate=1):
        a = SaGpuAttn()
        self.lib.dll.sa_gpu_attn_default(ctypes.byref(a))
        B, Hq, Sq, D = q.shape
        a.shape = SaShape(B, Hq, k.shape[1], Sq, k.shape[2], D)
        a.q, a.k, a.v, a.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
        a.lse = lse.data_ptr() if lse is not None else None
        if lists is not None:
            a.lists = SaTileLists(lists.data_ptr(), None, lists.shape[1], lists.shape[3])
        a.validate = validate
        a.stream = self.torch.cuda.current_stream().cuda_stream
        # The struct holds raw pointers: it keeps its tensors alive for as long as it lives (and a
        # call made by call() keeps the struct), so callers need no lists of buffers to hold.
        a._tensors = (q, k, v, o, lse, lists)
        return a

    def check(self, a):
        rc = self.st.check(ctypes.byref(a)) if self.st.check else 0
        return None if rc == 0 else self.lib.strerror(rc)

    def call(self, a):
        ref = ctypes.byref(a)
        launch = self.st.launch

        def run():
            rc = launch(ref)
            if rc:
                raise RuntimeError("%s launch: %s" % (self.label, self.lib.strerror(rc)))
        return run


# ---------------------------------------------------------------- ceilings
def gemm_tflops(torch, g):
    a = torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=torch.bfloat16, generator=g)
    c = torch.empty(GEMM_N, GEMM_N, device="cuda", dtype=torch.bfloat16)
    ms = time_calls(torch, [lambda: torch.matmul(a, b, out=c)], 3, 10)
    return 2.0 * GEMM_N ** 3 / (ms * 1e9)


def copy_bytes_per_s(torch, g):
    src = torch.randn(COPY_BYTES // 2, device="cuda", dtype=torch.bfloat16, generator=g)
    dst = torch.empty_like(src)
    ms = time_calls(torch, [lambda: dst.copy_(src)], 3, 10)
    return 2.0 * COPY_BYTES / (ms * 1e-3)  # bytes read + bytes written


def measure_ceilings(torch, args):
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    gemm = gemm_tflops(torch, g)
    copy = copy_bytes_per_s(torch, g)
    torch.cuda.empty_cache()
    log("ceilings: bf16 GEMM %d^3 torch.matmul %.1f TFLOP/s; D2D copy (read+written) %.2f TB/s"
        % (GEMM_N, gemm, copy / 1e12))
    return gemm, copy


def floor_ms(flops, nbytes, gemm_tflops, copy_bps):
    return max(flops / (gemm_tflops * 1e9), nbytes / copy_bps * 1e3)


# ---------------------------------------------------------------- dense
def make_inputs(torch, shape_bhsd_q, hkv, skv, seed, nsets):
    B, H, S, D = shape_bhsd_q
    g = torch.Generator(device="cuda").manual_seed(seed)
    sets = []
    for _ in range(nsets):
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, hkv, skv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, hkv, skv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        sets.append((q, k, v))
    return sets


def dense_peers(torch, F, args):
    """name -> function(q, k, v) -> O, for the peers asked for; absent ones say why."""
    peers, why = {}, {}
    want = set(args.peers.split(","))
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # noqa: BLE001 - report any import problem as n/a
        SDPBackend = sdpa_kernel = None
        why["cudnn"] = why["flash"] = "torch.nn.attention: %s" % e
    if sdpa_kernel is not None:
        for key, backend in (("cudnn", "CUDNN_ATTENTION"), ("flash", "FLASH_ATTENTION")):
            if key in want:
                be = getattr(SDPBackend, backend)

                def fn(q, k, v, be=be):
                    with sdpa_kernel(be):
                        return F.scaled_dot_product_attention(q, k, v)
                peers[key] = fn
    if "flex" in want and "dense" in args.flex_modes.split(","):
        try:
            from torch.nn.attention.flex_attention import flex_attention
            flex = torch.compile(flex_attention, dynamic=False)
            peers["flex"] = lambda q, k, v: flex(q, k, v)
        except Exception as e:  # noqa: BLE001
            why["flex"] = "flex_attention: %s" % e
    for key in ("cudnn", "flash", "flex"):
        if key not in peers:
            why.setdefault(key, "not asked for (--peers / --flex-modes)")
    return peers, why


def run_dense(torch, F, lib, args, gemm, copy, summary):
    stages = [OurStage(torch, lib, s) for s in lib.stages() if not s.sparse] if lib else []
    if not stages:
        log("dense: no dense stage in the registry (or library not loaded): ours n/a")
    peers, peer_why = dense_peers(torch, F, args)
    for key, w in peer_why.items():
        log("dense: peer %s n/a: %s" % (key, w))
    for (B, H, S, D) in DENSE_SHAPES:
        if over_budget(args, "dense shape (%d,%d,%d,%d)" % (B, H, S, D)):
            continue
        flops = 4.0 * B * H * S * S * D
        set_bytes = 4 * B * H * S * D * 2
        nsets = sets_needed(torch, set_bytes)
        log("dense B=%d H=%d S=%d D=%d: %d input sets, %.2f TFLOP per call" % (B, H, S, D, nsets,
                                                                              flops / 1e12))
        sets = make_inputs(torch, (B, H, S, D), H, S, args.seed + S, nsets)
        nbytes = set_bytes + B * H * S * 4
        row = {"shape": "%d,%d,%d,%d" % (B, H, S, D), "floor_tf": flops / (
            floor_ms(flops, nbytes, gemm, copy) * 1e9), "ours": {}, "peer": {}, "check": {}}
        q0, k0, v0 = sets[0]
        ref_o = {}
        timers = {}  # name -> calls; timed together below, interleaved
        for key, fn in peers.items():
            try:
                ref_o[key] = fn(q0, k0, v0)
                torch.cuda.synchronize()
                timers[("peer", key)] = [lambda s=s, fn=fn: fn(*s) for s in sets]
            except Exception as e:  # noqa: BLE001
                row["peer"][key] = None
                log("  %-28s n/a: %s" % (key, str(e).splitlines()[0][:200]))
        slices = [(0, 0, 0, 256, None), (B - 1, H - 1, S - 256, S, None)]
        for st in stages:
            outs = [(torch.empty_like(q), torch.empty(B, H, S, device="cuda",
                                                      dtype=torch.float32)) for q, _, _ in sets]
            attns = [st.attn(q, k, v, o, l) for (q, k, v), (o, l) in zip(sets, outs)]
            why = st.check(attns[0])
            if why:
                row["ours"][st.label] = None
                log("  %-28s skipped: %s" % (st.label, why))
                continue
            try:
                o, l = outs[0]
                o.fill_(float("nan"))
                l.fill_(float("nan"))
                st.call(attns[0])()
                torch.cuda.synchronize()
                bad = nonfinite(torch, o, l)
                notes = ["%d outputs NaN/inf%s" % (bad, " FAIL" if bad else "")]
                if "cudnn" in ref_o:
                    e = rel_l2(torch, o, ref_o["cudnn"])
                    notes.append("O vs cuDNN rel L2 %.2e %s" % (e, "ok" if e <= REL_L2_TOL
                                                                else "FAIL"))
                eo, el = check_slices(torch, o, l, q0, k0, v0, slices)
                notes.append("slices vs FP32: O %.2e, LSE %.2e %s" % (
                    eo, el, "ok" if eo <= REL_L2_TOL and el <= LSE_TOL else "FAIL"))
                row["check"][st.label] = "; ".join(notes)
                timers[("ours", st.label)] = [st.call(a) for a in attns]
            except Exception as e:  # noqa: BLE001
                row["ours"][st.label] = None
                log("  %-28s failed: %s" % (st.label, e))
        rounds = {}
        try:
            times = time_interleaved(torch, timers, args.warmup, args.reps, args.rounds,
                                     args.warmup_s, rounds, args.settle_s)
        except Exception as e:  # noqa: BLE001
            times = {}
            log("  timing failed: %s" % e)
        for (side, key), (ms, spread) in times.items():
            tf = flops / (ms * 1e9)
            row[side][key] = tf
            log("  %-28s %8.3f ms %7.1f TFLOP/s (round spread %.1f%%)%s"
                % (key, ms, tf, 100 * spread,
                   " | " + row["check"][key] if side == "ours" else ""))
        # Paired: our rate over cuDNN's within each round, where both saw the same clock.
        peer_rounds = rounds.get(("peer", "cudnn"))
        row["paired"] = {}
        for (side, key), ours in rounds.items():
            if side != "ours" or not peer_rounds or len(ours) != len(peer_rounds):
                continue
            rs = sorted(c / o for o, c in zip(ours, peer_rounds) if o > 0)
            if rs:
                row["paired"][key] = (statistics.median(rs), rs[0], rs[-1], len(rs))
                log("  %-28s ours/cuDNN per round: median %.3f, range %.3f-%.3f, above 1 in %d "
                    "of %d rounds" % (key, row["paired"][key][0], rs[0], rs[-1],
                                      sum(r >= 1.0 for r in rs), len(rs)))
        for side, key in timers:
            row[side].setdefault(key, None)
        summary["dense"].append(row)
        del sets, ref_o
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- sparse
def block_mask_from_lists(torch, lists, skv):
    """FlexAttention BlockMask whose full blocks are exactly our lists (no partial blocks)."""
    from torch.nn.attention.flex_attention import BlockMask
    B, LH, T, K = lists.shape
    nblk = (skv + TILE - 1) // TILE
    full_idx = torch.zeros(B, LH, T, nblk, device="cuda", dtype=torch.int32)
    full_idx[..., :K] = lists
    full_num = torch.full((B, LH, T), K, device="cuda", dtype=torch.int32)
    part_num = torch.zeros(B, LH, T, device="cuda", dtype=torch.int32)
    part_idx = torch.zeros(B, LH, T, nblk, device="cuda", dtype=torch.int32)
    kw = dict(full_kv_num_blocks=full_num, full_kv_indices=full_idx, BLOCK_SIZE=TILE,
              seq_lengths=(T * TILE, skv))
    try:
        return BlockMask.from_kv_blocks(part_num, part_idx, compute_q_blocks=False, **kw)
    except TypeError:  # older signature without compute_q_blocks
        return BlockMask.from_kv_blocks(part_num, part_idx, **kw)


def selected_keys(torch, lists_row, skv):
    return torch.cat([torch.arange(int(b) * TILE, min(int(b) * TILE + TILE, skv), device="cuda")
                      for b in lists_row.tolist()])


def run_sparse(torch, F, lib, args, gemm, copy, summary):
    all_stages = [OurStage(torch, lib, s) for s in lib.stages()] if lib else []
    sparse = [s for s in all_stages if s.st.sparse]
    dense = [s for s in all_stages if not s.st.sparse]
    if not sparse:
        log("sparse: no sparse stage in the registry: ours n/a (dense baseline and Flex still run)")
    flex = None
    if "flex" in args.peers.split(",") and "sparse" in args.flex_modes.split(","):
        try:
            from torch.nn.attention.flex_attention import flex_attention
            flex = torch.compile(flex_attention, dynamic=False)
        except Exception as e:  # noqa: BLE001
            log("sparse: Flex n/a: %s" % e)
    B, Hq, Hkv, Sq, D, K = SPARSE_B, SPARSE_HQ, SPARSE_HKV, SPARSE_SQ, SPARSE_D, SPARSE_K
    tiles = Sq // TILE
    for skv in SPARSE_LEN_KV:
        if over_budget(args, "sparse len_kv %d" % skv):
            continue
        set_bytes = 2 * B * Hq * Sq * D * 2 + 2 * B * Hkv * skv * D * 2
        nsets = sets_needed(torch, set_bytes)
        sets = make_inputs(torch, (B, Hq, Sq, D), Hkv, skv, args.seed + skv, nsets)
        log("sparse len_kv=%d: %d input sets" % (skv, nsets))
        # Dense stage(s) at the same len_kv: Hkv = 1 if the stage takes it, else Hkv = Hq. They
        # are timed with each pattern's contenders, interleaved.
        dense_timers = {}
        for st in dense:
            try:
                use = sets
                outs = [(torch.empty_like(q), torch.empty(B, Hq, Sq, device="cuda",
                                                          dtype=torch.float32)) for q, _, _ in use]
                attns = [st.attn(q, k, v, o, l) for (q, k, v), (o, l) in zip(use, outs)]
                why = st.check(attns[0])
                if why:
                    use = [(q, k.repeat_interleave(Hq // Hkv, 1).contiguous(),
                            v.repeat_interleave(Hq // Hkv, 1).contiguous()) for q, k, v in sets]
                    attns = [st.attn(q, k, v, o, l) for (q, k, v), (o, l) in zip(use, outs)]
                    why2 = st.check(attns[0])
                    if why2:
                        log("  dense %-22s skipped: Hkv=1: %s; Hkv=Hq: %s" % (st.label, why, why2))
                        continue
                    log("  dense %-22s runs with Hkv=Hq: the stage rejects Hkv=1" % st.label)
                dense_timers[("dense", st.label)] = [st.call(a) for a in attns]
            except Exception as e:  # noqa: BLE001
                log("  dense %-22s failed: %s" % (st.label, e))
        for pat_id, pat in PATTERNS:
            shape = SaShape(B, Hq, Hkv, Sq, skv, D)
            lists = []
            for i in range(nsets):
                buf, dims = lib.random_tile_lists(shape, Hkv, K, pat_id,
                                                  args.seed * 31 + skv + pat_id * 7 + i)
                lists.append(torch.frombuffer(bytearray(buf), dtype=torch.int32)
                             .reshape(dims).cuda())
            useful = 4.0 * B * Hq * Sq * K * TILE * D  # every block is full (len_kv % 128 == 0)
            kv_bytes = sum(2 * 2 * torch.unique(l[b]).numel() * TILE * D
                           for l in lists for b in range(B)) / nsets
            nbytes = 2 * B * Hq * Sq * D * 2 + B * Hq * Sq * 4 + kv_bytes + lists[0].numel() * 4
            row = {"skv": skv, "pattern": pat, "ours": {}, "flex": None, "check": {},
                   "dense": None, "floor_tf": useful / (
                       floor_ms(useful, nbytes, gemm, copy) * 1e9)}
            q0, k0, v0 = sets[0]
            flex_o = None
            timers = dict(dense_timers)
            if flex is not None:
                try:
                    masks = [block_mask_from_lists(torch, l, skv) for l in lists]
                    flex_o = flex(q0, k0, v0, block_mask=masks[0], enable_gqa=True)
                    torch.cuda.synchronize()
                    timers[("flex", "flex")] = [
                        lambda s=s, m=m: flex(*s, block_mask=m, enable_gqa=True)
                        for s, m in zip(sets, masks)]
                    # Flex itself against FP32 on one Q tile of two heads: is the mask right?
                    t = tiles // 2
                    sl = [(b, h, t * TILE, t * TILE + TILE,
                           selected_keys(torch, lists[0][b, h // (Hq // Hkv), t], skv))
                          for b, h in ((0, 0), (B - 1, Hq - 1))]
                    eo, _ = check_slices(torch, flex_o, None, q0, k0, v0, sl)
                    log("  %-11s flex: vs FP32 slice %.2e %s"
                        % (pat, eo, "ok" if eo <= REL_L2_TOL else "FAIL"))
                except Exception as e:  # noqa: BLE001
                    flex_o = None
                    log("  %-11s flex n/a: %s" % (pat, str(e).splitlines()[0][:200]))
            for st in sparse:
                try:
                    outs = [(torch.empty_like(q), torch.empty(B, Hq, Sq, device="cuda",
                                                              dtype=torch.float32))
                            for q, _, _ in sets]
                    attns = {val: [st.attn(q, k, v, o, l, lists=li, validate=val)
                                   for (q, k, v), (o, l), li in zip(sets, outs, lists)]
                             for val in (1, 0)}
                    why = st.check(attns[1][0])
                    if why:
                        row["ours"][st.label] = None
                        log("  %-11s %-22s skipped: %s" % (pat, st.label, why))
                        continue
                    o, l = outs[0]
                    o.fill_(float("nan"))
                    l.fill_(float("nan"))
                    st.call(attns[1][0])()
                    torch.cuda.synchronize()
                    bad = nonfinite(torch, o, l)
                    notes = ["%d outputs NaN/inf%s" % (bad, " FAIL" if bad else "")]
                    if flex_o is not None:
                        e = rel_l2(torch, o, flex_o)
                        notes.append("O vs Flex %.2e %s" % (e, "ok" if e <= REL_L2_TOL else "FAIL"))
                    t = tiles // 2
                    sl = [(b, h, t * TILE, t * TILE + TILE,
                           selected_keys(torch, lists[0][b, h // (Hq // Hkv), t], skv))
                          for b, h in ((0, 0), (B - 1, Hq - 1))]
                    eo, el = check_slices(torch, o, l, q0, k0, v0, sl)
                    notes.append("slice vs FP32: O %.2e, LSE %.2e %s" % (
                        eo, el, "ok" if eo <= REL_L2_TOL and el <= LSE_TOL else "FAIL"))
                    row["check"][st.label] = "; ".join(notes)
                    timers[("val", st.label)] = [st.call(a) for a in attns[1]]
                    timers[("noval", st.label)] = [st.call(a) for a in attns[0]]
                except Exception as e:  # noqa: BLE001
                    row["ours"][st.label] = None
                    log("  %-11s %-22s failed: %s" % (pat, st.label, e))
            try:
                times = time_interleaved(torch, timers, args.warmup, args.reps, args.rounds,
                                         args.warmup_s, None, args.settle_s)
            except Exception as e:  # noqa: BLE001
                times = {}
                log("  %-11s timing failed: %s" % (pat, e))
            dense_tf = {}
            for (side, key), (ms, spread) in times.items():
                if side == "dense":
                    dense_tf[key] = 4.0 * B * Hq * Sq * skv * D / (ms * 1e9)
                    log("  %-11s dense %-22s %8.3f ms %7.1f TFLOP/s (round spread %.1f%%)"
                        % (pat, key, ms, dense_tf[key], 100 * spread))
                elif side == "flex":
                    row["flex"] = useful / (ms * 1e9)
                    log("  %-11s flex %8.3f ms useful %7.1f TFLOP/s (round spread %.1f%%)"
                        % (pat, ms, row["flex"], 100 * spread))
            best_dense = max(dense_tf.items(), key=lambda kv: kv[1]) if dense_tf else None
            row["dense"] = best_dense
            for st in sparse:
                if ("val", st.label) not in times or ("noval", st.label) not in times:
                    row["ours"].setdefault(st.label, None)
                    continue
                (ms_v, sp_v), (ms_n, _) = times[("val", st.label)], times[("noval", st.label)]
                tf_v, tf_n = useful / (ms_v * 1e9), useful / (ms_n * 1e9)
                row["ours"][st.label] = (tf_v, tf_n)
                log("  %-11s %-22s %8.3f ms useful %7.1f TFLOP/s (no validation %.3f ms, "
                    "%.1f; round spread %.1f%%) | vs Flex %s | vs dense %s | %s"
                    % (pat, st.label, ms_v, tf_v, ms_n, tf_n, 100 * sp_v,
                       fmt(ratio(tf_v, row["flex"]), ".2f"),
                       fmt(ratio(tf_v, best_dense[1] if best_dense else None), ".2f"),
                       row["check"][st.label]))
            summary["sparse"].append(row)
        del sets
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- summary
def short(label):
    """'stage 14 dense_persistent' -> '#14'."""
    parts = label.split()
    return "#" + parts[1] if len(parts) > 1 else label


def print_summary(summary, gemm, copy, device):
    log("")
    log("==== peers summary: %s; GEMM %s TFLOP/s, copy %s TB/s (measured in this run) ===="
        % (device, fmt(gemm), fmt(copy / 1e12 if copy else None, ".2f")))
    if summary["dense"]:
        log("dense (B,H,S,D)  TFLOP/s: %-12s %7s %7s %7s %7s | ours/cudnn ours/flash ours/flex"
            % ("ours", "cudnn", "flash", "flex", "bound"))
        for r in summary["dense"]:
            p = r["peer"]
            for label, tf in (r["ours"] or {"ours": None}).items():
                log("%-25s %-12s %7s %7s %7s %7s | %10s %10s %9s"
                    % (r["shape"], "%s %s" % (short(label), fmt(tf)), fmt(p.get("cudnn")),
                       fmt(p.get("flash")), fmt(p.get("flex")), fmt(r["floor_tf"]),
                       fmt(ratio(tf, p.get("cudnn")), ".2f"), fmt(ratio(tf, p.get("flash")), ".2f"),
                       fmt(ratio(tf, p.get("flex")), ".2f")))
                if label in r.get("paired", {}):
                    m, lo, hi, n = r["paired"][label]
                    log("%-25s ours/cudnn per round: median %.3f (%.3f-%.3f, %d rounds)"
                        % ("", m, lo, hi, n))
                if label in r["check"]:
                    log("%-25s check: %s" % ("", r["check"][label]))
    if summary["dense"] and not summary["sparse"]:
        log("bound: the rate at the floor, FLOPs / max(FLOPs / GEMM rate, bytes / copy bandwidth)")
    if summary["sparse"]:
        log("sparse len_kv pattern   useful TFLOP/s: %-20s %7s %7s %7s | ours/flex ours/dense"
            % ("ours valid. on/off", "flex", "dense", "bound"))
        for r in summary["sparse"]:
            d = r["dense"][1] if r["dense"] else None
            for label, tf in (r["ours"] or {"ours": None}).items():
                on, off = tf if tf else (None, None)
                log("%-6d %-11s %-20s %7s %7s %7s | %9s %10s"
                    % (r["skv"], r["pattern"], "%s %s/%s" % (short(label), fmt(on), fmt(off)),
                       fmt(r["flex"]), fmt(d), fmt(r["floor_tf"]), fmt(ratio(on, r["flex"]), ".2f"),
                       fmt(ratio(on, d), ".2f")))
                if label in r["check"]:
                    log("%-18s check: %s" % ("", r["check"][label]))
        names = sorted({r["dense"][0] for r in summary["sparse"] if r["dense"]})
        log("bound: the rate at the floor, FLOPs / max(FLOPs / GEMM rate, bytes / copy bandwidth)")
        log("dense column: best dense stage at the same len_kv (%s)" % (", ".join(names) or "none"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", required=True, help="path to libsparseattn.so (a CUDA build)")
    ap.add_argument("--mode", choices=["dense", "sparse", "all"], default="all")
    ap.add_argument("--peers", default="cudnn,flash,flex",
                    help="comma list of peers to run (cudnn, flash, flex)")
    ap.add_argument("--flex-modes", default="dense,sparse",
                    help="where FlexAttention runs (each shape costs a torch.compile)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--warmup-s", type=float, default=0.5,
                    help="seconds of untimed calls (all contenders in turn) before each shape")
    ap.add_argument("--rounds", type=int, default=4,
                    help="interleaved timing rounds: each round times every contender in turn")
    ap.add_argument("--settle-s", type=float, default=0.0,
                    help="seconds of untimed calls of a contender before its timed calls in each "
                         "round, so that it is timed at the clock it sustains on its own "
                         "(0: short bursts in turn)")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--budget-s", type=float, default=0,
                    help="skip the shapes not started after this many seconds (0: no limit)")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001
        log("peers: PyTorch is not importable here (%s): nothing to compare" % e)
        return 1
    if not torch.cuda.is_available():
        log("peers: torch sees no CUDA device")
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False  # FP32 references stay FP32
    torch.backends.cudnn.allow_tf32 = False
    try:  # one compile per shape of flex_attention: 6 shapes in all
        import torch._dynamo
        torch._dynamo.config.cache_size_limit = 64
        torch._dynamo.config.recompile_limit = 64
    except Exception:  # noqa: BLE001 - only a limit; the defaults may do
        pass
    lib = None
    try:
        lib = Lib(args.lib)
        if not lib.dll.sa_gpu_available():
            log("peers: libsparseattn says no usable GPU (built without CUDA?): ours n/a")
            lib = None
        else:
            log("stages: " + ", ".join("%d %s (%s)" % (s.id, s.name.decode(),
                                                       "sparse" if s.sparse else "dense")
                                       for s in lib.stages()))
    except OSError as e:
        log("peers: cannot load %s (%s): ours n/a" % (args.lib, e))
    device = torch.cuda.get_device_name(0)
    log("device %s, torch %s, cuDNN %s, seed %d, reps %d (median) in %d interleaved rounds, "
        "warm-up %d, %.1f s settling per contender and round"
        % (device, torch.__version__, torch.backends.cudnn.version(), args.seed, args.reps,
           args.rounds, args.warmup, args.settle_s))
    summary = {"dense": [], "sparse": []}
    gemm = copy = None
    try:
        gemm, copy = measure_ceilings(torch, args)
        # Sparse first: with --budget-s, the block-sparse comparison is the one to keep.
        if args.mode in ("sparse", "all"):
            if lib is None:
                log("sparse: needs libsparseattn (lists come from sa_random_tile_lists): skipped")
            else:
                run_sparse(torch, F, lib, args, gemm, copy, summary)
        if args.mode in ("dense", "all"):
            run_dense(torch, F, lib, args, gemm, copy, summary)
    except Exception:  # noqa: BLE001 - still print what was measured
        traceback.print_exc()
    log("peers: %.0f s" % (time.time() - T_START))
    print_summary(summary, gemm, copy, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
