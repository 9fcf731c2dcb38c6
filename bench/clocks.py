"""The default dense stage and cuDNN each run alone for a few seconds, SM clock and power sampled.

Usage (on the GPU machine, after a CUDA build):
    python3 bench/clocks.py --lib build-gpu/libsparseattn.so [--secs 2] [--alternations 2]

For each dense shape of bench/shapes.h (as bench/peers.py reads it), each contender (the
registry's default dense stage, through the sparseattn package on --lib, and cuDNN SDPA) runs
back to back for --secs seconds
(--alternations times, in turn), while `nvidia-smi -lms 50` samples clocks.sm and power.draw
(bench/peers.py's ClockSampler).
It prints the sustained TFLOP/s, the mean clock and power over each run (its first 0.3 s left
out) and the TFLOP/s per GHz: on a card at its power limit, a kernel's rate is its work per
clock times the clock it can hold, and the two can rank kernels differently.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers as P  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", required=True, help="path to libsparseattn.so (a CUDA build)")
    ap.add_argument("--secs", type=float, default=2.0, help="seconds per contender and run")
    ap.add_argument("--alternations", type=int, default=2)
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sa = P.import_sparseattn(args.lib)  # the struct mirror and ABI check: the package's
    dense = [s for s in sa.stages() if s.default_dense]
    if not dense:
        print("clocks: %s has no default dense stage (built without CUDA?)" % sa.library_path)
        return 1
    st = P.OurStage(torch, sa, dense[0])
    smi = P.ClockSampler(sample_ms=50)
    if not smi.start():
        return 1
    time.sleep(0.5)

    def sustained(fn):
        fn()
        torch.cuda.synchronize()
        n, t0 = 0, time.time()
        while time.time() - t0 < args.secs:
            for _ in range(10):
                fn()
            n += 10
            torch.cuda.synchronize()
        return n, t0, time.time()

    try:
        for (B, H, S, D) in P.DENSE_SHAPES:
            flops = 4.0 * B * H * S * S * D
            q, k, v = [torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3)]
            o = torch.empty_like(q)
            lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
            ours = st.call(st.attn(q, k, v, o, lse))

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v)
            for _ in range(args.alternations):
                for name, fn in (("stage %d" % st.id, ours), ("cudnn", cudnn)):
                    n, t0, t1 = sustained(fn)
                    mhz, watt, k = smi.mean([(t0 + 0.3, t1)])
                    if not k:
                        mhz = watt = float("nan")
                    tf = flops * n / (t1 - t0) / 1e12
                    print("(%d,%d,%d,%d) %-8s %6.1f TFLOP/s %6.0f MHz %5.0f W %6.1f TFLOP/s per "
                          "GHz (%d samples)" % (B, H, S, D, name, tf, mhz, watt,
                                                tf / mhz * 1000, k), flush=True)
            del q, k, v, o, lse
            torch.cuda.empty_cache()
    finally:
        smi.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
