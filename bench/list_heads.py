#!/usr/bin/env python3
"""One tile list per query head (list_heads = Hq) against one per GQA group (list_heads = Hkv):
the same blocks per head, so the same FLOPs; does the GPU take them at the same rate?

The study's shape (B 2, 16 query heads on 1 KV head, D 128, 4096 queries), 16 distinct random
blocks of 128 per list row, the registry's default tile stage through the sparseattn package,
validation off. GPU time with CUDA events around --reps calls, --rounds interleaved rounds,
median; useful TFLOP/s = 4 B Hq Sq k 128^2 / time. docs/quality.md ("Per-head lists") has a run.

    SPARSEATTN_LIB=build/libsparseattn.so python3 bench/list_heads.py [--lens 4096,16384]

Without torch or a CUDA device it says so and exits 77 (the suites' code for a skipped test)."""
import argparse
import os
import sys

SKIP = 77


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lens", default="4096,16384", help="len_kv values, comma-separated")
    ap.add_argument("--reps", type=int, default=20, help="calls per timed window")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    try:
        lens = [int(x) for x in a.lens.split(",") if x]
    except ValueError:
        ap.error("--lens: integers, comma-separated")
    if not lens or any(n < 16 * 128 or n % 128 for n in lens) or a.reps < 1 or a.rounds < 1:
        ap.error("--lens: multiples of 128 of at least 2048; --reps and --rounds at least 1")
    try:
        import numpy as np
        import torch
    except ImportError as e:
        print("list_heads: needs numpy and torch (%s); skipped" % e)
        return SKIP
    if not torch.cuda.is_available():
        print("list_heads: no CUDA device; skipped")
        return SKIP
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import sparseattn as sa

    torch.manual_seed(a.seed)
    b, hq, hkv, sq, k = 2, 16, 1, 4096, 16
    for skv in lens:
        tiles, nb = sq // 128, skv // 128
        q = torch.randn(b, hq, sq, 128, device="cuda", dtype=torch.bfloat16)
        kk = torch.randn(b, hkv, skv, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(kk)

        def lists(heads):
            rows = [torch.randperm(nb)[:k] for _ in range(b * heads * tiles)]
            return torch.stack(rows).view(b, heads, tiles, k).to(torch.int32).cuda()

        cases = (("group", lists(hkv)), ("head", lists(hq)))
        for _, l in cases:  # warm-up
            sa.block_sparse_attention(q, kk, v, l, validate=False)
        torch.cuda.synchronize()
        times = {}
        for _ in range(a.rounds):
            for name, l in cases:
                e0 = torch.cuda.Event(enable_timing=True)
                e1 = torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(a.reps):
                    sa.block_sparse_attention(q, kk, v, l, validate=False)
                e1.record()
                torch.cuda.synchronize()
                times.setdefault(name, []).append(e0.elapsed_time(e1) / a.reps)
        flops = 4 * b * hq * sq * k * 128 * 128
        for name, ms in times.items():
            m = float(np.median(ms))
            print("len_kv %d, one list per %s: %.4f ms (rounds %s), %.0f useful TFLOP/s"
                  % (skv, name, m, " ".join("%.4f" % x for x in ms), flops / m / 1e9),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
