"""select(head_lists=...): one list per query head ("per_head") and the GQA group's budget pooled
across its heads ("pooled"), against the group lists of each head alone and against a numpy
reference of the pooling written from its rule (include/sa_selectors.h, "head_lists modes")."""
import math

import numpy as np
import pytest

import sparseattn as sa
from conftest import TILE, bf16_np

MASS_SELECTORS = ("oracle", "nvfp4_mass", "nvfp4_mass_q8", "r4_mass")


def qk(seed, hq, hkv, sq, skv, d=64):
    r = np.random.default_rng(seed)
    return (r.standard_normal((1, hq, sq, d), dtype=np.float32),
            r.standard_normal((1, hkv, skv, d), dtype=np.float32))


def visible(t, sq, skv, causal):
    """Blocks tile t may pick: all of them, or under causal those up to the one holding its last
    valid query's last visible key (bottom-right aligned)."""
    n = -(-skv // TILE)
    if not causal:
        return n
    last = min(t * TILE + TILE, sq) - 1
    return min(n, max(0, (last + skv - sq) // TILE + 1))


def tile_mass(q, k, causal):
    """Per query head, tile and key block: the sum over the tile's queries of the softmax
    probability each puts in the block (BF16-rounded inputs, scale 1/sqrt(D), float64), the
    exact attention mass the oracle scores. q (1, Hq, Sq, D), k (1, Hkv, Skv, D) ->
    (Hq, tiles, blocks)."""
    q, k = (bf16_np(x).astype(np.float64) for x in (q[0], k[0]))
    hq, sq, d = q.shape
    hkv, skv, _ = k.shape
    tiles, n = -(-sq // TILE), -(-skv // TILE)
    out = np.zeros((hq, tiles, n))
    for h in range(hq):
        s = q[h] @ k[h // (hq // hkv)].T / math.sqrt(d)
        if causal:
            s[np.arange(skv)[None, :] > np.arange(sq)[:, None] + (skv - sq)] = -np.inf
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - np.where(np.isfinite(m), m, 0))  # a query that sees no key: no mass
        p /= np.maximum(p.sum(axis=1, keepdims=True), 1e-300)
        p = np.pad(p, ((0, tiles * TILE - sq), (0, n * TILE - skv)))
        out[h] = p.reshape(tiles, TILE, n, TILE).sum(axis=(1, 3))
    return out


def pool_reference(mass, topk, cap, sq, skv, causal, keep_sink=False):
    """Pooled lists of one GQA group from mass (H, tiles, blocks): per tile, with n the blocks it
    may pick, each head takes its forced blocks (the diagonal n - 1 under causal, block 0 with
    keep_sink), or where none is forced its best block (the lower one of equal masses), so that
    no head goes empty; then the group's H * min(topk, n) blocks are completed with the
    (head, block) pairs of highest mass, each head holding at most min(cap, n); ties to the
    lower head, then the lower block. -> idx (H, tiles, cap) sorted with -1 past the count, cnt
    (H, tiles)."""
    h, tiles, _ = mass.shape
    idx = np.full((h, tiles, cap), -1, np.int32)
    cnt = np.zeros((h, tiles), np.int32)
    for t in range(tiles):
        n = visible(t, sq, skv, causal)
        forced = ({n - 1} if causal else set()) | ({0} if keep_sink else set())
        take = [(set(forced) or {int(np.argmax(mass[hh, t, :n]))}) if n else set()
                for hh in range(h)]
        left = h * min(topk, n) - sum(len(x) for x in take)
        heads, blocks = np.meshgrid(np.arange(h), np.arange(n), indexing="ij")
        m = mass[:, t, :n]
        for flat in np.lexsort((blocks.ravel(), heads.ravel(), -m.ravel())):
            if left == 0:
                break
            hh, b = divmod(int(flat), n)
            if b in take[hh] or len(take[hh]) >= min(cap, n):
                continue
            take[hh].add(b)
            left -= 1
        for hh in range(h):
            row = sorted(take[hh])
            idx[hh, t, :len(row)] = row
            cnt[hh, t] = len(row)
    return idx, cnt


def test_pool_reference_rule():
    # The reference itself on a hand-made tile (causal, tile 3 of 4 blocks): head 0's mass sits
    # on its diagonal, head 1's is spread; budget 2 x 2: head 0 keeps its diagonal alone,
    # head 1 the diagonal and its two best others. Equal masses go to the lower head.
    mass = np.zeros((2, 4, 4))
    mass[0, 3] = [5, 1, 1, 90]
    mass[1, 3] = [10, 40, 39, 30]
    idx, cnt = pool_reference(mass, 2, 4, 512, 512, True)
    assert cnt[:, 3].tolist() == [1, 3]
    assert idx[0, 3].tolist() == [3, -1, -1, -1] and idx[1, 3].tolist() == [1, 2, 3, -1]
    assert cnt[:, 0].tolist() == [1, 1] and cnt[:, 1].sum() == 4
    tie = np.ones((2, 1, 4))
    idx, cnt = pool_reference(tie, 2, 3, 128, 512, False)
    assert cnt[:, 0].tolist() == [3, 1] and idx[0, 0].tolist() == [0, 1, 2]
    assert idx[1, 0].tolist() == [0, -1, -1]
    # Nothing forced (not causal): a head whose every block ranks below the other's best ones
    # still keeps its own best block.
    mass = np.array([[[9, 8, 7, 6]], [[0, 2, 3, 0]]], float)
    idx, cnt = pool_reference(mass, 2, 4, 128, 512, False)
    assert cnt[:, 0].tolist() == [3, 1] and idx[1, 0].tolist() == [2, -1, -1, -1]


CASES = [  # (hq, hkv, sq, skv, causal)
    (4, 1, 1024, 1024, True),
    (4, 2, 1024, 1024, True),
    (4, 2, 1000, 1024, True),
    (4, 2, 300, 1024, False),
    (4, 1, 1024, 1024, False),
]


def assert_per_head_is_each_head_alone(name, q, k, causal):
    """select(head_lists="per_head") gives, for each query head, the group lists of that head
    alone with its KV head; and, the heads of a group disagreeing somewhere, not the group's."""
    hq, hkv, sq = q.shape[1], k.shape[1], q.shape[2]
    idx, cnt = sa.select(name, q, k, 3, causal=causal, head_lists="per_head")
    tiles = -(-sq // TILE)
    assert idx.shape == (1, hq, tiles, 3) and cnt.shape == (1, hq, tiles)
    g = hq // hkv
    for h in range(hq):
        hi, hc = sa.select(name, q[:, h:h + 1], k[:, h // g:h // g + 1], 3, causal=causal)
        np.testing.assert_array_equal(idx[:, h:h + 1], hi, err_msg="head %d" % h)
        np.testing.assert_array_equal(cnt[:, h:h + 1], hc, err_msg="head %d" % h)
    gi, _ = sa.select(name, q, k, 3, causal=causal)
    assert not np.array_equal(np.repeat(gi, g, axis=1), idx)


@pytest.mark.parametrize("name", ["r4", "oracle"])
@pytest.mark.parametrize("hq,hkv,sq,skv,causal", CASES, ids=str)
def test_per_head_is_each_head_alone(name, hq, hkv, sq, skv, causal):
    assert_per_head_is_each_head_alone(name, *qk(11, hq, hkv, sq, skv), causal)


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_mass", "nvfp4_mass_q8"])
@pytest.mark.parametrize("hq,hkv,sq,skv,causal", CASES[1::2], ids=str)
def test_per_head_nvfp4_is_each_head_alone(name, hq, hkv, sq, skv, causal):
    # The nvfp4 selectors quantize the whole Q and the whole K with one tensor scale (their
    # amax), a head passed alone with its own: with every head's amax that of the tensor the
    # two quantizations agree, and so must the lists.
    q, k = qk(11, hq, hkv, sq, skv)
    q[0, :, 0, 0], k[0, :, 0, 0] = 50, 50
    assert_per_head_is_each_head_alone(name, q, k, causal)


@pytest.mark.parametrize("keep_sink", [False, True])
@pytest.mark.parametrize("cap", [None, 4])
@pytest.mark.parametrize("hq,hkv,sq,skv,causal", CASES, ids=str)
def test_pooled_oracle_matches_reference(hq, hkv, sq, skv, causal, cap, keep_sink):
    q, k = qk(5, hq, hkv, sq, skv)
    q *= 2  # sharper attention: the heads' masses differ more, the pooling moves more blocks
    topk = 3
    n = -(-skv // TILE)
    width = cap or min(2 * topk, n)
    idx, cnt = sa.select("oracle", q, k, topk, causal=causal, keep_sink=keep_sink,
                         head_lists="pooled", pool_cap=cap)
    tiles = -(-sq // TILE)
    assert idx.shape == (1, hq, tiles, width) and cnt.shape == (1, hq, tiles)
    mass = tile_mass(q, k, causal)
    g = hq // hkv
    for kv in range(hkv):
        ri, rc = pool_reference(mass[kv * g:(kv + 1) * g], topk, width, sq, skv, causal,
                                keep_sink)
        np.testing.assert_array_equal(cnt[0, kv * g:(kv + 1) * g], rc, err_msg="group %d" % kv)
        np.testing.assert_array_equal(idx[0, kv * g:(kv + 1) * g], ri, err_msg="group %d" % kv)
    # The pooling is not per-head lists in disguise: some head keeps more than topk blocks (with
    # the sink forced too, two of a tile's three, these near-uniform masses may leave none over).
    assert cnt.max() > topk or keep_sink
    if causal:
        o, _ = sa.block_sparse_attention(q, k, k, idx, cnt, causal=True)  # list_heads Hq
        assert np.isfinite(o).all()


@pytest.mark.parametrize("topk", [1, 2])
def test_pooled_oracle_no_head_empty(topk):
    # Not causal, nothing forced: on this input (seed 0) some head of the group ranks below the
    # others everywhere in a tile, and keeps its best block all the same.
    q, k = qk(0, 4, 1, 1024, 1024)
    q *= 2
    idx, cnt = sa.select("oracle", q, k, topk, head_lists="pooled")
    ri, rc = pool_reference(tile_mass(q, k, False), topk, 2 * topk, 1024, 1024, False)
    np.testing.assert_array_equal(cnt[0], rc)
    np.testing.assert_array_equal(idx[0], ri)
    assert cnt.min() == 1 and (cnt.sum(axis=1) == 4 * topk).all()


@pytest.mark.parametrize("name", MASS_SELECTORS)
@pytest.mark.parametrize("causal", [True, False])
def test_pooled_at_cap_topk_is_per_head(name, causal):
    # pool_cap = topk: every head holds at most topk and the group H * topk, so each head keeps
    # exactly its own best topk, the per-head lists.
    q, k = qk(3, 4, 2, 1024, 1024)
    pi, pc = sa.select(name, q, k, 3, causal=causal, head_lists="pooled", pool_cap=3)
    hi, hc = sa.select(name, q, k, 3, causal=causal, head_lists="per_head")
    np.testing.assert_array_equal(pc, hc)
    np.testing.assert_array_equal(pi, hi)
    # and with room to pool, the group's total stays that of per-head lists, tile by tile
    qi, qc = sa.select(name, q, k, 3, causal=causal, head_lists="pooled")
    np.testing.assert_array_equal(qc.reshape(1, 2, 2, -1).sum(axis=2),
                                  hc.reshape(1, 2, 2, -1).sum(axis=2))
    assert qi.shape[-1] == 6


def test_selector_head_lists():
    sels = {s.name: s for s in sa.selectors()}
    for s in sels.values():
        assert isinstance(s.head_lists, tuple) and s.head_lists[0] == "group", s
    assert sels["nvfp4_query"].head_lists == ("group",)
    for s in sels.values():
        if not s.per_query:
            assert "per_head" in s.head_lists, s.name
    pooled = {s.name for s in sels.values() if "pooled" in s.head_lists}
    assert pooled == set(MASS_SELECTORS)
    assert sels["oracle"].head_lists == ("group", "per_head", "pooled")
    assert sels["r1"].head_lists == ("group", "per_head")


def test_head_lists_errors():
    q, k = qk(1, 4, 2, 256, 1024)
    with pytest.raises(ValueError, match=r"^head_lists must be one of 'group', 'per_head', "):
        sa.select("r1", q, k, 2, head_lists="pool")
    with pytest.raises(ValueError, match=r"^head_lists must be one of"):
        sa.select("r1", q, k, 2, head_lists=1)
    with pytest.raises(ValueError, match=r"^pool_cap is for head_lists='pooled' only"):
        sa.select("oracle", q, k, 2, pool_cap=4)
    with pytest.raises(ValueError, match=r"^pool_cap is for head_lists='pooled' only"):
        sa.select("oracle", q, k, 2, head_lists="per_head", pool_cap=4)
    with pytest.raises(TypeError, match=r"^pool_cap must be an int"):
        sa.select("oracle", q, k, 2, head_lists="pooled", pool_cap=4.0)
    for cap in (1, 9):
        with pytest.raises(ValueError, match=r"^pool_cap must lie in \[topk, kv_blocks\] = "
                                             r"\[2, 8\]"):
            sa.select("oracle", q, k, 2, head_lists="pooled", pool_cap=cap)
    with pytest.raises(sa.SparseAttnError) as e:
        sa.select("r1", q, k, 2, head_lists="pooled")
    assert e.value.name == "SA_ERR_UNSUPPORTED" and e.value.function == "sa_select_layout('r1')"
    assert "selector 'r1' takes head_lists 'group' or 'per_head', not 'pooled'" in str(e.value)
    with pytest.raises(sa.SparseAttnError) as e:
        sa.select("nvfp4_query", q, k, 2, head_lists="per_head")
    assert e.value.name == "SA_ERR_UNSUPPORTED"
    assert "selector 'nvfp4_query' takes head_lists 'group', not 'per_head'" in str(e.value)
