"""tools/plot_quality.py's reading of tools/sparse_loss.py --json files (the plotting itself
needs matplotlib, which the test environment need not have): runs of one model and length merge,
dense and the controls are left out, the sink, per-head and pooled variants get their own lines,
and a file that is not such a result is refused."""
import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "tools" / "plot_quality.py"
_spec = importlib.util.spec_from_file_location("plot_quality", _PATH)
pq = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pq)   # imports only the standard library at module level


def _run(path, tokens, results):
    path.write_text(json.dumps({"model": "Tiny LM (tiny.gguf)", "tokens": tokens,
                                "results": results}))
    return str(path)


def _res(selector, budget, delta, sink=False, per_head=False, pooled=False):
    return {"selector": selector, "budget": budget, "delta": delta, "keep_sink": sink,
            "per_head_lists": per_head, "pooled_lists": pooled}


def test_load_merges_runs(tmp_path):
    a = _run(tmp_path / "a.json", 2048, [_res("sdpa", None, 0.0), _res("oracle", 4, 0.05),
                                         _res("r1", 4, 0.2), _res("r1", 8, 0.1)])
    b = _run(tmp_path / "b.json", 2048, [_res("sdpa", None, 0.0), _res("oracle", 8, 0.01),
                                         _res("r1", 8, 0.03, sink=True)])
    c = _run(tmp_path / "c.json", 4096, [_res("oracle", 8, 0.02)])
    d = _run(tmp_path / "d.json", 2048, [_res("r1", 8, 0.07, per_head=True),
                                         _res("oracle", 8, 0.004, pooled=True)])
    data, names = pq.load([a, b, c, d])
    assert names == {"tiny-lm": "Tiny LM"}
    assert data["tiny-lm"][2048] == {"oracle": {4: 0.05, 8: 0.01}, "r1": {4: 0.2, 8: 0.1},
                                     "r1 +sink": {8: 0.03}, "r1 per-head": {8: 0.07},
                                     "oracle pooled": {8: 0.004}}
    assert data["tiny-lm"][4096] == {"oracle": {8: 0.02}}


def test_load_refuses_other_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit, match="not a sparse_loss.py --json file"):
        pq.load([str(p)])


def _eval_rows(path, rows, junk=True):
    lines = ["== a progress line, not JSON"] if junk else []
    lines += [json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _row(sel, k, recall, layer, n=8192, sink=0):
    return {"model": "Tiny LM", "len": n, "layer": layer, "selector": sel, "k": k,
            "keep_sink": sink, "recall_mean": recall}


def test_load_recall_averages_layers(tmp_path):
    a = _eval_rows(tmp_path / "a.jsonl", [_row("oracle", 8, 0.8, 5), _row("oracle", 8, 0.6, 11),
                                          _row("r1", 8, 0.5, 5), _row("r1", 16, None, 5),
                                          _row("r1", 8, 0.7, 5, sink=1)])
    b = _eval_rows(tmp_path / "b.jsonl", [_row("oracle", 8, 0.9, 5, n=4096)], junk=False)
    data, names = pq.load_recall([a, b])
    assert names == {"tiny-lm": "Tiny LM"}
    assert data["tiny-lm"][8192] == {"oracle": {8: pytest.approx(0.7)}, "r1": {8: 0.5},
                                     "r1 +sink": {8: 0.7}}
    assert data["tiny-lm"][4096] == {"oracle": {8: 0.9}}


def test_load_recall_refuses_other_files(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text("nothing here\n{\"rows\": []}\n")
    with pytest.raises(SystemExit, match="no select-eval --json rows"):
        pq.load_recall([str(p)])


def test_load_leaves_out_ablations_and_reports_reruns(tmp_path, capsys):
    """A run with only some layers sparse (--ablate-layers, "layers" set) is not a point of the
    plot; a configuration run twice is drawn from the later file, and the script says so."""
    ablate = _res("r1", 8, 0.9)
    ablate["layers"] = [3, 4]
    a = _run(tmp_path / "a.json", 2048, [_res("r1", 8, 0.1), ablate])
    b = _run(tmp_path / "b.json", 2048, [_res("r1", 8, 0.2)])
    data, _ = pq.load([a, b])
    assert data["tiny-lm"][2048] == {"r1": {8: 0.2}}
    assert "r1 at k = 8 run before; drawing %s" % b in capsys.readouterr().err


def test_load_recall_head_lists(tmp_path):
    """select-eval --head-lists rows: per-head and pooled lists get their own lines, and a
    model named with its file ("Tiny LM (tiny.gguf)") is shown without it."""
    rows = [dict(_row("oracle", 8, 0.8, 5), head_lists="group"),
            dict(_row("oracle", 8, 0.85, 5), head_lists="per_head"),
            dict(_row("oracle", 8, 0.9, 5), head_lists="pooled")]
    for r in rows:
        r["model"] = "Tiny LM (tiny.gguf)"
    data, names = pq.load_recall([_eval_rows(tmp_path / "h.jsonl", rows)])
    assert names == {"tiny-lm": "Tiny LM"}
    assert data["tiny-lm"][8192] == {"oracle": {8: 0.8}, "oracle per-head": {8: 0.85},
                                     "oracle pooled": {8: 0.9}}
