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


def test_tile_block_mass_is_the_oracles(rng):
    # Per tile, the exact causal block mass: rows sum to the tile's queries, and the ranking is
    # the oracle selector's (which scores the same mass) on BF16-rounded inputs.
    q = sa.bf16_round(rng.standard_normal((300, 64), dtype=np.float32) * 0.5)
    k = sa.bf16_round(rng.standard_normal((300, 64), dtype=np.float32))
    m = sl.tile_block_mass(q / 8.0, k)  # scale 1/sqrt(64) folded into q, as the tool does
    assert m.shape == (3, 3)
    np.testing.assert_allclose(m.sum(axis=1), [128, 128, 44], rtol=1e-9)
    assert (np.triu(m, 1) == 0).all()  # causal: no mass past the diagonal
    # The oracle keeps a causal row's diagonal block and then the most mass: here, per tile, the
    # diagonal and the better of the blocks before it.
    idx, cnt = sa.select("oracle", q[None, None], k[None, None], topk=2, causal=True)
    for t in (1, 2):
        assert sorted(idx[0, 0, t, :cnt[0, 0, t]]) == sorted({t, int(np.argmax(m[t, :t]))})


def test_pool_budget():
    # Two heads, tile 3 (4 visible blocks), budget 2 each: head 0's mass sits on its diagonal
    # block, head 1's is spread. Pooled, head 0 keeps only its diagonal and head 1 three blocks,
    # its two best besides the diagonal; the total stays 2 x 2.
    mass = np.zeros((2, 4, 4))
    mass[0, 3] = [5, 1, 1, 90]
    mass[1, 3] = [10, 40, 39, 30]
    idx, cnt = sl.pool_budget(mass, 2, 4)
    assert cnt[:, 3].tolist() == [1, 3]
    assert idx[0, 3].tolist() == [3, -1, -1, -1] and idx[1, 3].tolist() == [1, 2, 3, -1]
    # Every tile: the group keeps H * min(topk, t + 1), each head its diagonal, at most cap,
    # ascending; with equal masses across heads (and no ties) the split is even.
    for t in range(4):
        assert cnt[:, t].sum() == 2 * min(2, t + 1)
        for h in range(2):
            row = idx[h, t, :cnt[h, t]]
            assert t in row and (np.diff(row) > 0).all() and (idx[h, t, cnt[h, t]:] == -1).all()
    same = np.stack([mass[1], mass[1]])
    _, c2 = sl.pool_budget(same, 2, 4)
    assert c2[0, 3] == c2[1, 3] == 2
    # The cap holds: head 0 may not take more than cap blocks even when it has all the mass.
    lop = np.zeros((2, 4, 4))
    lop[0, 3] = [50, 50, 50, 50]
    i3, c3 = sl.pool_budget(lop, 2, 3)
    assert c3[0, 3] == 3 and c3[1, 3] == 1 and i3[1, 3, 0] == 3


def test_pooled_lists(rng):
    # GQA 2 through the library: the lists reach the attention, the group's total is that of
    # per-head lists, and nvfp4_mass's index values are the library's NVFP4 grid.
    q = rng.standard_normal((1, 4, 520, 64), dtype=np.float32) * 0.125
    k = rng.standard_normal((1, 2, 520, 64), dtype=np.float32)
    v = rng.standard_normal((1, 2, 520, 64), dtype=np.float32)
    for mode in ("oracle", "nvfp4_mass"):
        idx, cnt = sl.pooled_lists(sa, mode, q, k, 2)
        assert idx.shape == (1, 4, 5, 4) and cnt.shape == (1, 4, 5)
        for g in range(2):
            assert cnt[0, 2 * g:2 * g + 2].sum(axis=0).tolist() == [2, 4, 4, 4, 4]
        o, _ = sa.block_sparse_attention(q, k, v, idx, cnt, causal=True)
        assert np.isfinite(o).all()
        # No pooling (cap = topk: each head exactly its own budget) is the C selector per head:
        # the Python mass and NVFP4 rounding rank as sel_nvfp4_mass.c and the oracle do.
        pi, pc = sl.pooled_lists(sa, mode, q, k, 2, cap_factor=1)
        hi, hc = sl.per_head_lists(sa, mode, q, k, 2, False)
        assert (pc == hc).all() and (pi == hi).all(), mode
    x = rng.standard_normal(64, dtype=np.float32)
    y = sl.nvfp4_round(sa, x)
    assert not np.array_equal(x, y) and np.abs(x - y).max() <= np.abs(x).max() / 6
    try:
        sl.pooled_lists(sa, "r1", q, k, 2)
    except ValueError as e:
        assert "nvfp4_mass or oracle" in str(e)
    else:
        raise AssertionError("pooled_lists accepted r1")
