"""tools/sparse_loss.py's pure helpers (the script itself needs a model and torch): the block
counts behind its density column, its all-blocks causal lists, which must make the CPU
reference's block-sparse attention equal causal dense attention, and its check of the selectors
that --per-head-lists and --pooled-lists may run (select(head_lists=...), tested in
test_head_lists.py)."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import sparseattn as sa

_PATH = Path(__file__).resolve().parents[2] / "tools" / "sparse_loss.py"
_spec = importlib.util.spec_from_file_location("sparse_loss", _PATH)
sl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sl)   # imports only the standard library at module level


def test_block_counts():
    for s in (1, 127, 128, 129, 2048, 4096, 5000):
        n = -(-s // 128)
        assert sl.visible_blocks(s) == sum(t + 1 for t in range(n))
        assert sl.kept_blocks(s, n) == sl.visible_blocks(s)
        for k in (1, 2, 8):
            assert sl.kept_blocks(s, k) == sum(min(k, t + 1) for t in range(n))
    assert sl.kept_blocks(2048, 8) / sl.visible_blocks(2048) == 100 / 136


def test_full_causal_lists_equal_dense(rng):
    q = rng.standard_normal((1, 4, 300, 64), dtype=np.float32)
    k = rng.standard_normal((1, 2, 300, 64), dtype=np.float32)
    v = rng.standard_normal((1, 2, 300, 64), dtype=np.float32)
    idx, cnt = sl.full_causal_lists(1, 2, 300)
    assert idx.shape == (1, 2, 3, 3) and cnt.tolist() == [[[1, 2, 3]] * 2]
    assert idx[0, 0].tolist() == [[0, -1, -1], [0, 1, -1], [0, 1, 2]]
    o, lse = sa.block_sparse_attention(q, k, v, idx, cnt, causal=True)
    od, lsed = sa.dense_attention(q, k, v, causal=True)
    np.testing.assert_allclose(o, od, rtol=0, atol=1e-5)
    np.testing.assert_allclose(lse, lsed, rtol=0, atol=1e-5)
    # The library's own causal lists at a budget of every block are the same lists.
    si, sc = sa.select("oracle", q, k, topk=3, causal=True)
    assert (sc == cnt).all() and (si == idx).all()


def test_parse_layers_and_gate():
    assert sl.parse_layers("0,5-7,11") == [0, 5, 6, 7, 11]
    assert sl.parse_layers("3,1-3") == [3, 1, 2]
    for bad in ("-1", "5-3", "x"):
        try:
            sl.parse_layers(bad)
        except ValueError:
            continue
        raise AssertionError("parse_layers(%r) did not fail" % bad)
    assert sl.sparse_here(None, 4) and sl.sparse_here(None, None)
    assert sl.sparse_here({4}, 4) and not sl.sparse_here({4}, 5)
    assert not sl.sparse_here({4}, None)


def test_lists_unsupported():
    # --per-head-lists and --pooled-lists run every selector whose Selector.head_lists has the
    # mode, and name the others (and the ones that would do) before any model is loaded.
    assert sl.lists_unsupported(sa, ["r1", "oracle", "nvfp4_query"], "group") == ""
    assert sl.lists_unsupported(sa, ["r1", "r4", "nvfp4", "oracle"], "per_head") == ""
    assert sl.lists_unsupported(sa, ["oracle", "nvfp4_mass", "r4_mass"], "pooled") == ""
    why = sl.lists_unsupported(sa, ["oracle", "r1", "nvfp4"], "pooled")
    assert why.startswith("head_lists='pooled' is not taken by r1, nvfp4; the selectors that "
                          "take it: ")
    assert set(why.split(": ")[1].split(", ")) == \
        {s.name for s in sa.selectors() if "pooled" in s.head_lists}
    assert "nvfp4_query" in sl.lists_unsupported(sa, ["nvfp4_query"], "per_head")
    try:
        sl.lists_unsupported(sa, ["oracle", "nope"], "group")
    except ValueError as e:
        assert str(e).startswith("unknown selector nope; selectors: r1")
    else:
        raise AssertionError("lists_unsupported accepted an unknown selector")


def test_cli_refuses_unfit_selectors():
    # The refusal comes from argparse, before torch or a model is needed.
    env = dict(os.environ, SPARSEATTN_LIB=sa.library_path)
    r = subprocess.run([sys.executable, str(_PATH), "--pooled-lists", "--selectors", "oracle,r1"],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "--pooled-lists: head_lists='pooled' is not taken by r1" \
        in r.stderr, r.stderr
    r = subprocess.run([sys.executable, str(_PATH), "--pooled-lists", "--per-head-lists"],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "not with --per-head-lists" in r.stderr, r.stderr
