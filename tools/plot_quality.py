#!/usr/bin/env python3
"""Plots of the model's own verdict (issue #19, docs/quality.md): the next-token loss with
block-sparse attention minus dense (nats/token) against the budget (blocks of 128 keys per query
tile), one line per selector (with or without the sink block), one panel per length, one PNG
per model. Input: the JSON files that tools/sparse_loss.py --json writes (several runs of one
model and length are merged: each result carries its own delta from dense).

    pip install matplotlib          # into the venv of docs/activations.md; nothing else needed
    python3 tools/plot_quality.py docs/log/json/quality/*.json --out docs/img

Writes OUT/quality-loss-MODEL.png and prints one line per figure. A dotted line marks 0.02;
deltas at or below 0.001 (or negative) sit on the axis floor.

Files ending in .jsonl are `sparseattn select-eval --activations FILE --json` outputs instead
(one JSON object per line; other lines are skipped), each row with a "model" field added when
the file was kept: OUT/quality-recall-MODEL.png plots the mean attention recall (averaged over
the stored layers) against the budget, one panel per length."""
import argparse
import collections
import json
import os
import sys

THRESHOLD = 0.02  # the mark: within 0.02 nats/token of dense
FLOOR = 1e-3      # deltas at or below it are drawn on the floor of the log axis
STYLE = {"oracle": ("black", "o"), "r1": ("tab:blue", "s"), "r4": ("tab:green", "^"),
         "nvfp4": ("tab:red", "D"), "nvfp4_query": ("tab:purple", "v"),
         "gauss": ("tab:orange", "P"), "nvfp4_mass": ("tab:brown", "*"),
         "nvfp4_mass_q8": ("tab:pink", "X"), "r4_mass": ("tab:olive", "p"),
         "oracle_query": ("dimgray", "o"), "random": ("silver", ".")}


def model_key(doc):
    """A short, file-name-safe name of the run's model."""
    name = doc.get("model", "model").split(" (")[0]
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def load(paths):
    """{model: {tokens: {label: {budget: delta}}}} and each model's display name."""
    data = collections.defaultdict(lambda: collections.defaultdict(dict))
    names = {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        if "results" not in doc or "tokens" not in doc:
            sys.exit("plot_quality: %s is not a sparse_loss.py --json file" % path)
        m = model_key(doc)
        names[m] = doc.get("model", m).split(" (")[0]
        for r in doc["results"]:
            if r.get("budget") is None:  # dense and the controls
                continue
            if r.get("layers") is not None:  # --ablate-layers: only some layers sparse
                continue
            label = r["selector"] + (" +sink" if r.get("keep_sink") else "") + \
                (" per-head" if r.get("per_head_lists") else "") + \
                (" pooled" if r.get("pooled_lists") else "")
            row = data[m][doc["tokens"]].setdefault(label, {})
            if r["budget"] in row:  # the same configuration run twice: the later file is drawn
                print("plot_quality: %s, %d tokens, %s at k = %d run before; "
                      "drawing %s" % (names[m], doc["tokens"], label, r["budget"], path),
                      file=sys.stderr)
            row[r["budget"]] = r["delta"]
    return data, names


LEGEND_ROWS = 18    # labels per legend column before another column is added
LEGEND_COL_IN = 2.4  # inches of figure width per legend column


def figure_legend(fig, axes, order_key, ncol):
    """One legend for every panel's lines, at the figure's right, in order_key's order."""
    handles = {}
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    order = sorted(handles, key=order_key)
    fig.legend([handles[k] for k in order], order, fontsize=8, loc="center right", ncol=ncol)


def load_recall(paths):
    """{model: {len: {label: {budget: mean recall over layers}}}} and display names, from
    select-eval --json lines (rows without a recall, i.e. budgets past the block count, are
    left out)."""
    acc = collections.defaultdict(list)
    names = {}
    for path in paths:
        rows = 0
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                if "recall_mean" not in r or "selector" not in r or "len" not in r:
                    continue
                rows += 1
                if r["recall_mean"] is None:
                    continue
                m = model_key(r)
                names[m] = r.get("model", m).split(" (")[0]
                label = r["selector"] + (" +sink" if r.get("keep_sink") else "") + \
                    {"per_head": " per-head", "pooled": " pooled"}.get(r.get("head_lists"), "")
                acc[(m, r["len"], label, r["k"])].append(r["recall_mean"])
        if not rows:
            sys.exit("plot_quality: %s has no select-eval --json rows" % path)
    data = collections.defaultdict(lambda: collections.defaultdict(dict))
    for (m, n, label, k), v in acc.items():
        data[m][n].setdefault(label, {})[k] = sum(v) / len(v)
    return data, names


def draw(model, by_len, name, out_dir, plt, kind):
    """One PNG for a model: a panel per length, a line per selector label. kind "loss": loss -
    dense on a log axis with the 0.02 mark, sink variants dashed, per-head lists dash-dotted
    (tools/sparse_loss.py --per-head-lists), pooled ones dotted (--pooled-lists); "recall": mean
    recall on a linear axis, the per-query selectors dotted, per-head lists dash-dotted and
    pooled ones dashed (select-eval --head-lists)."""
    loss = kind == "loss"

    def order(label):  # the oracle (loss; recall: both oracles) first, then by name
        later = label.split()[0] != "oracle" if loss else not label.startswith("oracle")
        return later, label

    lengths = sorted(by_len)
    labels = {label for n in lengths for label in by_len[n]}
    ncol = -(-len(labels) // LEGEND_ROWS)
    width = 4.2 * len(lengths) + LEGEND_COL_IN * ncol  # the panels, then the legend's columns
    fig, axes = plt.subplots(1, len(lengths), figsize=(width, 3.8), sharey=True, squeeze=False)
    for ax, n in zip(axes[0], lengths):
        for label in sorted(by_len[n], key=order):
            pts = sorted(by_len[n][label].items())
            sel = label.split()[0]
            color, marker = STYLE.get(sel, ("gray", "x"))
            if loss:
                ys = [max(d, FLOOR) for _, d in pts]
                style = "--" if "+sink" in label else "-." if "per-head" in label else \
                    ":" if "pooled" in label else "-"
            else:
                ys = [r for _, r in pts]
                style = ":" if sel.endswith("_query") else "-." if "per-head" in label else \
                    "--" if "pooled" in label else "-"
            ax.plot([b for b, _ in pts], ys, marker=marker, color=color, linestyle=style,
                    label=label)
        if loss:
            ax.axhline(THRESHOLD, color="gray", linewidth=0.8, linestyle=":")
            ax.set_yscale("log")
        else:
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 1.02)
        ax.set_title("%d tokens (%d blocks)" % (n, -(-n // 128)))
        ax.set_xlabel("budget k (blocks per query tile)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("loss - dense (nats/token)" if loss else
                          "attention recall (mean over queries)")
    figure_legend(fig, axes, order, ncol)
    fig.suptitle("%s: loss with block-sparse attention, against dense" % name if loss else
                 "%s: recall of the selected blocks (captured layers)" % name)
    fig.tight_layout(rect=(0, 0, 1 - LEGEND_COL_IN * ncol / width, 1))
    path = os.path.join(out_dir, "quality-%s-%s.png" % (kind, model))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+",
                    help="tools/sparse_loss.py --json files; .jsonl: select-eval --json")
    ap.add_argument("--out", default=".", help="folder for the PNGs")
    a = ap.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_quality: needs matplotlib (pip install matplotlib)")
    loss_files = [p for p in a.json if not p.endswith(".jsonl")]
    recall_files = [p for p in a.json if p.endswith(".jsonl")]
    os.makedirs(a.out, exist_ok=True)
    for kind, files, loader in (("loss", loss_files, load), ("recall", recall_files, load_recall)):
        if not files:
            continue
        data, names = loader(files)
        for m in sorted(data):
            path = draw(m, data[m], names[m], a.out, plt, kind)
            print("%s (%s): %d lengths, %d configurations -> %s" % (
                names[m], kind, len(data[m]), sum(len(v) for v in data[m].values()), path))


if __name__ == "__main__":
    main()
