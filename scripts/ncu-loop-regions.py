#!/usr/bin/env python3
"""Where a warp-specialized attention loop spends its time, from ncu's per-instruction samples.

    ncu --clock-control none -k regex:split_tile --launch-skip 4 -c 1 --set full -o R \\
        build-gpu/tools/sparseattn bench dense --stage 17 --reps 3 --warmup 1
    ncu --import R.ncu-rep --page source --csv --print-source sass > R.csv
    python3 scripts/ncu-loop-regions.py R.csv [--top N]

The loop is the instructions executed most often (the KV-block loop of the consumers). It is cut
into regions at the markers of the stage-17 dataflow, in order: "top" (waits for K and V, stage
arithmetic) up to the turn's BAR.SYNC; "turn" up to the first HGMMA; "issue" (the wgmma) up to
WARPGROUP.DEPBAR ... 0x1; "wait S" (that instruction); "softmax" up to the next DEPBAR; "wait
PV"; "pack" (the rest). For each region: its instructions, its share of all stall samples of the
kernel, and its leading stall reasons (share of the region's samples). Then the N instructions
with the most samples. Standard library only; docs/log/stage17-history.md (session 8) reads one
such run.
"""
import argparse
import collections
import csv
import sys

REGIONS = ("top", "turn", "issue", "wait S", "softmax", "wait PV", "pack")


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # ncu writes the kernel name on the first line, the column names on the second.
    hdr_at = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if hdr_at is None:
        raise ValueError("no 'Address' and 'Source' columns: not ncu's --page source --csv output")
    hdr = rows[hdr_at]
    col = {h: i for i, h in enumerate(hdr)}
    need = ("Warp Stall Sampling (All Samples)", "Instructions Executed")
    missing = [n for n in need if n not in col]
    if missing:
        raise ValueError("missing column(s) %s: profile with --set full (or SourceCounters)"
                         % ", ".join(missing))
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for r in rows[hdr_at + 1:]:
        if len(r) < len(hdr):
            continue
        out.append({
            "addr": int(r[col["Address"]], 16),
            "sass": r[col["Source"]].strip(),
            "samples": int(r[col[need[0]]] or 0),
            "executed": int(r[col[need[1]]] or 0),
            "stalls": {h[len("stall_"):]: int(r[col[h]] or 0) for h in reasons},
        })
    if not out:
        raise ValueError("no instruction rows")
    return out


def regions(loop):
    """The loop's instructions, each tagged with its region (REGIONS, in order)."""
    reg, tagged = "top", []
    for ins in loop:
        s = ins["sass"]
        if reg == "top" and "BAR.SYNC" in s:
            reg = "turn"
        elif reg == "turn" and "HGMMA" in s:
            reg = "issue"
        elif reg == "issue" and "DEPBAR" in s:
            reg = "wait S"
        elif reg == "wait S":
            reg = "softmax"
        if reg == "softmax" and "DEPBAR" in s:
            reg = "wait PV"
        elif reg == "wait PV" and "DEPBAR" not in s:
            reg = "pack"
        tagged.append((reg, ins))
    return tagged


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=10, help="instructions to list (default 10)")
    args = ap.parse_args(argv)
    try:
        ins = read(args.csv)
    except (OSError, ValueError) as e:
        print("ncu-loop-regions: %s: %s" % (args.csv, e), file=sys.stderr)
        return 2
    total = sum(i["samples"] for i in ins) or 1
    hottest = max(i["executed"] for i in ins)
    loop = [i for i in ins if i["executed"] == hottest]
    print("samples %d; loop: %d instructions executed %d times, %.1f%% of the samples"
          % (total, len(loop), hottest, 100.0 * sum(i["samples"] for i in loop) / total))
    agg = collections.OrderedDict((r, [0, 0, collections.Counter()]) for r in REGIONS)
    for reg, i in regions(loop):
        a = agg[reg]
        a[0] += 1
        a[1] += i["samples"]
        a[2].update(i["stalls"])
    for reg, (n, smp, why) in agg.items():
        if not n:
            continue
        lead = ", ".join("%s %.2f" % (k, v / smp) for k, v in why.most_common(3) if smp and v)
        print("  %-8s %4d instructions %6.1f%%  %s" % (reg, n, 100.0 * smp / total, lead))
    base = ins[0]["addr"]
    print("top %d instructions by samples:" % args.top)
    for i in sorted(ins, key=lambda i: -i["samples"])[:args.top]:
        lead = max(i["stalls"].items(), key=lambda kv: kv[1], default=("-", 0))[0]
        print("  +%05x %5.1f%% %-8s %s" % (i["addr"] - base, 100.0 * i["samples"] / total,
                                           lead, i["sass"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
