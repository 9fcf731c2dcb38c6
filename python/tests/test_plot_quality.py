"""tools/plot_quality.py's reading of tools/sparse_loss.py --json files (the plotting itself
needs matplotlib, which the test environment need not have): runs of one model and length merge,
dense and the controls are left out, the sink variants get their own line, and a file that is not
such a result is refused."""
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


def _res(selector, budget, delta, sink=False):
    return {"selector": selector, "budget": budget, "delta": delta, "keep_sink": sink}


def test_load_merges_runs(tmp_path):
    a = _run(tmp_path / "a.json", 2048, [_res("sdpa", None, 0.0), _res("oracle", 4, 0.05),
                                         _res("r1", 4, 0.2), _res("r1", 8, 0.1)])
    b = _run(tmp_path / "b.json", 2048, [_res("sdpa", None, 0.0), _res("oracle", 8, 0.01),
                                         _res("r1", 8, 0.03, sink=True)])
    c = _run(tmp_path / "c.json", 4096, [_res("oracle", 8, 0.02)])
    data, names = pq.load([a, b, c])
    assert names == {"tiny-lm": "Tiny LM"}
    assert data["tiny-lm"][2048] == {"oracle": {4: 0.05, 8: 0.01}, "r1": {4: 0.2, 8: 0.1},
                                     "r1 +sink": {8: 0.03}}
    assert data["tiny-lm"][4096] == {"oracle": {8: 0.02}}


def test_load_refuses_other_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit, match="not a sparse_loss.py --json file"):
        pq.load([str(p)])
