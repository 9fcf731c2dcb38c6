"""The selector registry and the workloads, through the CPU functions."""
import numpy as np
import pytest

import sparseattn as sa

SHAPE = dict(batch=1, heads_q=4, heads_kv=2, len_q=256, len_kv=1024, head_dim=128)


@pytest.fixture(scope="module")
def local():
    return sa.workload("local", seed=3, **SHAPE)


def test_registry_lists():
    names = [s.name for s in sa.selectors()]
    assert len(names) == len(set(names)) and {"r1", "random", "oracle"} <= set(names)
    for s in sa.selectors():
        assert s.description and isinstance(s.per_query, bool) and isinstance(s.has_cuda, bool)
        assert isinstance(s.ignores_index, bool)
    wl = {w.name: w for w in sa.workloads()}
    assert {"gaussian", "local"} <= set(wl)


def test_workload_is_reproducible_bf16(local):
    q, k, v = local
    assert q.shape == (1, 4, 256, 128) and k.shape == v.shape == (1, 2, 1024, 128)
    assert q.dtype == np.float32
    for x in (q, k, v):
        np.testing.assert_array_equal(sa.bf16_round(x), x)
    q2, _, _ = sa.workload("local", seed=3, **SHAPE)
    np.testing.assert_array_equal(q, q2)
    q3, _, _ = sa.workload("local", seed=4, **SHAPE)
    assert not np.array_equal(q, q3)
    with pytest.raises(sa.SparseAttnError) as e:
        sa.workload("nope", **SHAPE)
    assert e.value.code == -17


def test_workload_argument_errors():
    """Sizes and seed are judged in Python: ctypes would wrap them into sa_shape's ints and the
    uint64_t seed. The shape's own rules (head_dim here) stay the library's."""
    for seed in (-1, 2**64):
        with pytest.raises(ValueError, match=r"^seed must lie in \[0, 18446744073709551615\]"):
            sa.workload("local", seed=seed, **SHAPE)
    for seed in (1.0, True, "1"):
        with pytest.raises(TypeError, match=r"^seed must be an int"):
            sa.workload("local", seed=seed, **SHAPE)
    for name, x in (("heads_q", 2**32 + 4), ("len_kv", 2**31), ("batch", 0), ("len_q", -128)):
        with pytest.raises(ValueError, match=r"^%s must lie in \[1, 2147483647\]" % name):
            sa.workload("local", **dict(SHAPE, **{name: x}))
    with pytest.raises(TypeError, match=r"^head_dim must be an int"):
        sa.workload("local", **dict(SHAPE, head_dim=128.0))
    q, _, _ = sa.workload("local", seed=np.uint64(2**64 - 1), **dict(SHAPE, len_q=np.int64(128)))
    assert q.shape == (1, 4, 128, 128)
    with pytest.raises(sa.SparseAttnError) as e:
        sa.workload("local", **dict(SHAPE, head_dim=100))
    assert e.value.function == "sa_shape_check"


@pytest.mark.parametrize("name", [s.name for s in sa.selectors()])
def test_every_selector_writes_valid_lists(local, name):
    q, k, v = local
    sel = {s.name: s for s in sa.selectors()}[name]
    topk = 3
    idx, cnt = sa.select(name, q, k, topk)
    rows = 256 if sel.per_query else 2
    assert idx.shape == (1, 2, rows, topk) and idx.dtype == np.int32
    assert cnt.shape == (1, 2, rows) and np.all(cnt == topk)
    assert np.all((idx >= 0) & (idx < 8))
    assert np.all(np.diff(idx, axis=-1) > 0)  # sorted, no duplicates
    run = sa.query_sparse_attention if sel.per_query else sa.block_sparse_attention
    o, lse = run(q, k, v, idx, cnt)
    assert np.all(np.isfinite(o)) and np.all(np.isfinite(lse))


def test_options(local):
    q, k, _ = local
    idx, _ = sa.select("random", q, k, 2, seed=1)
    idx2, _ = sa.select("random", q, k, 2, seed=1)
    idx3, _ = sa.select("random", q, k, 2, seed=2)
    np.testing.assert_array_equal(idx, idx2)
    assert not np.array_equal(idx, idx3)
    idx, _ = sa.select("r1", q, k, 2, keep_sink=True)
    assert np.all(idx[..., 0] == 0)


def test_oracle_beats_random_on_local(local):
    """The oracle's blocks hold more softmax mass: its sparse output is closer to dense."""
    q, k, v = local
    o_dense, _ = sa.dense_attention(q, k, v)
    err = {}
    for name in ("oracle", "random"):
        idx, cnt = sa.select(name, q, k, 2)
        o, _ = sa.block_sparse_attention(q, k, v, idx, cnt)
        err[name] = np.linalg.norm(o - o_dense) / np.linalg.norm(o_dense)
    assert err["oracle"] < err["random"]


def test_bshd_and_index_vectors(local, rng):
    q, k, _ = local
    t = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    idx, _ = sa.select("r1", q, k, 3)
    idx2, _ = sa.select("r1", t(q), t(k), 3, layout="bshd")
    np.testing.assert_array_equal(idx, idx2)
    qi = rng.standard_normal((1, 4, 256, 32), dtype=np.float32)
    ki = rng.standard_normal((1, 2, 1024, 32), dtype=np.float32)
    idx3, _ = sa.select("r1", q, k, 3, q_index=qi, k_index=ki)
    assert idx3.shape == idx.shape


def test_index_heads_and_keep_local(local, rng):
    """index_heads: q_index/k_index with Hi heads of their own; one index head per KV group gives
    the lists of the attention's layout with each index head's queries copied to the group's
    heads. keep_local forces the block holding each tile's last query position."""
    q, k, _ = local  # Hq 4, Hkv 2, len 256 / 1024
    qi = rng.standard_normal((1, 2, 256, 32), dtype=np.float32)
    ki = rng.standard_normal((1, 2, 1024, 32), dtype=np.float32)
    for name in ("nvfp4", "nvfp4_query", "r1"):
        idx, _ = sa.select(name, q, k, 3, q_index=qi, k_index=ki, index_heads=2)
        ref, _ = sa.select(name, q, k, 3, q_index=np.repeat(qi, 2, axis=1), k_index=ki)
        np.testing.assert_array_equal(idx, ref)
    one, _ = sa.select("nvfp4", q, k, 3, q_index=qi[:, :1], k_index=ki[:, :1], index_heads=1)
    np.testing.assert_array_equal(one[0, 0], one[0, 1])  # both KV heads share the index head
    with pytest.raises(ValueError, match=r"^q_index must have shape \(B, Hi, Sq\)"):
        sa.select("nvfp4", q, k, 3, q_index=np.repeat(qi, 2, axis=1), k_index=ki, index_heads=2)
    with pytest.raises(ValueError, match=r"^index_heads describes q_index"):
        sa.select("nvfp4", q, k, 3, index_heads=2)
    with pytest.raises(ValueError, match=r"^index_heads must lie in \[0, 2147483647\], got -1"):
        sa.select("nvfp4", q, k, 3, q_index=qi, k_index=ki, index_heads=-1)
    idx, _ = sa.select("random", q, k, 1, keep_local=True)
    # Tiles end at queries 127 and 255, positions 895 and 1023 (offset 768): blocks 6 and 7.
    assert np.all(idx[0, :, :, 0] == [6, 7])


def test_index_argument_errors(local, rng):
    """The index vectors' rules (sa_selectors.h: index_heads divides Hq and divides Hkv or is a
    multiple of it; index_dim a multiple of 16 up to SA_MAX_INDEX_DIM) are ValueErrors naming
    the argument, raised before the C call (docs/python.md, "Errors")."""
    q, k, _ = local  # Hq 4, Hkv 2
    ix = lambda h, s, i: rng.standard_normal((1, h, s, i), dtype=np.float32)
    with pytest.raises(ValueError, match=r"^index_heads \(3\) must divide heads_q \(4\) and "
                                         r"divide heads_kv \(2\) or be a multiple of it"):
        sa.select("nvfp4", q, k, 3, q_index=ix(3, 256, 32), k_index=ix(3, 1024, 32),
                  index_heads=3)
    q12, k12, _ = sa.workload("local", heads_q=12, heads_kv=4, len_q=128, len_kv=256)
    with pytest.raises(ValueError, match=r"^index_heads \(6\) must divide heads_q \(12\) "
                                         r"and divide heads_kv \(4\)"):  # 6 divides 12, not 4
        sa.select("r1", q12, k12, 1, q_index=ix(6, 128, 16), k_index=ix(6, 256, 16),
                  index_heads=6)
    for i in (24, 8, 1040):
        with pytest.raises(ValueError, match=r"^q_index's last dimension \(index_dim I\) must "
                                             r"be a multiple of 16 up to 1024, got %d" % i):
            sa.select("r1", q, k, 3, q_index=ix(4, 256, i), k_index=ix(2, 1024, i))
    for bad in (2.0, True):
        with pytest.raises(TypeError, match=r"^index_heads must be an int"):
            sa.select("nvfp4", q, k, 3, q_index=ix(2, 256, 32), k_index=ix(2, 1024, 32),
                      index_heads=bad)
    with pytest.raises(ValueError, match=r"^index_heads must lie in \[0, 2147483647\]"):
        sa.select("nvfp4", q, k, 3, q_index=ix(2, 256, 32), k_index=ix(2, 1024, 32),
                  index_heads=2**32 + 2)  # ctypes would make it 2
    with pytest.raises(ValueError, match=r"^seed must lie in \[0, 18446744073709551615\]"):
        sa.select("random", q, k, 3, seed=-1)
    with pytest.raises(TypeError, match=r"^seed must be an int"):
        sa.select("random", q, k, 3, seed=1.5)


def test_errors(local):
    q, k, _ = local
    with pytest.raises(ValueError, match=r"^unknown selector 'nope'; selectors: r1"):
        sa.select("nope", q, k, 2)
    with pytest.raises(ValueError, match=r"^topk must lie in \[1, 8\]"):
        sa.select("r1", q, k, 9)
    with pytest.raises(TypeError, match=r"^topk must be an int"):
        sa.select("r1", q, k, 2.0)
    with pytest.raises(ValueError, match=r"^q_index and k_index go together"):
        sa.select("r1", q, k, 2, q_index=q)
    with pytest.raises(ValueError, match=r"^k_index must have shape"):
        sa.select("r1", q, k, 2, q_index=q[..., :32], k_index=k[..., :16])
    with pytest.raises(sa.SparseAttnError) as e:  # len_q != len_kv
        sa.select("r1", q, k, 2, keep_diagonal=True)
    assert e.value.code == -11 and e.value.function == "sa_select_cpu('r1')"


def test_ignores_index(local, rng):
    """Selector.ignores_index as the C registry has it: index vectors unrelated to q/k leave the
    lists of a selector that ignores them and change those of one that scores them."""
    q, k, _ = local
    qi = sa.bf16_round(rng.standard_normal(q.shape[:3] + (32,)).astype(np.float32))
    ki = sa.bf16_round(rng.standard_normal(k.shape[:3] + (32,)).astype(np.float32))
    assert any(s.ignores_index for s in sa.selectors())
    assert not all(s.ignores_index for s in sa.selectors())
    for sel in sa.selectors():
        a, _ = sa.select(sel.name, q, k, 2, seed=5)
        b, _ = sa.select(sel.name, q, k, 2, seed=5, q_index=qi, k_index=ki)
        assert np.array_equal(a, b) == sel.ignores_index, sel.name


@pytest.mark.parametrize("sq,skv", [(256, 1024), (512, 512)], ids=str)
def test_causal_lists(rng, sq, skv):
    """A causal row picks among the blocks it sees, keeps its diagonal block, holds
    min(topk, visible) entries and -1 past them; the lists run causally without future blocks."""
    q, k, v = sa.workload("local", batch=1, heads_q=2, heads_kv=1, len_q=sq, len_kv=skv,
                          head_dim=64, seed=7)
    for sel in sa.selectors():
        idx, cnt = sa.select(sel.name, q, k, 3, causal=True)
        rows = np.arange(idx.shape[2])
        last_row = np.minimum(rows * 128 + 127, sq - 1) if not sel.per_query else rows
        n = (last_row + skv - sq) // 128 + 1  # blocks visible to the row
        np.testing.assert_array_equal(cnt[0, 0], np.minimum(3, n))
        for r in rows:
            c = cnt[0, 0, r]
            assert np.all(idx[0, 0, r, :c] < n[r]) and n[r] - 1 in idx[0, 0, r, :c], sel.name
            assert np.all(idx[0, 0, r, c:] == -1)
        run = sa.query_sparse_attention if sel.per_query else sa.block_sparse_attention
        o, lse = run(q, k, v, idx, cnt, causal=True)
        assert np.all(np.isfinite(o))
