"""tools/sparse_loss.py's pure helpers (the script itself needs a model and torch): the block
counts behind its density column, its all-blocks causal lists, which must make the CPU
reference's block-sparse attention equal causal dense attention, and its per-head lists."""
import importlib.util
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


def test_per_head_lists(rng):
    # GQA 2: head h's list is the selector's answer for head h alone (its KV head's keys).
    q = rng.standard_normal((1, 4, 520, 64), dtype=np.float32)
    k = rng.standard_normal((1, 2, 520, 64), dtype=np.float32)
    v = rng.standard_normal((1, 2, 520, 64), dtype=np.float32)
    idx, cnt = sl.per_head_lists(sa, "oracle", q, k, 2, False)
    assert idx.shape == (1, 4, 5, 2) and cnt.shape == (1, 4, 5)
    for h in range(4):
        hi, hc = sa.select("oracle", q[:, h:h + 1], k[:, h // 2:h // 2 + 1], topk=2, causal=True)
        assert (idx[:, h:h + 1] == hi).all() and (cnt[:, h:h + 1] == hc).all()
    # The heads of a group disagree somewhere (else the test would not tell the geometries apart).
    gi, _ = sa.select("oracle", q, k, topk=2, causal=True)
    assert not all((idx[:, 2 * g + j] == gi[:, g]).all() for g in range(2) for j in range(2))
    # list_heads = Hq reaches the attention; at every block it is dense attention.
    o, _ = sa.block_sparse_attention(q, k, v, idx, cnt, causal=True)
    assert np.isfinite(o).all()
    fi, fc = sl.per_head_lists(sa, "oracle", q, k, 5, False)
    o, lse = sa.block_sparse_attention(q, k, v, fi, fc, causal=True)
    od, lsed = sa.dense_attention(q, k, v, causal=True)
    np.testing.assert_allclose(o, od, rtol=0, atol=1e-5)
