#!/usr/bin/env python3
"""Print the README's "Where things stand" table (markdown) from the benches' JSON outputs.

    python3 scripts/where-things-stand.py [--peers PEERS.json] [--causal CAUSAL.json]
                                          [--bench BENCH.jsonl ...]

--peers   the file `bench/peers.py --mode all --json PATH` writes (its "records": mode, shape,
          pattern, contender, kind, config, tflops, ...);
--causal  the file `bench/causal.py --json PATH` writes ("dense" and "sparse" rows with a
          "tflops" dict per contender);
--bench   output of `sparseattn bench selectors --json` and `sparseattn bench kvcentric --json`
          (one JSON object per line; lines that are not JSON are skipped, so a whole log works);
          the selectors' pipeline and query_pipeline lines give the pipelines' shares.

Each input is optional; rows whose input is missing are left out. Ours / peer ratios are taken
per case (shape, pattern) of the same run, and printed as a range over the cases. The goal
column checks the project's goals against those ratios. Standard library only; no GPU needed.
"""
import argparse
import json
import re
import sys

# (goal text, peer key, least ratio) per row kind; ratio = ours / peer, so "least" is a floor.
GOALS = {
    "sparse": [("FA4", 1.05), ("cuDNN BSA", 1.10)],
    "dense": [("cuDNN", 1.0)],
    "causal dense": [("cuDNN", 1.0), ("FA4", 1.0)],
    "causal sparse": [("FA4", 1.05)],
}
KV_GOAL = 0.75  # KV-centric with BF16 partials: at most this multiple of stage 14's time
# Issue #18: a selector -> attention pipeline's share of the attention-only rate, at least this,
# per row kind and length (keys); rows of other lengths or selectors carry no goal.
TILE_PIPE_GOALS = {("nvfp4/i1", 16384): 0.75}
QUERY_PIPE_GOALS = {32768: 0.70, 65536: 0.60}


def rng(vals, fmt="%.0f"):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "n/a"
    lo, hi = fmt % min(vals), fmt % max(vals)
    return lo if lo == hi else "%s-%s" % (lo, hi)


def slash(vals, fmt="%.0f"):
    return " / ".join("n/a" if v is None else fmt % v for v in vals)


def goal_cell(kind, ratios):
    """ratios: {peer name: [ratio per case]}."""
    parts = []
    for peer, least in GOALS[kind]:
        r = [x for x in ratios.get(peer, []) if x is not None]
        what = ">= %.2fx %s" % (least, peer) if least != 1.0 else ">= %s" % peer
        parts.append("%s: %s" % (what, "n/a" if not r else "met" if min(r) >= least
                                 else "not met"))
    return "; ".join(parts)


def short_stage(label):
    m = re.match(r"(stage \d+)", label)
    return m.group(1) if m else label


def best(d, prefix):
    v = [x for k, x in d.items() if k.startswith(prefix) and x is not None]
    return max(v) if v else None


def ratio(a, b):
    return a / b if a is not None and b else None


def shape_label(s):
    return "(%d,%d,%d,%d)" % (s["B"], s["Hq"], s["Sq"], s["D"])


def peers_rows(doc):
    rows = []
    recs = [r for r in doc.get("records", []) if r.get("tflops") is not None]
    # Block-sparse: per (len_kv, pattern) case, our stages and the best of each peer family.
    cases = {}
    for r in recs:
        if r["mode"] != "sparse":
            continue
        key = (r["shape"]["Skv"], r["pattern"])
        cases.setdefault(key, {"ours": {}, "peer": {}})
        if r["kind"] == "ours":
            st = r["config"]["stage"]
            side = ("off" if not r["config"].get("validate") else
                    "verdict" if r["config"].get("verdict") else "sync")
            cases[key]["ours"].setdefault(st, {})[side] = r["tflops"]
        elif r["kind"] == "peer":
            cases[key]["peer"][r["contender"]] = r["tflops"]
    stages = sorted({st for c in cases.values() for st in c["ours"]},
                    key=lambda s: -int(re.sub(r"\D.*", "", s.split()[1]) or 0))
    for st in stages:
        on, off, ratios, peer_tf = [], [], {}, {"FA4": [], "cuDNN BSA": [], "FlexAttention": []}
        for key in sorted(cases):
            c = cases[key]
            t = c["ours"].get(st, {})
            v = t.get("verdict", t.get("sync"))
            on.append(v)
            off.append(t.get("off"))
            for name, p in (("FA4", best(c["peer"], "fa4")),
                            ("cuDNN BSA", best(c["peer"], "cudnn bsa")),
                            ("FlexAttention", c["peer"].get("flex"))):
                peer_tf[name].append(p)
                ratios.setdefault(name, []).append(ratio(v, p))
        ours = "%s: %s useful TFLOP/s with validation, %s without" % (
            short_stage(st), rng(on), rng(off))
        peers = ", ".join("%s %s" % (n, rng(v)) for n, v in peer_tf.items()
                          if any(x is not None for x in v))
        peers += ": %s is %s" % (short_stage(st), " / ".join(
            rng(ratios[n], "%.2f") + "x" for n in peer_tf if any(x is not None for x in peer_tf[n])))
        rows.append(("block-sparse, study shape (B 2, 16 heads on 1, 4096 queries, 16 blocks per "
                     "tile, len_kv %s), validation on" % "/".join(
                         "%dK" % (k // 1024) for k in sorted({k for k, _ in cases})),
                     ours, peers, goal_cell("sparse", ratios)))
    # Dense: per shape, our dense stages against cuDNN SDPA and FA4.
    shapes = []
    for r in recs:
        if r["mode"] == "dense" and shape_label(r["shape"]) not in shapes:
            shapes.append(shape_label(r["shape"]))
    by = {}
    for r in recs:
        if r["mode"] == "dense":
            by.setdefault(r["contender"], {})[shape_label(r["shape"])] = (r["kind"], r["tflops"])
    for st in sorted(k for k, v in by.items() if any(kind == "ours" for kind, _ in v.values())):
        ours = [by[st].get(s, (None, None))[1] for s in shapes]
        cud = [by.get("cudnn", {}).get(s, (None, None))[1] for s in shapes]
        fa4 = [by.get("fa4", {}).get(s, (None, None))[1] for s in shapes]
        rc = [ratio(a, b) for a, b in zip(ours, cud)]
        rf = [ratio(a, b) for a, b in zip(ours, fa4)]
        peers = "cuDNN SDPA %s (%s)" % (slash(cud), slash(rc, "%.2f"))
        if any(fa4):
            peers += ", FA4 %s (%s)" % (slash(fa4), slash(rf, "%.2f"))
        rows.append(("%s dense, %s" % (short_stage(st), " / ".join(shapes)),
                     "%s TFLOP/s" % slash(ours), peers, goal_cell("dense", {"cuDNN": rc})))
    return rows


def causal_rows(doc):
    rows = []
    dense = doc.get("dense", [])
    if dense:
        get = lambda n: [r["tflops"].get(n) for r in dense]  # noqa: E731
        ours, cud, fa4 = get("ours"), get("cudnn"), get("fa4")
        rc = [ratio(a, b) for a, b in zip(ours, cud)]
        rf = [ratio(a, b) for a, b in zip(ours, fa4)]
        rows.append(("causal dense, %s, half the dense FLOPs" % " / ".join(
                         "(%s)" % ",".join(str(x) for x in r["shape"]) for r in dense),
                     "ours with every visible block: %s" % slash(ours),
                     "cuDNN SDPA causal %s, FA4 causal %s" % (slash(cud), slash(fa4)),
                     goal_cell("causal dense", {"cuDNN": rc, "FA4": rf})))
    sparse = doc.get("sparse", [])
    if sparse:
        ours = [r["tflops"].get("ours") for r in sparse]
        fa4 = [best(r["tflops"], "fa4") for r in sparse]
        flex = [r["tflops"].get("flex") for r in sparse]
        rf = [ratio(a, b) for a, b in zip(ours, fa4)]
        peers = "FA4 block-sparse causal %s (%s)" % (slash(fa4), slash(rf, "%.2f"))
        if any(flex):
            peers += ", FlexAttention %s" % slash(flex)
        rows.append(("causal block-sparse, study shape",
                     "ours: %s at len_kv %s" % (slash(ours), " / ".join(
                         "%dK" % (r["len_kv"] // 1024) for r in sparse)),
                     peers, goal_cell("causal sparse", {"FA4": rf})))
    return rows


def share_span(v):
    """'72.8-73.8%' (or '73.1%') from a list of shares."""
    lo, hi = 100 * min(v), 100 * max(v)
    return "%.1f%%" % lo if "%.1f" % lo == "%.1f" % hi else "%.1f-%.1f%%" % (lo, hi)


def pipeline_rows(tile, query):
    """tile: {(selector, len_kv, stage): [share]}; query: {(selector, schedule, len_kv): [share]}
    (shares over the workloads of one run)."""
    rows = []
    if tile:
        cells, goals = [], []
        for (name, n, stage) in sorted(tile, key=lambda k: (k[1], k[0])):
            v = tile[(name, n, stage)]
            cells.append("%s %s at %dK" % (name, share_span(v), n // 1024))
            g = TILE_PIPE_GOALS.get((name, n))
            if g is not None:
                goals.append(">= %.0f%% (%s, %dK): %s" % (100 * g, name, n // 1024,
                                                          "met" if min(v) >= g else "not met"))
        stages = sorted({k[2] for k in tile})
        rows.append(("tile selector -> stage %s pipeline, share of attention-only" %
                     "/".join(str(x) for x in stages), "; ".join(cells),
                     "the attention alone on the same lists", "; ".join(goals) or "-"))
    if query:
        cells, goals = [], []
        for (name, sched, n) in sorted(query, key=lambda k: (k[2], k[0], k[1])):
            cells.append("%s -> %s %s at %dK" % (name, sched, share_span(query[(name, sched, n)]),
                                                 n // 1024))
        for n, g in sorted(QUERY_PIPE_GOALS.items()):
            v = [x for (_, _, m), xs in query.items() if m == n for x in xs]
            if v:
                goals.append(">= %.0f%% at %dK: %s" % (100 * g, n // 1024,
                                                       "met" if min(v) >= g else "not met"))
        rows.append(("per-query selector -> KV-centric pipeline, share of attention-only",
                     "; ".join(cells), "the KV-centric attention alone on the same lists",
                     "; ".join(goals) or "-"))
    return rows


def bench_rows(lines):
    rows = []
    sel, floor = {}, {}
    kv, kv_dense = {}, None
    tile, query = {}, {}
    for o in lines:
        if o.get("bench") == "selectors" and o.get("kind") == "pipeline":
            tile.setdefault((o["selector"], o["len_kv"], o["stage"]), []).append(o["share"])
        elif o.get("bench") == "selectors" and o.get("kind") == "query_pipeline":
            query.setdefault((o["selector"], o["schedule"], o["len_kv"]), []).append(o["share"])
        elif o.get("bench") == "selectors" and o.get("kind") == "selector":
            sel.setdefault(o["selector"], {})[o["len_kv"]] = o["median_ms"]
        elif o.get("bench") == "selectors" and o.get("kind") == "read_floor":
            floor[o["len_kv"]] = o["median_ms"]
        elif o.get("bench") == "kvcentric" and o.get("kind") == "time":
            if o["what"].startswith("stage ") and "(all" in o["what"]:
                kv_dense = (short_stage(o["what"]), o["median_ms"])
            else:
                kv[o["what"]] = o
    if sel:
        lens = sorted({n for v in sel.values() for n in v})
        ours = ", ".join("%s %s ms" % (s, slash([sel[s].get(n) for n in lens], "%.3f"))
                         for s in sorted(sel))
        rows.append(("GPU selectors alone at %s keys" % " / ".join("%dK" % (n // 1024)
                                                                  for n in lens),
                     ours, "a kernel that only reads Q and K once: %s ms" % slash(
                         [floor.get(n) for n in lens], "%.3f"), "see `docs/selectors.md`"))
    rows += pipeline_rows(tile, query)
    t = kv.get("BF16 total (no validation)")
    if t:
        vs = t.get("vs_dense")
        rows.append(("KV-centric, BF16 partials (B 8, 4096 x 4096)",
                     "%.2f ms = %.2fx %s" % (t["median_ms"], vs, kv_dense[0] if kv_dense
                                             else "dense"),
                     "%s %.2f ms" % kv_dense if kv_dense else "n/a",
                     "<= %.2fx: %s" % (KV_GOAL, "met" if vs and vs <= KV_GOAL else "not met")))
    return rows


def read_lines(paths):
    out = []
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peers", metavar="PATH")
    ap.add_argument("--causal", metavar="PATH")
    ap.add_argument("--bench", metavar="PATH", nargs="*", default=[])
    args = ap.parse_args(argv)
    rows = []
    if args.peers:
        with open(args.peers) as f:
            rows += peers_rows(json.load(f))
    if args.causal:
        with open(args.causal) as f:
            rows += causal_rows(json.load(f))
    rows += bench_rows(read_lines(args.bench))
    if not rows:
        print("where-things-stand: no rows (give --peers, --causal or --bench)", file=sys.stderr)
        return 1
    print("| what | ours | peers in the same run | goal |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
