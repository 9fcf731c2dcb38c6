#!/usr/bin/env python3
"""FA4's forward launched a few times on one of our benchmark cases, for a profiler to capture.

    ncu --clock-control none -k regex:FlashAttention --launch-skip 3 -c 1 --set full -o R \\
        python3 bench/fa4_launches.py --case dense
    python3 scripts/ncu-loop-regions.py <(ncu --import R.ncu-rep --page source --csv \\
        --print-source sass)

--case dense: (8, 16, 4096, 128), the first shape of `bench dense`; --case sparse: the study's
shape at len_kv 8192 with independent random lists (16 distinct blocks per tile, drawn here;
every block a full block, pack_gqa on). FA4 comes from the peer site (../shared/peers/README.md). Nothing is timed or checked here:
bench/peers.py does that.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers as P  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", choices=("dense", "sparse"), default="dense")
    ap.add_argument("--calls", type=int, default=6, help="launches (default 6)")
    args = ap.parse_args(argv)
    import torch
    try:
        fwd, BST = P.load_fa4()
    except ImportError as e:
        print("fa4_launches: FA4 does not import (%s)" % P.first_line(e), file=sys.stderr)
        return 1
    if args.case == "dense":
        B, H, S, D = P.DENSE_SHAPES[0]
        qkv = P.make_inputs(torch, (B, H, S, D), H, S, 2026, 1)[0]
        call = P.fa4_call(torch, fwd, P.bshd(qkv))
    else:
        B, Hq, Hkv, Sq, D = P.SPARSE_B, P.SPARSE_HQ, P.SPARSE_HKV, P.SPARSE_SQ, P.SPARSE_D
        skv = 8192
        qkv = P.make_inputs(torch, (B, Hq, Sq, D), Hkv, skv, 2026, 1)[0]
        g = torch.Generator().manual_seed(2026)  # independent lists: K distinct blocks per tile
        T, nb = Sq // P.TILE, skv // P.TILE
        lists = torch.rand(B, Hkv, T, nb, generator=g).argsort(-1)[..., :P.SPARSE_K]
        lists = lists.sort(-1).values.to(torch.int32)
        m = [x.cuda() for x in P.fa4_sparse_metadata(lists, None, torch)]  # made on the CPU
        bst = BST(mask_block_cnt=m[0], mask_block_idx=m[1], full_block_cnt=m[2],
                  full_block_idx=m[3], block_size=(P.TILE, P.TILE))
        call = P.fa4_call(torch, fwd, P.bshd(qkv), block_sparse=bst, pack_gqa=True)
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()
    print("fa4_launches: %d calls of the %s case" % (args.calls, args.case))
    return 0


if __name__ == "__main__":
    sys.exit(main())
