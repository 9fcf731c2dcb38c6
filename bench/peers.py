#!/usr/bin/env python3
"""Our GPU stages against their peers, measured in one process on one GPU.

    python3 bench/peers.py --lib build-gpu/libsparseattn.so [--mode dense|sparse|all]
                           [--peers cudnn,flash,flex,fa4,bsa|none] [--json PATH]
    python3 bench/peers.py --self-test [--lib ...]   # the parts that need no GPU or torch

Loads libsparseattn through the sparseattn package of this checkout (python/sparseattn: its
struct mirror and ABI check, the stage registry, verdicts, sa_random_tile_lists), takes the
shapes and tolerances from bench/shapes.h (the C benches' header; the values below are its
values), allocates BF16 BHSD inputs with PyTorch and measures, in this order:
  ceilings  bf16 GEMM rate (8192^3 torch.matmul, random data) and device-to-device copy bandwidth
            (bytes read + written);
  dense     the three dense shapes (B, H, S, D) = (8,16,4096,128) (4,16,8192,128)
            (2,16,16384,128): every dense stage against SDPA with the cuDNN backend, SDPA with
            the FlashAttention backend, FlexAttention (torch.compile, no mask) and
            FlashAttention-4 (flash_attn.cute.interface._flash_attn_fwd, BSHD, non-causal); our O
            must match cuDNN's (relative L2 <= 1e-2) and our O and LSE an FP32 reference on
            slices; every peer's O is compared with ours and with the same slices;
  sparse    batch 2, 16 query heads on 1 KV head, D 128, len_q 4096, len_kv 4K/8K/16K, 16 blocks
            of 128 per Q tile shared by the GQA group, lists from sa_random_tile_lists
            (independent and paired), non-causal: every sparse stage, with validation on
            (synchronous, and through a device verdict where the stage has SA_ROLE_GPU_VERDICT)
            and off, against FlexAttention (the blocks as a BlockMask of full blocks),
            FlashAttention-4 block-sparse (BlockSparseTensorsTorch: our blocks as full blocks,
            mask counts 0, block_size (128, 128), BSHD; pack_gqa on and off) and cuDNN frontend
            BSA (cudnn.BSA.block_sparse_attention_forward, per-query-head metadata;
            sparse_block_size 128, and 64 with each of our blocks split in two), in useful
            TFLOP/s, and against the dense stage at the same len_kv.
A peer runs only where it imports (a line says why not otherwise). The CuTe DSL peers compile
on the first call of each configuration (seconds): that call is the check, outside the timing.
Timing: CUDA events around each call, warm-up, median; input sets rotated so that at least twice
the L2 passes between two uses of one set. Each timed batch is queued behind a device sleep
(torch.cuda._sleep) long enough for the host to queue the whole batch, so the events measure GPU
time without host overhead; the GPU's idle time between calls is printed as a check of that.
Host time per call is measured apart: calls issued back to back on an idle GPU, wall time per
call (a call that waits for the GPU, as a synchronously validated one does, counts its wait).
The contenders of one shape are timed in interleaved rounds (--rounds), so a drift of the card's
clock during the run falls on all of them alike; for the dense stages the ratios to cuDNN and
FA4 are also given per round (paired: both timed within the same round), with median and range.
The sparse part runs first (so --budget-s keeps it); a short summary table is printed last, and
--json PATH writes one record per (mode, shape, pattern, contender).
"""
import argparse
import contextlib
import io
import json
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES_H = os.path.join(HERE, "shapes.h")  # the shapes and tolerances the C benches include
PYTHON_DIR = os.path.join(os.path.dirname(HERE), "python")  # the sparseattn package


# ---------------------------------------------------------------- bench/shapes.h
def _strip_c_comments(text):
    """The text without /* */ and // comments (each block comment becomes one space, its line
    breaks kept, so a #define after it stays at the start of its line)."""
    text = re.sub(r"/\*.*?\*/", lambda m: " " + "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)(?![\w(])[ \t]*(.*?)[ \t]*$",
                     re.M)
_INT = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|[0-9]+)[uUlL]*$")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?[fFlL]?$")


def parse_define_value(text):
    """A #define value that is a number (int: decimal or hex, suffixes u/l allowed; float:
    with a point or an exponent) or a brace list of them, nested: int, float or tuple. None for
    anything else (an expression, a string, an empty value)."""
    tokens = re.findall(r"[{},]|[^\s{},]+", text)
    pos = [0]

    def value():
        if pos[0] >= len(tokens):
            raise ValueError("unexpected end")
        tok = tokens[pos[0]]
        pos[0] += 1
        if tok == "{":
            items = []
            while pos[0] < len(tokens) and tokens[pos[0]] != "}":
                items.append(value())
                if pos[0] < len(tokens) and tokens[pos[0]] == ",":
                    pos[0] += 1
                elif pos[0] < len(tokens) and tokens[pos[0]] != "}":
                    raise ValueError("expected , or }")
            if pos[0] >= len(tokens):
                raise ValueError("unclosed {")
            pos[0] += 1
            return tuple(items)
        if _INT.match(tok):
            digits = tok.rstrip("uUlL")
            octal = re.match(r"[+-]?0[0-7]+$", digits)  # C's 010 is 8
            return int(digits, 8 if octal else 0)
        if _FLOAT.match(tok) and any(c in tok for c in ".eE"):
            return float(tok.rstrip("fFlL"))
        raise ValueError("not a number: %r" % tok)

    try:
        v = value()
    except ValueError:
        return None
    return v if pos[0] == len(tokens) else None


def parse_defines(text):
    """{NAME: value} of the object-like `#define NAME value` lines of a C header whose value
    parse_define_value reads (comments removed, backslash-continued lines joined); other
    defines (function-like macros, expressions, strings, flags without a value) are left
    out."""
    text = _strip_c_comments(text.replace("\\\n", " "))
    out = {}
    for name, value in _DEFINE.findall(text):
        v = parse_define_value(value)
        if v is not None:
            out[name] = v
    return out


def _positive_ints(v, n=None):
    return isinstance(v, tuple) and (n is None or len(v) == n) and len(v) > 0 and all(
        isinstance(x, int) and x > 0 for x in v)


def bench_shapes(text, where="bench/shapes.h"):
    """The benchmark shapes and tolerances of a shapes.h text: {"DENSE_SHAPES": [(B, H, S, D)],
    "SPARSE_B", "SPARSE_HQ", "SPARSE_HKV", "SPARSE_SQ", "SPARSE_D", "SPARSE_K": int,
    "SPARSE_LEN_KV": [int], "REL_L2_TOL", "LSE_TOL": float}, from the SA_BENCH_* defines;
    ValueError naming the define that is missing or of the wrong form."""
    d = parse_defines(text)
    out = {}

    def need(name, ok, what):
        v = d.get(name)
        if v is None or not ok(v):
            raise ValueError("%s: %s is missing or not %s" % (where, name, what))
        return v

    for key in ("B", "HQ", "HKV", "SQ", "D", "K"):
        out["SPARSE_" + key] = need("SA_BENCH_SPARSE_" + key,
                                    lambda v: isinstance(v, int) and v > 0, "a positive integer")
    out["SPARSE_LEN_KV"] = list(need("SA_BENCH_SPARSE_LEN_KV", _positive_ints,
                                     "a brace list of positive integers"))
    out["DENSE_SHAPES"] = [tuple(s) for s in need(
        "SA_BENCH_DENSE_SHAPES", lambda v: isinstance(v, tuple) and v and all(
            _positive_ints(s, 4) for s in v), "a brace list of {B, H, S, D} lists")]
    for key in ("REL_L2_TOL", "LSE_TOL"):
        out[key] = float(need("SA_BENCH_" + key, lambda v: isinstance(v, (int, float))
                              and not isinstance(v, tuple) and v > 0, "a positive number"))
    return out


def read_bench_shapes(path=SHAPES_H):
    with open(path) as f:
        return bench_shapes(f.read(), path)


TILE = 128
_SHAPES = read_bench_shapes()
REL_L2_TOL = _SHAPES["REL_L2_TOL"]  # the project's BF16 output tolerance
LSE_TOL = _SHAPES["LSE_TOL"]  # absolute, natural-log units
DENSE_SHAPES = _SHAPES["DENSE_SHAPES"]
SPARSE_B, SPARSE_HQ, SPARSE_HKV, SPARSE_SQ, SPARSE_D, SPARSE_K = (
    _SHAPES["SPARSE_" + k] for k in ("B", "HQ", "HKV", "SQ", "D", "K"))
SPARSE_LEN_KV = _SHAPES["SPARSE_LEN_KV"]
PATTERNS = [(0, "independent"), (1, "paired")]  # SA_LISTS_INDEPENDENT, SA_LISTS_PAIRED
GEMM_N = 8192
COPY_BYTES = 1 << 30
MAX_SETS = 8
PEER_NAMES = ("cudnn", "flash", "flex", "fa4", "bsa")
# The device sleep ahead of a timed batch: SLEEP_MIN_MS plus SLEEP_MARGIN times the host's time
# for the batch, at most SLEEP_MAX_MS; calibrated once with SLEEP_CAL_CYCLES.
SLEEP_MIN_MS, SLEEP_MARGIN, SLEEP_MAX_MS, SLEEP_CAL_CYCLES = 0.2, 2.0, 200.0, 4000000
HOST_CALLS = 8  # calls per contender for the host time per call
CLOCK_SKIP_S = 0.2  # --clocks: a contender's first seconds in a round, left out of its clock


def peer_names(ap, text, known):
    """--peers as peers.py, causal.py and backward.py all take it: a comma list of names from
    `known`, or `none` for no peer. Empty entries are skipped and a repeated name kept once, in
    order; an unknown name is a usage error (ap.error: exit 2) that lists the known ones."""
    if text.strip() == "none":
        return []
    names = []
    for n in (x.strip() for x in text.split(",")):
        if n and n not in names:
            names.append(n)
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error("--peers: unknown %s (known: %s, or none)" % (",".join(unknown), ",".join(known)))
    return names


# ---------------------------------------------------------------- the sparseattn package
def import_sparseattn(lib_path=None):
    """The sparseattn package of this checkout (python/sparseattn) with lib_path as its library
    ($SPARSEATTN_LIB is set to it before the import; None: the package's own search). The
    benchmarks take everything C from it: the ctypes mirror of the structs (_capi), the
    library's loading and the ABI check against sa_abi_sizeof / sa_abi_offsetof (done at
    import: AbiMismatchError, LibraryNotFoundError, both ImportError, as is a missing numpy),
    the stage registry, verdicts and sa_random_tile_lists (_gpu)."""
    if lib_path:
        os.environ["SPARSEATTN_LIB"] = os.path.abspath(lib_path)
    if PYTHON_DIR not in sys.path:
        sys.path.insert(0, PYTHON_DIR)
    import sparseattn
    import sparseattn._capi  # the callers use sa._capi and sa._gpu
    import sparseattn._gpu
    if lib_path and os.path.isfile(lib_path) and \
            os.path.realpath(lib_path) != os.path.realpath(sparseattn.library_path):
        raise ImportError("sparseattn was imported before with %s, not %s"
                          % (sparseattn.library_path, lib_path))
    return sparseattn


def log(msg):
    print(msg, flush=True)


def first_line(e):
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


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


# ---------------------------------------------------------------- our lists as the peers' metadata
# Pure functions over torch or numpy arrays (xp is the module), so --self-test runs them without a
# GPU. lists: (B, LH, T, K) int32 block indices of 128 keys per 128-query tile, as sa_tile_lists
# holds them (query head h reads list head h // (Hq / LH)); counts: (B, LH, T) int32 or None (K).
def whole_blocks(skv, block):
    """The conversions pass every block as a full one: len_kv must be a multiple of it."""
    if skv % block:
        raise ValueError("len_kv %d is not a multiple of %d: partial blocks are not converted"
                         % (skv, block))


def per_query_head(x, heads_q):
    """(B, LH, ...) -> (B, heads_q, ...), a contiguous copy: query head h takes list head
    h // (heads_q / LH)."""
    g = heads_q // x.shape[1]
    return x[:, [h // g for h in range(heads_q)]]


def fa4_sparse_metadata(lists, counts, xp):
    """(mask_block_cnt, mask_block_idx, full_block_cnt, full_block_idx) for FA4's
    BlockSparseTensorsTorch: every listed block a full block (no mask function needed), no
    masked blocks (counts 0; the index is never read and only needs the shape
    (B, LH, T, 1)). The head dimension stays LH: with LH = 1 (a list per GQA group and one KV
    head) FA4 can pack the group's query heads into one tile (pack_gqa)."""
    B, LH, T, K = lists.shape
    full_cnt = counts if counts is not None else xp.full((B, LH, T), K, dtype=xp.int32)
    return (xp.zeros((B, LH, T), dtype=xp.int32), xp.zeros((B, LH, T, 1), dtype=xp.int32),
            full_cnt, lists)


def bsa_metadata(lists, counts, heads_q, block, xp):
    """(q2k_block_index, q2k_block_nums) for cuDNN BSA on SM90: per query head,
    (B, heads_q, Sq / block, K') int32. block 128: our lists as they are (K' = K; nums = counts,
    None for a fixed count). block 64: each 128-block b becomes the 64-blocks 2b, 2b + 1 (kept
    ascending) and each Q tile t the Q blocks 2t, 2t + 1 with the tile's list (K' = 2K); nums
    is then always given (2 * counts, or 2K), since without it cuDNN's SM90 blk64 path fills
    such a tensor on every call, a kernel that would be timed with it."""
    B, LH, T, K = lists.shape
    if block == TILE:
        idx, nums = lists, counts
    elif block == TILE // 2:
        two = lists * 2
        idx = xp.stack([two, two + 1], -1).reshape(B, LH, T, 2 * K)
        rows = [t // 2 for t in range(2 * T)]
        idx = idx[:, :, rows]
        if counts is None:
            nums = xp.full((B, LH, 2 * T), 2 * K, dtype=xp.int32)
        else:
            nums = (counts * 2)[:, :, rows]
    else:
        raise ValueError("cuDNN BSA blocks are 64 or 128 tokens, not %d" % block)
    return per_query_head(idx, heads_q), None if nums is None else per_query_head(nums, heads_q)


# ---------------------------------------------------------------- timing and checks (need torch)
_SLEEP = {}


def sleep_ms_for(reps, host_ms_per_call):
    """The device sleep ahead of a batch of reps calls: long enough for the host to queue them
    all (SLEEP_MARGIN times its measured time per call), at most SLEEP_MAX_MS."""
    return min(SLEEP_MAX_MS, SLEEP_MIN_MS + SLEEP_MARGIN * reps * max(0.0, host_ms_per_call))


def device_sleep(torch, ms):
    """Queues a kernel that spins for about ms milliseconds (torch.cuda._sleep, its cycles per
    ms calibrated once). False where torch has no _sleep: the batch then starts at once."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        if "warned" not in _SLEEP:
            _SLEEP["warned"] = True
            log("timing: torch.cuda._sleep is missing: batches start without a device sleep, "
                "so host overhead may show in the GPU times (see 'GPU idle')")
        return False
    if "cycles_per_ms" not in _SLEEP:
        sleep(1000)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        sleep(SLEEP_CAL_CYCLES)
        e.record()
        e.synchronize()
        _SLEEP["cycles_per_ms"] = SLEEP_CAL_CYCLES / max(s.elapsed_time(e), 1e-3)
    sleep(max(1, int(ms * _SLEEP["cycles_per_ms"])))
    return True


class ClockSampler:
    """SM clock and board power, sampled by `nvidia-smi -lms SAMPLE_MS` in a thread, so that
    time_interleaved can give each contender the mean clock and power of its own timed windows.
    On a card at its power limit a kernel's rate is its work per clock times the clock it holds
    (docs/log/2026-11-29-benchmarks.md): this says which of the two separates two contenders.
    start() returns False (and the run goes on without clocks) where nvidia-smi is missing.
    bench/clocks.py uses it too."""

    SAMPLE_MS = 20

    def __init__(self, sample_ms=SAMPLE_MS):
        self.samples, self.proc, self.sample_ms = [], None, sample_ms

    def start(self):
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                 "-i", "0", "-lms", str(self.sample_ms)], stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, text=True)
        except OSError as e:
            log("clocks: nvidia-smi cannot run (%s): no clock samples" % e)
            return False
        threading.Thread(target=self._read, daemon=True).start()
        return True

    def _read(self):
        for line in self.proc.stdout:
            try:
                mhz, watt = line.strip().split(",")
                self.samples.append((time.time(), float(mhz), float(watt)))
            except ValueError:  # a header or a "[N/A]"
                pass

    def mean(self, windows):
        """(mean MHz, mean W, samples) over the samples that fall inside any (t0, t1) window,
        ends excluded."""
        got = [(m, w) for (t, m, w) in list(self.samples)
               if any(t0 < t < t1 for t0, t1 in windows)]
        if not got:
            return None, None, 0
        return (statistics.mean(m for m, _ in got), statistics.mean(w for _, w in got), len(got))

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            self.proc = None


CLOCKS = {"sampler": None}  # the run's ClockSampler (--clocks), None: no samples


@contextlib.contextmanager
def clock_sampling(enabled):
    """With enabled (--clocks), CLOCKS["sampler"] samples for the duration of the block, so that
    time_interleaved gives each contender its clock and power; without, nothing is sampled."""
    CLOCKS["sampler"] = ClockSampler() if enabled else None
    if CLOCKS["sampler"] is not None and not CLOCKS["sampler"].start():
        CLOCKS["sampler"] = None
    try:
        yield
    finally:
        if CLOCKS["sampler"] is not None:
            CLOCKS["sampler"].stop()
            CLOCKS["sampler"] = None


def clock_text(info):
    """'1712 MHz, 690 W' for a contender --clocks sampled (time_interleaved's info), else None."""
    if not info.get("clock_samples"):
        return None
    return "%.0f MHz, %.0f W" % (info["sm_mhz"], info["power_w"])


def time_calls(torch, calls, warmup, reps):
    """Median ms of calls[i % len(calls)]() over reps, each between its own CUDA events."""
    return statistics.median(time_samples(torch, calls, max(warmup, len(calls)), reps))


def host_us_per_call(torch, calls, n):
    """Host wall time per call, in us, of n calls issued back to back on an idle GPU."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        calls[i % len(calls)]()
    us = (time.perf_counter() - t0) * 1e6 / n
    torch.cuda.synchronize()
    return us


def time_interleaved(torch, named_calls, warmup, reps, rounds, warmup_s=0.0, round_out=None,
                     settle_s=0.0, info_out=None):
    """{name: (median ms, spread)} for each name's calls, timed in `rounds` interleaved rounds.

    Round r times every name in turn (the order rotated by r), reps / rounds calls each after a
    short warm-up, so slow drifts of the card (clock and temperature) fall on every name alike
    instead of on whichever ran last. The median is over all of a name's calls; the spread is
    (max - min) / median of its per-round medians, the run's own noise figure. A dict passed as
    round_out receives each name's list of per-round medians (for paired ratios). A dict passed
    as info_out receives {name: {"host_us": host time per call, "gpu_idle": GPU time idle
    between the timed calls / their GPU time}}.

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
    stats = {n: {} for n in names}
    windows = {n: [] for n in names}
    for r in range(max(1, rounds)):
        order = names[r % len(names):] + names[:r % len(names)] if names else []
        for n in order:
            calls = named_calls[n]
            t_win = time.time()
            t_end = t_win + settle_s
            i = 0
            while time.time() < t_end:
                calls[i % len(calls)]()
                i += 1
                if i % 8 == 0:
                    torch.cuda.synchronize()  # keep the queue short, so the timing follows
            ms = time_samples(torch, calls, warmup if r == 0 else min(2, warmup), per_round,
                              stats[n])
            samples[n] += ms
            round_medians[n].append(statistics.median(ms))
            # The clock window: the settling calls (if any) and the timed batch; the first
            # CLOCK_SKIP_S of it still shows the previous contender's clock.
            windows[n].append((t_win + CLOCK_SKIP_S, time.time()))
    if round_out is not None:
        round_out.update(round_medians)
    if info_out is not None:
        for n in names:
            busy = stats[n].get("busy_ms", 0.0)
            info_out[n] = {"host_us": host_us_per_call(torch, named_calls[n],
                                                       max(HOST_CALLS, per_round)),
                           "gpu_idle": stats[n].get("idle_ms", 0.0) / busy if busy > 0 else None}
            if CLOCKS["sampler"] is not None:
                mhz, watt, k = CLOCKS["sampler"].mean(windows[n])
                info_out[n].update({"sm_mhz": mhz, "power_w": watt, "clock_samples": k})
    out = {}
    for n in names:
        med = statistics.median(samples[n])
        rm = round_medians[n]
        out[n] = (med, (max(rm) - min(rm)) / med if med > 0 else 0.0)
    return out


def time_samples(torch, calls, warmup, reps, stats=None):
    """Per-call ms of calls[i % len(calls)]() over reps, each between its own CUDA events.

    The warm-up calls, issued on an idle GPU, also give the host's time per call; the timed
    calls are then queued behind a device sleep long enough for the host to queue all of them,
    so the GPU runs them back to back and the events measure GPU time without host overhead
    (a call that itself waits for the GPU, as a synchronously validated one does, still shows
    its wait). A dict passed as stats accumulates busy_ms (the calls' GPU time) and idle_ms
    (GPU time between the end of one call and the start of the next: near 0 when the host
    stayed ahead of the GPU)."""
    n = max(warmup, 1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        calls[i % len(calls)]()
    host_ms = (time.perf_counter() - t0) * 1e3 / n
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    device_sleep(torch, sleep_ms_for(reps, host_ms))
    for r in range(reps):
        ev[r][0].record()
        calls[r % len(calls)]()
        ev[r][1].record()
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in ev]
    if stats is not None:
        stats["busy_ms"] = stats.get("busy_ms", 0.0) + sum(ms)
        stats["idle_ms"] = stats.get("idle_ms", 0.0) + sum(
            max(0.0, ev[r][1].elapsed_time(ev[r + 1][0])) for r in range(reps - 1))
    return ms


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


def peer_check(torch, o, lse, ref, q, k, v, slices):
    """A peer's output (O as BHSD, LSE (B, H, Sq) or None) checked: NaN/inf left, relative L2
    of O against our reference stage's O on the same inputs (ref: (label, O, LSE) or None), the
    LSE's largest difference from ours, and O (and LSE) against the FP32 slices. (dict, text)."""
    c = {"nonfinite": nonfinite(torch, o, lse), "ours_ref": ref[0] if ref else None,
         "rel_l2_vs_ours": rel_l2(torch, o, ref[1]) if ref else None, "lse_vs_ours": None}
    if ref and lse is not None and ref[2] is not None:
        c["lse_vs_ours"] = (lse.float() - ref[2]).abs().max().item()
    eo, el = check_slices(torch, o, lse, q, k, v, slices)
    c["slice_o"], c["slice_lse"] = eo, el if lse is not None else None
    c["ok"] = (c["nonfinite"] == 0 and eo <= REL_L2_TOL and (lse is None or el <= LSE_TOL)
               and (c["rel_l2_vs_ours"] is None or c["rel_l2_vs_ours"] <= REL_L2_TOL)
               and (c["lse_vs_ours"] is None or c["lse_vs_ours"] <= LSE_TOL))
    text = "%d outputs NaN/inf; " % c["nonfinite"]
    if ref:
        text += "O vs %s rel L2 %.2e" % (short(ref[0]), c["rel_l2_vs_ours"])
        text += ", LSE %.2e; " % c["lse_vs_ours"] if c["lse_vs_ours"] is not None else "; "
    else:
        text += "no stage of ours to compare with; "
    text += "slices vs FP32: O %.2e" % eo + (", LSE %.2e" % el if lse is not None else "")
    return c, text + (" ok" if c["ok"] else " FAIL")


class OurStage:
    """One registered stage (a sparseattn Stage, from sa.stages()) bound to torch tensors
    through sa_gpu_attn (the package's SaGpuAttn)."""

    def __init__(self, torch, sa, stage):
        self.torch, self.sa, self.st = torch, sa, stage
        self.id, self.name = stage.id, stage.name
        self.label = "stage %d %s" % (self.id, self.name)
        self.roles = int(stage.roles)

    def has_role(self, bit):
        return bool(self.roles & bit)

    def attn(self, q, k, v, o, lse, lists=None, validate=1, verdict=None):
        """The stage's arguments; verdict: a sparseattn.Verdict, or None (NULL: the
        synchronous check)."""
        capi = self.sa._capi
        a = self.sa._gpu.gpu_attn_default()
        B, Hq, Sq, D = q.shape
        a.shape = capi.SaShape(B, Hq, k.shape[1], Sq, k.shape[2], D)
        a.q, a.k, a.v, a.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
        a.lse = lse.data_ptr() if lse is not None else None
        if lists is not None:
            a.lists = capi.SaTileLists(lists.data_ptr(), None, lists.shape[1], lists.shape[3])
        a.validate = validate
        a.stream = self.torch.cuda.current_stream().cuda_stream
        a.verdict = verdict.handle if verdict is not None else None
        # The struct holds raw pointers: it keeps its tensors alive for as long as it lives (and a
        # call made by call() keeps the struct), so callers need no lists of buffers to hold.
        a._tensors = (q, k, v, o, lse, lists, verdict)
        return a

    def check(self, a):
        rc = self.st.check(a)
        return None if rc == 0 else self.sa.strerror(rc)

    def call(self, a):
        """call() launching the stage on a (SparseAttnError for a bad status)."""
        return self.st.launcher(a)


def pick_reference(stages_ok, role):
    """Our stage the peers are compared with: the one with `role` among those whose output
    passed, else the first of them."""
    for st, out in stages_ok:
        if st.has_role(role):
            return st, out
    return stages_ok[0] if stages_ok else (None, None)


# ---------------------------------------------------------------- FA4 and cuDNN BSA (optional)
def peer_versions():
    out = {}
    try:
        from importlib import metadata
    except Exception:  # noqa: BLE001
        return out
    for dist in ("flash-attn-4", "nvidia-cudnn-frontend", "nvidia-cutlass-dsl", "quack-kernels",
                 "apache-tvm-ffi"):
        try:
            out[dist] = metadata.version(dist)
        except Exception:  # noqa: BLE001 - not installed (or not as a distribution)
            out[dist] = None
    return out


def load_fa4():
    """(_flash_attn_fwd, BlockSparseTensorsTorch) of FlashAttention-4's CuTe interface."""
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    from flash_attn.cute.interface import _flash_attn_fwd
    return _flash_attn_fwd, BlockSparseTensorsTorch


def load_bsa():
    """cudnn.BSA.block_sparse_attention_forward of the cuDNN frontend (imports the CuTe DSL)."""
    import cudnn
    return cudnn.BSA.block_sparse_attention_forward


def bshd(qkv):
    """BSHD copies of BHSD q, k, v (the FA4 peers' layout), made outside the timing, with the
    plain strides of a new tensor (transpose().contiguous() would keep a view where the head
    dimension is 1, as for K and V here, with a stride of its own)."""
    out = []
    for t in qkv:
        B, H, S, D = t.shape
        c = t.new_empty((B, S, H, D))
        c.copy_(t.transpose(1, 2))
        out.append(c)
    return tuple(out)


def fa4_call(torch, fwd, qkv_bshd, block_sparse=None, pack_gqa=None):
    """call() -> (O as a BHSD view, LSE (B, Hq, Sq)) running FA4's forward, non-causal, on BSHD
    q, k, v into its own O (poisoned with NaN first) and LSE."""
    q, k, v = qkv_bshd
    B, S, H, _ = q.shape
    o = torch.full_like(q, float("nan"))
    lse = torch.full((B, H, S), float("nan"), device=q.device, dtype=torch.float32)
    o_bhsd = o.transpose(1, 2)
    kw = dict(causal=False, return_lse=True, out=o, lse=lse)
    if block_sparse is not None:
        kw["block_sparse_tensors"] = block_sparse
    if pack_gqa is not None:
        kw["pack_gqa"] = pack_gqa

    def call():
        fwd(q, k, v, **kw)
        return o_bhsd, lse
    return call


def bsa_call(fn, q, k, v, index, nums, block):
    """call() -> (O, LSE) of cuDNN BSA on BHSD q, k, v (it allocates both on every call)."""
    def call():
        r = fn(q, k, v, index, q2k_block_nums=nums, sparse_block_size=block)
        return r["o_tensor"], r["lse_tensor"]
    return call


def clean(x):
    """JSON-safe: NaN and inf become None, tuples lists."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def add_record(summary, mode, shape, pattern, contender, kind, config, flops, timing, info,
               check, **extra):
    """One JSON record of a (mode, shape, pattern, contender)."""
    ms, spread = timing if timing else (None, None)
    rec = {"mode": mode, "shape": shape, "pattern": pattern, "contender": contender,
           "kind": kind, "config": config, "gpu_ms": ms, "round_spread": spread,
           "tflops": flops / (ms * 1e9) if ms else None,
           "tflops_counts": "useful" if mode == "sparse" and kind != "dense" else "all",
           "host_us_per_call": (info or {}).get("host_us"),
           "gpu_idle_frac": (info or {}).get("gpu_idle"),
           "sm_mhz": (info or {}).get("sm_mhz"), "power_w": (info or {}).get("power_w"),
           "tflops_per_ghz": flops / (ms * 1e9) / (info["sm_mhz"] / 1e3)
           if ms and (info or {}).get("sm_mhz") else None,
           "rel_l2_vs_ours": (check or {}).get("rel_l2_vs_ours"),
           "ours_ref": (check or {}).get("ours_ref"), "check": check or {}}
    rec.update(extra)
    summary["records"].append(rec)


def timing_note(spread, info):
    note = "round spread %.1f%%; host %s us/call, GPU idle %s%%" % (
        100 * spread, fmt(info.get("host_us"), ".0f"),
        fmt(None if info.get("gpu_idle") is None else 100 * info["gpu_idle"], ".1f"))
    if clock_text(info):
        note += "; %s (%d samples)" % (clock_text(info), info["clock_samples"])
    return note


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
    """name -> bind(q, k, v) -> call, for the peers asked for (absent ones say why): call() runs
    the peer on BHSD q, k, v and returns (O as BHSD, LSE (B, H, S) or None)."""
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

                def bind(q, k, v, be=be):
                    def call():
                        with sdpa_kernel(be):
                            return F.scaled_dot_product_attention(q, k, v), None
                    return call
                peers[key] = bind
    if "flex" in want and "dense" in args.flex_modes.split(","):
        try:
            from torch.nn.attention.flex_attention import flex_attention
            flex = torch.compile(flex_attention, dynamic=False)
            peers["flex"] = lambda q, k, v: (lambda: (flex(q, k, v), None))
        except Exception as e:  # noqa: BLE001
            why["flex"] = "flex_attention: %s" % e
    if "fa4" in want:
        try:
            fwd, _ = load_fa4()
            peers["fa4"] = lambda q, k, v: fa4_call(torch, fwd, bshd((q, k, v)))
        except Exception as e:  # noqa: BLE001
            why["fa4"] = "flash_attn.cute (FlashAttention-4): %s" % first_line(e)
    for key in ("cudnn", "flash", "flex", "fa4"):
        if key not in peers:
            why.setdefault(key, "not asked for (--peers / --flex-modes)")
    return peers, why


PEER_LABEL = {"cudnn": "cuDNN SDPA", "flash": "FlashAttention SDPA", "flex": "FlexAttention",
              "fa4": "FA4 (flash_attn.cute, BSHD)"}


class AllBlocks:
    """The default tile-list stage with every KV block listed for every Q tile: dense attention
    through the sparse kernel (issue #13 asks it to match FA4 dense). Validated, with a device
    verdict when the stage records one (read once per shape after timing), else synchronously."""

    def __init__(self, torch, st, verdict):
        self.torch, self.st, self.verdict = torch, st, verdict
        self.label = st.label + " all blocks"
        self.roles = 0  # never the dense reference: that stays the dense stage

    def has_role(self, bit):
        return False

    def attn(self, q, k, v, o, lse):
        B, _, Sq, _ = q.shape
        hkv, nb, tiles = k.shape[1], k.shape[2] // TILE, (Sq + TILE - 1) // TILE
        # Group-shared: a list head per KV head (list_heads must be heads_kv or heads_q; one
        # list head for the dense shapes' 16 KV heads was refused with SA_ERR_LIST_HEADS).
        lists = self.torch.arange(nb, device="cuda", dtype=self.torch.int32).expand(
            B, hkv, tiles, nb).contiguous()
        return self.st.attn(q, k, v, o, lse, lists=lists, verdict=self.verdict)

    def check(self, a):
        return self.st.check(a)

    def call(self, a):
        return self.st.call(a)


def wanted_stage(args, st):
    """--stages: whether our stage st (a registry entry) takes part (all of them by default)."""
    return not args.stages or st.id in args.stages


def run_dense(torch, F, sa, args, gemm, copy, summary):
    """sa: the sparseattn package (import_sparseattn), or None where it did not load."""
    stages = [OurStage(torch, sa, s) for s in sa.stages()
              if not s.sparse and wanted_stage(args, s)] if sa else []
    if not stages:
        log("dense: no dense stage in the registry (or library not loaded, or --stages): ours n/a")
    verdict = None
    tile = [OurStage(torch, sa, s) for s in sa.stages()
            if s.sparse and wanted_stage(args, s)] if sa else []
    tile = [st for st in tile if st.has_role(sa.SA_ROLE_DEFAULT_TILE)]
    if tile:
        if tile[0].has_role(sa.SA_ROLE_GPU_VERDICT):
            verdict = sa.Verdict()
        stages.append(AllBlocks(torch, tile[0], verdict))
    try:
        run_dense_shapes(torch, F, sa, args, gemm, copy, summary, stages, verdict)
    finally:
        if verdict is not None:
            torch.cuda.synchronize()
            verdict.close()


def run_dense_shapes(torch, F, sa, args, gemm, copy, summary, stages, verdict):
    peers, peer_why = dense_peers(torch, F, args)
    for key, w in peer_why.items():
        log("dense: peer %s n/a: %s" % (key, w))
        summary["unavailable"]["dense " + key] = w
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
        shape = {"B": B, "Hq": H, "Hkv": H, "Sq": S, "Skv": S, "D": D}
        row = {"shape": "%d,%d,%d,%d" % (B, H, S, D), "floor_tf": flops / (
            floor_ms(flops, nbytes, gemm, copy) * 1e9), "ours": {}, "peer": {}, "check": {},
            "paired": {}}
        q0, k0, v0 = sets[0]
        peer_out = {}
        checks = {}
        timers = {}  # (side, name) -> calls; timed together below, interleaved
        for key, bind in peers.items():
            try:
                calls = [bind(*s) for s in sets]
                t0 = time.time()
                peer_out[key] = calls[0]()
                torch.cuda.synchronize()
                checks[("peer", key)] = {"first_call_s": time.time() - t0}
                timers[("peer", key)] = calls
            except Exception as e:  # noqa: BLE001
                row["peer"][key] = None
                log("  %-28s n/a: %s" % (key, first_line(e)))
                add_record(summary, "dense", shape, None, key, "peer", {"peer": key}, flops,
                           None, None, None, status="failed", reason=first_line(e))
        slices = [(0, 0, 0, 256, None), (B - 1, H - 1, S - 256, S, None)]
        passed = []
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
                c = {"nonfinite": bad}
                notes = ["%d outputs NaN/inf%s" % (bad, " FAIL" if bad else "")]
                if "cudnn" in peer_out:
                    e = rel_l2(torch, o, peer_out["cudnn"][0])
                    c["rel_l2_vs_cudnn"] = e
                    notes.append("O vs cuDNN rel L2 %.2e %s" % (e, "ok" if e <= REL_L2_TOL
                                                                else "FAIL"))
                eo, el = check_slices(torch, o, l, q0, k0, v0, slices)
                c["slice_o"], c["slice_lse"] = eo, el
                c["ok"] = bad == 0 and eo <= REL_L2_TOL and el <= LSE_TOL and c.get(
                    "rel_l2_vs_cudnn", 0.0) <= REL_L2_TOL
                notes.append("slices vs FP32: O %.2e, LSE %.2e %s" % (
                    eo, el, "ok" if eo <= REL_L2_TOL and el <= LSE_TOL else "FAIL"))
                row["check"][st.label] = "; ".join(notes)
                checks[("ours", st.label)] = c
                if c["ok"]:
                    passed.append((st, (o, l)))
                timers[("ours", st.label)] = [st.call(a) for a in attns]
            except Exception as e:  # noqa: BLE001
                row["ours"][st.label] = None
                log("  %-28s failed: %s" % (st.label, e))
        ref_st, ref_out = pick_reference(passed, sa.SA_ROLE_DEFAULT_DENSE if sa else 0)
        ref = (ref_st.label, ref_out[0], ref_out[1]) if ref_st else None
        for key, (po, pl) in peer_out.items():
            try:
                c, text = peer_check(torch, po, pl, ref, q0, k0, v0, slices)
            except Exception as e:  # noqa: BLE001
                c, text = {"ok": False}, "check failed: %s" % first_line(e)
            c.update(checks[("peer", key)])
            checks[("peer", key)] = c
            row["check"]["peer " + key] = text
            log("  %-28s check (first call %.2f s): %s" % (key, c["first_call_s"], text))
        del peer_out
        rounds, info = {}, {}
        try:
            times = time_interleaved(torch, timers, args.warmup, args.reps, args.rounds,
                                     args.warmup_s, rounds, args.settle_s, info)
        except Exception as e:  # noqa: BLE001
            times = {}
            log("  timing failed: %s" % e)
        # Paired: our rate over cuDNN's (and FA4's) within each round, at the same clock.
        for peer in ("cudnn", "fa4"):
            peer_rounds = rounds.get(("peer", peer))
            for (side, key), ours in rounds.items():
                if side != "ours" or not peer_rounds or len(ours) != len(peer_rounds):
                    continue
                rs = sorted(c / o for o, c in zip(ours, peer_rounds) if o > 0)
                if rs:
                    row["paired"].setdefault(peer, {})[key] = (statistics.median(rs), rs[0],
                                                               rs[-1], len(rs))
        for (side, key), (ms, spread) in times.items():
            tf = flops / (ms * 1e9)
            row[side][key] = tf
            inf = info.get((side, key), {})
            log("  %-28s %8.3f ms %7.1f TFLOP/s (%s)%s"
                % (key, ms, tf, timing_note(spread, inf),
                   " | " + row["check"][key] if side == "ours" else ""))
            paired = {p: row["paired"][p][key] for p in row["paired"] if key in row["paired"][p]}
            for p, (m, lo, hi, n) in paired.items():
                log("  %-28s ours/%s per round: median %.3f, range %.3f-%.3f, above 1 in %d of "
                    "%d rounds" % (key, p, m, lo, hi, sum(r >= 1.0 for r in rounds_ratio(
                        rounds, key, p)), n))
            config = {"peer": key, "label": PEER_LABEL.get(key, key)} if side == "peer" else {
                "stage": key}
            add_record(summary, "dense", shape, None, key, side, config, flops, (ms, spread), inf,
                       checks.get((side, key)), paired={p: {"median": m, "min": lo, "max": hi,
                                                            "rounds": n}
                                                        for p, (m, lo, hi, n) in paired.items()})
        if verdict is not None:
            rc = verdict.read(torch.cuda.current_stream().cuda_stream)
            row["check"]["verdict"] = "SA_OK" if rc == 0 else sa.strerror(rc)
            log("  all-blocks verdict after timing: %s" % row["check"]["verdict"])
        for side, key in timers:
            row[side].setdefault(key, None)
        summary["dense"].append(row)
        del sets
        torch.cuda.empty_cache()


def rounds_ratio(rounds, key, peer):
    ours, theirs = rounds.get(("ours", key), []), rounds.get(("peer", peer), [])
    return [c / o for o, c in zip(ours, theirs) if o > 0]


# ---------------------------------------------------------------- sparse
def block_mask_from_lists(torch, lists, skv, q_blocks=False):
    """FlexAttention BlockMask whose full blocks are exactly our lists (no partial blocks).
    q_blocks: also the Q-major block tables that Flex's backward needs (bench/backward.py)."""
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
    if q_blocks:
        return BlockMask.from_kv_blocks(part_num, part_idx, **kw)
    try:
        return BlockMask.from_kv_blocks(part_num, part_idx, compute_q_blocks=False, **kw)
    except TypeError:  # older signature without compute_q_blocks
        return BlockMask.from_kv_blocks(part_num, part_idx, **kw)


def selected_keys(torch, lists_row, skv):
    return torch.cat([torch.arange(int(b) * TILE, min(int(b) * TILE + TILE, skv), device="cuda")
                      for b in lists_row.tolist()])


def best(values):
    values = [v for v in values if v]
    return max(values) if values else None


# Our three ways of calling a sparse stage: (timer side, validate, with a verdict, label).
OUR_MODES = [("val", 1, False, "validation on (synchronous)"),
             ("vval", 1, True, "validation on (device verdict)"),
             ("noval", 0, False, "validation off")]


def sparse_peer_configs(torch, args, fa4, bsa, sets, lists_cpu, Hq, skv):
    """[(name, config, [call per input set])] of the FA4 and cuDNN BSA runs asked for."""
    out = []
    if fa4 is not None:
        fwd, BST = fa4
        whole_blocks(skv, TILE)
        sets_bshd = [bshd(s) for s in sets]
        metas = [tuple(x.cuda() for x in fa4_sparse_metadata(l, None, torch)) for l in lists_cpu]
        bsts = [BST(mask_block_cnt=m[0], mask_block_idx=m[1], full_block_cnt=m[2],
                    full_block_idx=m[3], block_size=(TILE, TILE)) for m in metas]
        for pk in args.fa4_pack_gqa.split(","):
            on = pk == "on"
            out.append(("fa4 block-sparse pack_gqa %s" % pk,
                        {"peer": "fa4", "pack_gqa": on, "block_size": [TILE, TILE],
                         "layout": "bshd", "blocks_as": "full", "metadata_heads":
                         int(lists_cpu[0].shape[1])},
                        [fa4_call(torch, fwd, qkv, block_sparse=b, pack_gqa=on)
                         for qkv, b in zip(sets_bshd, bsts)]))
    if bsa is not None:
        for bs in (int(b) for b in args.bsa_blocks.split(",")):
            whole_blocks(skv, bs)
            meta = [bsa_metadata(l, None, Hq, bs, torch) for l in lists_cpu]
            meta = [(i.cuda(), None if n is None else n.cuda()) for i, n in meta]
            out.append(("cudnn bsa %d" % bs,
                        {"peer": "bsa", "sparse_block_size": bs, "layout": "bhsd",
                         "metadata": "per query head", "blocks_per_q_block":
                         int(meta[0][0].shape[-1]), "q2k_block_nums": meta[0][1] is not None},
                        [bsa_call(bsa, q, k, v, i, n, bs) for (q, k, v), (i, n) in
                         zip(sets, meta)]))
    return out


def run_sparse(torch, F, sa, args, gemm, copy, summary):
    """sa: the sparseattn package (import_sparseattn): the registry, verdicts, lists."""
    all_stages = [OurStage(torch, sa, s) for s in sa.stages() if wanted_stage(args, s)]
    sparse = [s for s in all_stages if s.st.sparse]
    dense = [s for s in all_stages if not s.st.sparse]
    if not sparse:
        log("sparse: no sparse stage in the registry: ours n/a (the dense baseline and the "
            "peers still run)")
    want = set(args.peers.split(","))
    flex = fa4 = bsa = None
    if "flex" in want and "sparse" in args.flex_modes.split(","):
        try:
            from torch.nn.attention.flex_attention import flex_attention
            flex = torch.compile(flex_attention, dynamic=False)
        except Exception as e:  # noqa: BLE001
            log("sparse: Flex n/a: %s" % e)
            summary["unavailable"]["sparse flex"] = first_line(e)
    for key, loader, what in (("fa4", load_fa4, "FA4 block-sparse (flash_attn.cute)"),
                              ("bsa", load_bsa, "cuDNN BSA (cudnn.BSA)")):
        if key not in want:
            log("sparse: %s n/a: not asked for (--peers)" % what)
            continue
        try:
            if key == "fa4":
                fa4 = loader()
            else:
                bsa = loader()
        except Exception as e:  # noqa: BLE001 - any import problem: n/a with the reason
            log("sparse: %s n/a: %s" % (what, first_line(e)))
            summary["unavailable"]["sparse " + key] = first_line(e)
    verdict = None
    if any(s.has_role(sa.SA_ROLE_GPU_VERDICT) for s in sparse):
        try:
            verdict = sa.Verdict()
        except Exception as e:  # noqa: BLE001
            log("sparse: no verdict (%s): the verdict path is not timed" % e)
    for st in sparse:
        log("sparse: %s roles 0x%x" % (st.label, st.roles))
    stream = torch.cuda.current_stream().cuda_stream
    B, Hq, Hkv, Sq, D, K = SPARSE_B, SPARSE_HQ, SPARSE_HKV, SPARSE_SQ, SPARSE_D, SPARSE_K
    tiles = Sq // TILE
    try:
        for skv in SPARSE_LEN_KV:
            if over_budget(args, "sparse len_kv %d" % skv):
                continue
            run_sparse_len(torch, sa, args, gemm, copy, summary, sparse, dense, flex, fa4, bsa,
                           verdict, stream, B, Hq, Hkv, Sq, D, K, tiles, skv)
            torch.cuda.empty_cache()
    finally:
        if verdict is not None:
            torch.cuda.synchronize()
            verdict.close()


def run_sparse_len(torch, sa, args, gemm, copy, summary, sparse, dense, flex, fa4, bsa, verdict,
                   stream, B, Hq, Hkv, Sq, D, K, tiles, skv):
    set_bytes = 2 * B * Hq * Sq * D * 2 + 2 * B * Hkv * skv * D * 2
    nsets = sets_needed(torch, set_bytes)
    sets = make_inputs(torch, (B, Hq, Sq, D), Hkv, skv, args.seed + skv, nsets)
    log("sparse len_kv=%d: %d input sets" % (skv, nsets))
    shape = {"B": B, "Hq": Hq, "Hkv": Hkv, "Sq": Sq, "Skv": skv, "D": D, "K": K,
             "block": TILE, "list_heads": Hkv, "causal": False}
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
        lists_cpu = []
        for i in range(nsets):
            arr = sa._gpu.random_tile_lists((B, Hq, Hkv, Sq, skv, D), Hkv, K, pat_id,
                                            args.seed * 31 + skv + pat_id * 7 + i)
            # through bytes, not torch.from_numpy: no dependence on torch's numpy bridge
            lists_cpu.append(torch.frombuffer(bytearray(arr.tobytes()), dtype=torch.int32)
                             .reshape(arr.shape))
        lists = [l.cuda() for l in lists_cpu]
        useful = 4.0 * B * Hq * Sq * K * TILE * D  # every block is full (len_kv % 128 == 0)
        kv_bytes = sum(2 * 2 * torch.unique(l[b]).numel() * TILE * D
                       for l in lists for b in range(B)) / nsets
        nbytes = 2 * B * Hq * Sq * D * 2 + B * Hq * Sq * 4 + kv_bytes + lists[0].numel() * 4
        row = {"skv": skv, "pattern": pat, "ours": {}, "peers": {}, "flex": None, "check": {},
               "dense": None, "floor_tf": useful / (floor_ms(useful, nbytes, gemm, copy) * 1e9)}
        q0, k0, v0 = sets[0]
        t = tiles // 2
        sl = [(b, h, t * TILE, t * TILE + TILE,
               selected_keys(torch, lists[0][b, h // (Hq // Hkv), t], skv))
              for b, h in ((0, 0), (B - 1, Hq - 1))]
        timers = dict(dense_timers)
        checks = {}
        configs = {}
        # Ours first: the peers are compared with our reference stage's output.
        passed, ours_o = [], {}
        for st in sparse:
            try:
                modes = [m for m in OUR_MODES if not m[2] or (
                    verdict is not None and st.has_role(sa.SA_ROLE_GPU_VERDICT))]
                outs = [(torch.empty_like(q), torch.empty(B, Hq, Sq, device="cuda",
                                                          dtype=torch.float32))
                        for q, _, _ in sets]
                attns = {side: [st.attn(q, k, v, o, l, lists=li, validate=val,
                                        verdict=verdict if vd else None)
                                for (q, k, v), (o, l), li in zip(sets, outs, lists)]
                         for side, val, vd, _ in modes}
                why = st.check(attns["val"][0])
                if why:
                    row["ours"][st.label] = None
                    log("  %-11s %-22s skipped: %s" % (pat, st.label, why))
                    continue
                o, l = outs[0]
                o.fill_(float("nan"))
                l.fill_(float("nan"))
                st.call(attns["val"][0])()
                torch.cuda.synchronize()
                bad = nonfinite(torch, o, l)
                eo, el = check_slices(torch, o, l, q0, k0, v0, sl)
                c = {"nonfinite": bad, "slice_o": eo, "slice_lse": el,
                     "ok": bad == 0 and eo <= REL_L2_TOL and el <= LSE_TOL}
                notes = ["%d outputs NaN/inf%s" % (bad, " FAIL" if bad else ""),
                         "slice vs FP32: O %.2e, LSE %.2e %s" % (
                             eo, el, "ok" if eo <= REL_L2_TOL and el <= LSE_TOL else "FAIL")]
                if "vval" in attns:
                    # The verdict path: same output, code SA_OK recorded, no host wait.
                    o_sync = o.clone()
                    o.fill_(float("nan"))
                    st.call(attns["vval"][0])()
                    code = verdict.read(stream)
                    ev = rel_l2(torch, o, o_sync)
                    c["verdict_code"], c["verdict_vs_sync"] = code, ev
                    vok = code == 0 and ev <= REL_L2_TOL
                    c["ok"] = c["ok"] and vok
                    notes.append("verdict path: code %d (%s), O vs synchronous %.1e %s"
                                 % (code, sa.strerror(code), ev, "ok" if vok else "FAIL"))
                    del o_sync
                row["check"][st.label] = notes
                checks[st.label] = c
                ours_o[st.label] = (o, l)
                if c["ok"]:
                    passed.append((st, (o, l)))
                for side, _, _, _ in modes:
                    timers[(side, st.label)] = [st.call(a) for a in attns[side]]
            except Exception as e:  # noqa: BLE001
                row["ours"][st.label] = None
                log("  %-11s %-22s failed: %s" % (pat, st.label, e))
        ref_st, ref_out = pick_reference(passed, sa.SA_ROLE_DEFAULT_TILE)
        ref = (ref_st.label, ref_out[0], ref_out[1]) if ref_st else None
        for label, (o, l) in ours_o.items():
            if ref and label != ref[0]:
                e = rel_l2(torch, o, ref[1])
                checks[label]["rel_l2_vs_ours"], checks[label]["ours_ref"] = e, ref[0]
                row["check"][label].append("O vs %s %.2e" % (short(ref[0]), e))
        # FlexAttention with the same blocks as a BlockMask.
        if flex is not None:
            try:
                masks = [block_mask_from_lists(torch, l, skv) for l in lists]
                t0 = time.time()
                flex_o = flex(q0, k0, v0, block_mask=masks[0], enable_gqa=True)
                torch.cuda.synchronize()
                first = time.time() - t0
                timers[("flex", "flex")] = [
                    lambda s=s, m=m: flex(*s, block_mask=m, enable_gqa=True)
                    for s, m in zip(sets, masks)]
                c, text = peer_check(torch, flex_o, None, ref, q0, k0, v0, sl)
                c["first_call_s"] = first
                checks["flex"] = c
                configs["flex"] = {"peer": "flex", "block_mask": "full blocks", "BLOCK_SIZE": TILE}
                log("  %-11s flex check: %s" % (pat, text))
                for label, (o, l) in ours_o.items():
                    e = rel_l2(torch, o, flex_o)
                    checks[label]["rel_l2_vs_flex"] = e
                    row["check"][label].append("O vs Flex %.2e %s" % (
                        e, "ok" if e <= REL_L2_TOL else "FAIL"))
                del flex_o
            except Exception as e:  # noqa: BLE001
                log("  %-11s flex n/a: %s" % (pat, first_line(e)))
        # FA4 and cuDNN BSA: the first call of a configuration compiles it (CuTe DSL JIT).
        try:
            peer_cfgs = sparse_peer_configs(torch, args, fa4, bsa, sets, lists_cpu, Hq, skv)
        except Exception as e:  # noqa: BLE001
            peer_cfgs = []
            log("  %-11s FA4/BSA metadata failed: %s" % (pat, first_line(e)))
        for name, config, calls in peer_cfgs:
            try:
                t0 = time.time()
                po, pl = calls[0]()
                torch.cuda.synchronize()
                first = time.time() - t0
                c, text = peer_check(torch, po, pl, ref, q0, k0, v0, sl)
                c["first_call_s"] = first
                checks[name] = c
                configs[name] = config
                timers[("peer", name)] = calls
                log("  %-11s %-30s check (first call %.2f s): %s" % (pat, name, first, text))
                del po, pl
            except Exception as e:  # noqa: BLE001
                row["peers"][name] = None
                log("  %-11s %-30s n/a: %s" % (pat, name, first_line(e)))
                add_record(summary, "sparse", shape, pat, name, "peer", config, useful, None,
                           None, None, status="failed", reason=first_line(e))
        info = {}
        try:
            times = time_interleaved(torch, timers, args.warmup, args.reps, args.rounds,
                                     args.warmup_s, None, args.settle_s, info)
        except Exception as e:  # noqa: BLE001
            times = {}
            log("  %-11s timing failed: %s" % (pat, e))
        if verdict is not None:
            code = verdict.read(stream)
            log("  %-11s verdict after the timed calls: %d (%s)%s"
                % (pat, code, sa.strerror(code), "" if code == 0 else " FAIL"))
        dense_tf = {}
        for (side, key), (ms, spread) in sorted(times.items()):
            inf = info.get((side, key), {})
            if side == "dense":
                dense_tf[key] = 4.0 * B * Hq * Sq * skv * D / (ms * 1e9)
                log("  %-11s dense %-24s %8.3f ms %7.1f TFLOP/s (%s)"
                    % (pat, key, ms, dense_tf[key], timing_note(spread, inf)))
                add_record(summary, "sparse", shape, pat, key, "dense", {"stage": key,
                           "note": "dense baseline at the same len_kv"},
                           4.0 * B * Hq * Sq * skv * D, (ms, spread), inf, None)
            elif side in ("flex", "peer"):
                tf = useful / (ms * 1e9)
                if side == "flex":
                    row["flex"] = tf
                else:
                    row["peers"][key] = tf
                log("  %-11s %-30s %8.3f ms useful %7.1f TFLOP/s (%s)"
                    % (pat, key, ms, tf, timing_note(spread, inf)))
                add_record(summary, "sparse", shape, pat, key, "peer", configs.get(key, {}),
                           useful, (ms, spread), inf, checks.get(key))
        best_dense = max(dense_tf.items(), key=lambda kv: kv[1]) if dense_tf else None
        row["dense"] = best_dense
        fa4_best = best(v for k, v in row["peers"].items() if k.startswith("fa4"))
        bsa_best = best(v for k, v in row["peers"].items() if k.startswith("cudnn"))
        for st in sparse:
            got = {side: times[(side, st.label)] for side, _, _, _ in OUR_MODES
                   if (side, st.label) in times}
            if "val" not in got or "noval" not in got:
                row["ours"].setdefault(st.label, None)
                continue
            tf = {side: useful / (ms * 1e9) for side, (ms, _) in got.items()}
            row["ours"][st.label] = tf
            on = tf.get("vval", tf["val"])
            parts = []
            for side, _, _, what in OUR_MODES:
                if side in got:
                    inf = info.get((side, st.label), {})
                    parts.append("%s %.3f ms %.1f (%s)" % (what, got[side][0], tf[side],
                                                          timing_note(got[side][1], inf)))
                    add_record(summary, "sparse", shape, pat, "%s, %s" % (st.label, what),
                               "ours", {"stage": st.label, "stage_id": st.id, "roles": st.roles,
                                        "validate": side != "noval",
                                        "verdict": side == "vval"},
                               useful, got[side], inf, checks.get(st.label))
            log("  %-11s %-22s useful TFLOP/s: %s" % (pat, st.label, "; ".join(parts)))
            log("  %-11s %-22s on/flex %s, on/FA4 best %s, on/BSA best %s, on/dense %s | %s"
                % (pat, "", fmt(ratio(on, row["flex"]), ".2f"), fmt(ratio(on, fa4_best), ".2f"),
                   fmt(ratio(on, bsa_best), ".2f"),
                   fmt(ratio(on, best_dense[1] if best_dense else None), ".2f"),
                   "; ".join(row["check"].get(st.label, []))))
        summary["sparse"].append(row)
    del sets


# ---------------------------------------------------------------- summary
def short(label):
    """'stage 14 dense_persistent' -> '#14'; other labels as they are."""
    parts = label.split()
    return "#" + parts[1] if len(parts) > 1 and parts[0] == "stage" else label


def print_summary(summary, gemm, copy, device):
    log("")
    log("==== peers summary: %s; GEMM %s TFLOP/s, copy %s TB/s (measured in this run) ===="
        % (device, fmt(gemm), fmt(copy / 1e12 if copy else None, ".2f")))
    if summary["dense"]:
        log("dense (B,H,S,D)  TFLOP/s: %-12s %7s %7s %7s %7s %7s | ours/cudnn ours/flash ours/flex "
            "ours/fa4" % ("ours", "cudnn", "flash", "flex", "fa4", "bound"))
        for r in summary["dense"]:
            p = r["peer"]
            for label, tf in (r["ours"] or {"ours": None}).items():
                log("%-25s %-12s %7s %7s %7s %7s %7s | %10s %10s %9s %8s"
                    % (r["shape"], "%s %s" % (short(label), fmt(tf)), fmt(p.get("cudnn")),
                       fmt(p.get("flash")), fmt(p.get("flex")), fmt(p.get("fa4")),
                       fmt(r["floor_tf"]),
                       fmt(ratio(tf, p.get("cudnn")), ".2f"), fmt(ratio(tf, p.get("flash")), ".2f"),
                       fmt(ratio(tf, p.get("flex")), ".2f"), fmt(ratio(tf, p.get("fa4")), ".2f")))
                for peer, by_label in sorted(r.get("paired", {}).items()):
                    if label in by_label:
                        m, lo, hi, n = by_label[label]
                        log("%-25s ours/%s per round: median %.3f (%.3f-%.3f, %d rounds)"
                            % ("", peer, m, lo, hi, n))
                if label in r["check"]:
                    log("%-25s check: %s" % ("", r["check"][label]))
            for key in sorted(p):
                if "peer " + key in r["check"]:
                    log("%-25s %s check: %s" % ("", key, r["check"]["peer " + key]))
    if summary["dense"] and not summary["sparse"]:
        log("bound: the rate at the floor, FLOPs / max(FLOPs / GEMM rate, bytes / copy bandwidth)")
    if summary["sparse"]:
        log("sparse len_kv pattern   useful TFLOP/s: %-27s %11s %11s %6s %6s %6s | on/fa4 on/bsa "
            "on/flex on/dense" % ("ours on sync/verdict/off", "fa4 pk/nopk", "bsa 128/64",
                                  "flex", "dense", "bound"))
        for r in summary["sparse"]:
            d = r["dense"][1] if r["dense"] else None
            pe = r["peers"]
            fa4 = "%s/%s" % (fmt(pe.get("fa4 block-sparse pack_gqa on"), ".0f"),
                             fmt(pe.get("fa4 block-sparse pack_gqa off"), ".0f"))
            bsa = "%s/%s" % (fmt(pe.get("cudnn bsa 128"), ".0f"),
                             fmt(pe.get("cudnn bsa 64"), ".0f"))
            fa4_best = best(v for k, v in pe.items() if k.startswith("fa4"))
            bsa_best = best(v for k, v in pe.items() if k.startswith("cudnn"))
            for label, tf in (r["ours"] or {"ours": None}).items():
                tf = tf or {}
                on = tf.get("vval", tf.get("val"))
                mine = "%s %s/%s/%s" % (short(label), fmt(tf.get("val"), ".0f"),
                                        fmt(tf.get("vval"), ".0f"), fmt(tf.get("noval"), ".0f"))
                log("%-6d %-11s %-27s %11s %11s %6s %6s %6s | %6s %6s %7s %8s"
                    % (r["skv"], r["pattern"], mine, fa4, bsa, fmt(r["flex"], ".0f"),
                       fmt(d, ".0f"), fmt(r["floor_tf"], ".0f"), fmt(ratio(on, fa4_best), ".2f"),
                       fmt(ratio(on, bsa_best), ".2f"), fmt(ratio(on, r["flex"]), ".2f"),
                       fmt(ratio(on, d), ".2f")))
                if label in r["check"]:
                    log("%-18s check: %s" % ("", "; ".join(r["check"][label])))
        names = sorted({r["dense"][0] for r in summary["sparse"] if r["dense"]})
        log("ours on: validation on through the device verdict where the stage has one, else "
            "synchronous; on/fa4 and on/bsa: against the best configuration of each")
        log("bound: the rate at the floor, FLOPs / max(FLOPs / GEMM rate, bytes / copy bandwidth)")
        log("dense column: best dense stage at the same len_kv (%s)" % (", ".join(names) or "none"))


# ---------------------------------------------------------------- self-test (no GPU, no torch)
SAMPLE_SHAPES_H = """/* a sample of shapes.h's forms: #define SA_IN_A_COMMENT 1 is no define */
#pragma once
#define SA_BENCH_SPARSE_B 2 // a line comment
#define SA_BENCH_SPARSE_HQ 0x10
 #  define SA_BENCH_SPARSE_HKV 1u
#define SA_BENCH_SPARSE_SQ 4096
#define SA_BENCH_SPARSE_D 128
#define SA_BENCH_SPARSE_K 16
#define SA_BENCH_SPARSE_LEN_KV {4096, 8192, \\
                                16384}
#define SA_BENCH_DENSE_SHAPES {{8, 16, 4096, 128}, /* a comment */ {4, 16, 8192, 128},}
#define SA_BENCH_REL_L2_TOL 1e-2
#define SA_BENCH_LSE_TOL .01f
#define SA_BENCH_FN(x) (x)
#define SA_BENCH_EXPR (1 << 4)
#define SA_BENCH_FLAG
"""
# What bench/shapes.h holds: the study's shapes as this file's docstring and
# docs/benchmarks.md describe them (a change of shapes.h changes them too).
STUDY_SHAPES = {"DENSE_SHAPES": [(8, 16, 4096, 128), (4, 16, 8192, 128), (2, 16, 16384, 128)],
                "SPARSE_B": 2, "SPARSE_HQ": 16, "SPARSE_HKV": 1, "SPARSE_SQ": 4096,
                "SPARSE_D": 128, "SPARSE_K": 16, "SPARSE_LEN_KV": [4096, 8192, 16384],
                "REL_L2_TOL": 1e-2, "LSE_TOL": 1e-2}


def self_test(lib_path=None):
    """Checks of the parts that need no GPU: the shapes.h parser (a sample and the real file),
    the list conversions (with numpy, or torch on the CPU) and the argument parsing; with a
    library (any build: the registry and the list generator run without a GPU) also the
    sparseattn package over it (its import checks the ABI against its struct mirror), the
    registry and the lists it draws."""
    try:
        import numpy as xp
    except ImportError:
        try:
            import torch as xp
        except ImportError:
            xp = None
    results = []

    def check(name, cond):
        results.append(bool(cond))
        log("self-test %-58s %s" % (name, "ok" if cond else "FAIL"))

    def tolist(a):
        return a.tolist()

    cs = ClockSampler()
    cs.samples = [(1.0, 1700.0, 600.0), (2.0, 1800.0, 700.0), (3.0, 1500.0, 650.0),
                  (4.5, 1000.0, 100.0)]
    check("ClockSampler.mean: only the samples inside the windows",
          cs.mean([(0.5, 2.5)]) == (1750.0, 650.0, 2) and cs.mean([(2.5, 3.5), (4.0, 5.0)])
          == (1250.0, 375.0, 2) and cs.mean([(5.0, 6.0)]) == (None, None, 0))
    d = parse_defines(SAMPLE_SHAPES_H)
    check("parse_defines: numbers, hex, suffixes, brace lists, comments", d == {
        "SA_BENCH_SPARSE_B": 2, "SA_BENCH_SPARSE_HQ": 16, "SA_BENCH_SPARSE_HKV": 1,
        "SA_BENCH_SPARSE_SQ": 4096, "SA_BENCH_SPARSE_D": 128, "SA_BENCH_SPARSE_K": 16,
        "SA_BENCH_SPARSE_LEN_KV": (4096, 8192, 16384),
        "SA_BENCH_DENSE_SHAPES": ((8, 16, 4096, 128), (4, 16, 8192, 128)),
        "SA_BENCH_REL_L2_TOL": 0.01, "SA_BENCH_LSE_TOL": 0.01})
    check("parse_define_value: malformed values are None",
          all(parse_define_value(t) is None for t in ("{1, 2", "{1 2}", "1 2", "}", "(1)", "",
                                                      "\"s\"", "1f", "{1,, 2}"))
          and parse_define_value("010") == 8 and parse_define_value("-3") == -3
          and parse_define_value("{}") == ())
    sample = bench_shapes(SAMPLE_SHAPES_H, "sample")
    check("bench_shapes: the sample's shapes and tolerances",
          sample["DENSE_SHAPES"] == [(8, 16, 4096, 128), (4, 16, 8192, 128)]
          and sample["SPARSE_LEN_KV"] == [4096, 8192, 16384] and sample["SPARSE_HQ"] == 16
          and sample["LSE_TOL"] == 0.01 and isinstance(sample["REL_L2_TOL"], float))
    for what, text in (("a missing define", SAMPLE_SHAPES_H.replace("SA_BENCH_LSE_TOL", "X")),
                       ("a 3-element dense shape", SAMPLE_SHAPES_H.replace("{8, 16, 4096, 128}",
                                                                           "{8, 16, 4096}")),
                       ("a zero head count", SAMPLE_SHAPES_H.replace("0x10", "0"))):
        try:
            bench_shapes(text, "sample")
            ok = False
        except ValueError:
            ok = True
        check("bench_shapes rejects %s" % what, ok)
    real = read_bench_shapes()
    check("bench/shapes.h gives the study's shapes and tolerances", real == STUDY_SHAPES)
    a = parse_args(["--lib", "x.so"])
    check("parse_args: defaults", a.peers == ",".join(PEER_NAMES) and a.fa4_pack_gqa == "on,off"
          and a.bsa_blocks == "128,64" and a.json is None and a.mode == "all")
    a = parse_args(["--lib", "x.so", "--mode", "sparse", "--peers", "fa4,bsa", "--json", "-",
                    "--bsa-blocks", "64", "--fa4-pack-gqa", "on"])
    check("parse_args: sparse, two peers, --json -", a.mode == "sparse" and a.json == "-"
          and a.peers == "fa4,bsa" and a.bsa_blocks == "64" and a.fa4_pack_gqa == "on")
    a = parse_args(["--lib", "x.so", "--peers", "none"])
    check("parse_args: --peers none", a.peers == "")
    a = parse_args(["--lib", "x.so", "--peers", "fa4,,bsa,fa4,"])
    check("parse_args: --peers skips empty and repeated names", a.peers == "fa4,bsa")
    for bad in (["--lib", "x", "--peers", "fa5"], ["--lib", "x", "--bsa-blocks", "32"],
                ["--lib", "x", "--fa4-pack-gqa", "auto"], []):
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # argparse's usage lines
                parse_args(bad)
            ok = False
        except SystemExit:
            ok = True
        check("parse_args rejects %s" % (" ".join(bad[2:]) or "a missing --lib"), ok)
    check("sleep_ms_for: floor, margin, cap", sleep_ms_for(10, 0.0) == SLEEP_MIN_MS
          and abs(sleep_ms_for(10, 0.05) - (SLEEP_MIN_MS + SLEEP_MARGIN * 0.5)) < 1e-12
          and sleep_ms_for(10 ** 6, 1.0) == SLEEP_MAX_MS)
    check("clean: NaN and inf become null",
          json.dumps(clean({"a": float("nan"), "b": (1.0, float("inf"))})) ==
          '{"a": null, "b": [1.0, null]}')
    try:
        whole_blocks(4096 + 64, 128)
        ok = False
    except ValueError:
        ok = True
    check("whole_blocks rejects a partial final block", ok)
    if lib_path:
        sa = import_sparseattn(lib_path)  # ImportError: the caller says why and fails
        check("sparseattn package loads %s, ABI checked" % os.path.basename(sa.library_path),
              {"sa_shape", "sa_tile_lists", "sa_gpu_attn", "sa_stage"} <= set(sa.abi_sizes))
        a = sa._gpu.gpu_attn_default()
        check("gpu_attn_default: validate, empty rows; NULLs, not causal",
              a.validate == 1 and a.allow_empty_rows == 1 and not a.verdict and not a.q
              and not a.stream and a.causal == 0 and a.allow_future_blocks == 0)
        st = sa.stages()
        if not st:
            log("self-test: %s has no GPU stages (built without CUDA): registry checks skipped"
                % sa.library_path)
        else:
            check("registry: %d stages, roles and names readable" % len(st),
                  all(s.name and isinstance(s.roles, int) for s in st))
            check("registry: a default tile-list and a default dense stage",
                  any(s.default_tile and s.sparse for s in st)
                  and any(s.default_dense and not s.sparse for s in st))
            check("stage_table: id, name, sparse, roles of each stage",
                  sa._gpu.stage_table() == [{"id": s.id, "name": s.name, "sparse": s.sparse,
                                             "roles": s.roles} for s in st])
        for pat_id, pat in PATTERNS:
            arr = sa._gpu.random_tile_lists((SPARSE_B, SPARSE_HQ, SPARSE_HKV, SPARSE_SQ, 8192,
                                             SPARSE_D), SPARSE_HKV, SPARSE_K, pat_id, 7)
            rows = arr.reshape(-1, SPARSE_K).tolist()
            ok = arr.shape == (SPARSE_B, SPARSE_HKV, SPARSE_SQ // TILE, SPARSE_K) and all(
                r == sorted(set(r)) and len(r) == SPARSE_K and 0 <= r[0] and r[-1] < 8192 // TILE
                for r in rows)
            if pat_id == 1:
                ok = ok and all(rows[i] == rows[i + 1] for i in range(0, len(rows), 2))
            check("sa_random_tile_lists %s: sorted distinct rows in range" % pat, ok)
    if xp is None:
        log("self-test: neither numpy nor torch: the list conversions are not checked")
        return results
    B, LH, Hq, T, K, nkv = 2, 2, 8, 3, 4, 16
    rows = []
    for b in range(B):
        for lh in range(LH):
            for t in range(T):
                rows.append(sorted({(7 * b + 5 * lh + 3 * t + 11 * i) % nkv for i in range(K)}))
    check("test lists: distinct sorted rows", all(len(r) == K for r in rows))
    lists = xp.asarray(rows, dtype=xp.int32).reshape(B, LH, T, K)
    counts = xp.asarray([[[4, 0, 2], [1, 3, 4]], [[2, 2, 2], [0, 4, 1]]], dtype=xp.int32)
    L = tolist(lists)
    g = Hq // LH
    mc, mi, fc, fi = fa4_sparse_metadata(lists, None, xp)
    check("fa4 metadata: shapes (B,LH,T) (B,LH,T,1) (B,LH,T) (B,LH,T,K)",
          tuple(mc.shape) == (B, LH, T) and tuple(mi.shape) == (B, LH, T, 1)
          and tuple(fc.shape) == (B, LH, T) and tuple(fi.shape) == (B, LH, T, K))
    check("fa4 metadata: int32, mask counts 0, full counts K, full idx = lists",
          all(x.dtype == xp.int32 for x in (mc, mi, fc, fi)) and not any(
              v for v in tolist(mc.reshape(-1))) and set(tolist(fc.reshape(-1))) == {K}
          and tolist(fi) == L)
    _, _, fc2, _ = fa4_sparse_metadata(lists, counts, xp)
    check("fa4 metadata: variable counts pass through", tolist(fc2) == tolist(counts))
    idx, nums = bsa_metadata(lists, None, Hq, 128, xp)
    I = tolist(idx)
    check("bsa 128: (B, Hq, T, K) int32, fixed count (nums None)",
          tuple(idx.shape) == (B, Hq, T, K) and idx.dtype == xp.int32 and nums is None)
    check("bsa 128: head h holds list head h // (Hq / LH)",
          all(I[b][h][t] == L[b][h // g][t] for b in range(B) for h in range(Hq)
              for t in range(T)))
    idx, nums = bsa_metadata(lists, None, Hq, 64, xp)
    I, N = tolist(idx), tolist(nums)
    check("bsa 64: (B, Hq, 2T, 2K) int32 and nums (B, Hq, 2T) = 2K",
          tuple(idx.shape) == (B, Hq, 2 * T, 2 * K) and idx.dtype == xp.int32
          and tuple(nums.shape) == (B, Hq, 2 * T) and nums.dtype == xp.int32
          and set(tolist(nums.reshape(-1))) == {2 * K})
    check("bsa 64: row r of tile t holds 2b, 2b+1 of each b of tile t, ascending",
          all(I[b][h][r] == [2 * x + c for x in L[b][h // g][r // 2] for c in (0, 1)]
              for b in range(B) for h in range(Hq) for r in range(2 * T))
          and all(row == sorted(row) for bb in I for hh in bb for row in hh))
    same = True  # every query sees the same keys through the 128 and the 64 metadata
    for b in range(B):
        for h in range(Hq):
            for qr in range(0, T * TILE, 16):
                k128 = {x for blk in L[b][h // g][qr // TILE]
                        for x in range(blk * TILE, blk * TILE + TILE)}
                k64 = {x for blk in I[b][h][qr // 64] for x in range(blk * 64, blk * 64 + 64)}
                same = same and k128 == k64
    check("bsa 64: every query row covers the keys of its 128 list", same)
    idx, nums = bsa_metadata(lists, counts, Hq, 64, xp)
    C, N = tolist(counts), tolist(nums)
    check("bsa 64: variable counts doubled per Q block",
          all(N[b][h][r] == 2 * C[b][h // g][r // 2] for b in range(B) for h in range(Hq)
              for r in range(2 * T)))
    idx, nums = bsa_metadata(lists, counts, Hq, 128, xp)
    check("bsa 128: variable counts per query head",
          all(tolist(nums)[b][h][t] == C[b][h // g][t] for b in range(B) for h in range(Hq)
              for t in range(T)))
    try:
        bsa_metadata(lists, None, Hq, 32, xp)
        ok = False
    except ValueError:
        ok = True
    check("bsa: a block of 32 is refused", ok)
    return results


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", help="path to libsparseattn.so (a CUDA build); required")
    ap.add_argument("--mode", choices=["dense", "sparse", "all"], default="all")
    ap.add_argument("--peers", default=",".join(PEER_NAMES),
                    help="comma list of peers to run: cudnn (SDPA, cuDNN backend), flash (SDPA, "
                         "FlashAttention backend), flex (FlexAttention), fa4 (FlashAttention-4 "
                         "CuTe: dense, and block-sparse in the sparse mode), bsa (cuDNN "
                         "frontend block-sparse attention, sparse mode), or none (ours only)")
    ap.add_argument("--stages", default="",
                    help="comma list of our stage ids to run (default: every registered stage; "
                         "the dense mode's 'all blocks' row comes with the default tile stage)")
    ap.add_argument("--fa4-pack-gqa", default="on,off",
                    help="FA4 block-sparse runs: pack_gqa on, off, or on,off")
    ap.add_argument("--bsa-blocks", default="128,64",
                    help="cuDNN BSA sparse_block_size values: 128 and/or 64 (64: each of our "
                         "128-blocks split in two, each Q tile into two Q blocks)")
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
    ap.add_argument("--clocks", action="store_true",
                    help="sample the SM clock and board power with nvidia-smi while each "
                         "contender runs, and print each one's mean clock, power and TFLOP/s "
                         "per GHz (use with --settle-s: in short bursts a contender shares the "
                         "clock of the one before it)")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--budget-s", type=float, default=0,
                    help="skip the shapes not started after this many seconds (0: no limit)")
    ap.add_argument("--json", metavar="PATH",
                    help="also write the results as JSON to PATH ('-': stdout, after the "
                         "summary): one record per (mode, shape, pattern, contender)")
    ap.add_argument("--self-test", action="store_true",
                    help="check the shapes.h parser, the list conversions and the argument "
                         "parsing (no GPU, library or torch needed; with --lib also the "
                         "sparseattn package over that library) and exit")
    args = ap.parse_args(argv)
    args.peers = ",".join(peer_names(ap, args.peers, PEER_NAMES))  # "" for none
    if not args.fa4_pack_gqa or any(p not in ("on", "off") for p in args.fa4_pack_gqa.split(",")):
        ap.error("--fa4-pack-gqa takes on, off or on,off")
    if not args.bsa_blocks or any(b not in ("64", "128") for b in args.bsa_blocks.split(",")):
        ap.error("--bsa-blocks takes 128, 64 or 128,64")
    if not args.self_test and not args.lib:
        ap.error("--lib is required")
    try:
        args.stages = {int(x) for x in args.stages.split(",") if x.strip()}
    except ValueError:
        ap.error("--stages takes stage ids, e.g. 14,17")
    return args


def write_json(args, doc):
    text = json.dumps(clean(doc), indent=1, default=str)
    if args.json == "-":
        print(text, flush=True)
    else:
        with open(args.json, "w") as f:
            f.write(text + "\n")
        log("json: %d records written to %s" % (len(doc["records"]), args.json))


def main(argv=None):
    args = parse_args(argv)
    if args.self_test:
        try:
            res = self_test(args.lib)
        except (ImportError, OSError, RuntimeError) as e:
            log("self-test: cannot use %s: %s" % (args.lib, e))
            return 1
        log("self-test: %d passed, %d failed" % (sum(res), len(res) - sum(res)))
        return 0 if all(res) else 1
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
    sa = None
    stages = []
    try:
        sa = import_sparseattn(args.lib)
        if not sa.gpu_available():
            log("peers: libsparseattn says no usable GPU (built without CUDA?): ours n/a")
            sa = None
        else:
            stages = sa._gpu.stage_table()
            log("stages: " + ", ".join(
                "%d %s (%s, roles 0x%x)" % (s["id"], s["name"], "sparse" if s["sparse"]
                                            else "dense", s["roles"]) for s in stages))
    except (ImportError, OSError, RuntimeError) as e:  # no library, ABI mismatch, no numpy
        log("peers: cannot use %s through the sparseattn package (%s): ours n/a"
            % (args.lib, " ".join(str(e).split())))
    device = torch.cuda.get_device_name(0)
    versions = peer_versions()
    log("device %s, torch %s, cuDNN %s, seed %d, reps %d (median) in %d interleaved rounds, "
        "warm-up %d, %.1f s settling per contender and round"
        % (device, torch.__version__, torch.backends.cudnn.version(), args.seed, args.reps,
           args.rounds, args.warmup, args.settle_s))
    log("peer packages: " + ", ".join("%s %s" % (k, v or "absent") for k, v in versions.items()))
    summary = {"dense": [], "sparse": [], "records": [], "unavailable": {}}
    gemm = copy = None
    try:
        with clock_sampling(args.clocks):
            gemm, copy = measure_ceilings(torch, args)
            # Sparse first: with --budget-s, the block-sparse comparison is the one to keep.
            if args.mode in ("sparse", "all"):
                if sa is None:
                    log("sparse: needs libsparseattn (lists come from sa_random_tile_lists): "
                        "skipped")
                else:
                    run_sparse(torch, F, sa, args, gemm, copy, summary)
            if args.mode in ("dense", "all"):
                run_dense(torch, F, sa, args, gemm, copy, summary)
    except Exception:  # noqa: BLE001 - still print what was measured
        traceback.print_exc()
    log("peers: %.0f s" % (time.time() - T_START))
    print_summary(summary, gemm, copy, device)
    if args.json:
        try:
            cap = torch.cuda.get_device_capability(0)
            write_json(args, {
                "device": device, "capability": "%d.%d" % cap, "torch": torch.__version__,
                "cudnn_sdpa": torch.backends.cudnn.version(), "peer_versions": versions,
                "args": vars(args), "stages": stages, "unavailable": summary["unavailable"],
                "ceilings": {"gemm_tflops": gemm, "copy_bytes_per_s": copy},
                "sleep_cycles_per_ms": _SLEEP.get("cycles_per_ms"),
                "records": summary["records"]})
        except Exception:  # noqa: BLE001
            traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
