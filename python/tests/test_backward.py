"""attention_backward (the CPU reference's dQ, dK, dV) against a plain numpy backward in
float64 on the same BF16-rounded inputs, and its argument and library errors."""
import math

import numpy as np
import pytest

import sparseattn as sa
from conftest import TILE, bf16_np, causal_mask, qkv, query_mask, random_lists, tile_mask


def cdiv(a, b):
    return -(-a // b)


def backward_np(q, k, v, do, mask):
    """(dq, dk, dv) of L = sum(do * o), o the softmax attention of BHSD q, k, v where mask
    (B, Hq, Sq, Skv) is True, in float64 from the formulas: P = softmax(s), dV = P^T dO,
    dS = P (dO V^T - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q; dK and dV summed over
    each KV head's group. A row without a key contributes nothing."""
    q, k, v, do = (bf16_np(x).astype(np.float64) for x in (q, k, v, do))
    hkv = k.shape[1]
    g = q.shape[1] // hkv
    kr, vr = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = np.where(mask, q @ kr.transpose(0, 1, 3, 2) * scale, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    p = p / np.where(l > 0, l, 1.0)
    o = p @ vr
    ds = p * (do @ vr.transpose(0, 1, 3, 2) - (do * o).sum(axis=-1, keepdims=True))
    dq = scale * ds @ kr
    dk = scale * ds.transpose(0, 1, 3, 2) @ q
    dv = p.transpose(0, 1, 3, 2) @ do
    fold = lambda x: x.reshape(x.shape[0], hkv, g, *x.shape[2:]).sum(axis=2)
    return dq, fold(dk), fold(dv)


def assert_grads(got, want):
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert a.dtype == np.float32 and a.shape == b.shape, name
        scale = max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5 * scale, err_msg=name)


# (B, Hq, Hkv, Sq, Skv, D): GQA with partial last tile and block; MQA; len_q > len_kv; D 128.
SHAPES = [(1, 2, 2, 130, 200, 64), (2, 4, 2, 200, 300, 64), (1, 4, 1, 100, 260, 64),
          (1, 2, 1, 300, 129, 64), (1, 2, 1, 140, 150, 128)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_dense_backward(rng, shape, causal):
    b, hq, hkv, sq, skv, d = shape
    q, k, v = qkv(rng, b, hq, hkv, sq, skv, d)
    do = rng.standard_normal(q.shape, dtype=np.float32)
    o, lse = sa.dense_attention(q, k, v, causal=causal)
    got = sa.attention_backward(q, k, v, o, lse, do, causal=causal)
    mask = causal_mask(b, hq, sq, skv) if causal else np.ones((b, hq, sq, skv), bool)
    assert_grads(got, backward_np(q, k, v, do, mask))


@pytest.mark.parametrize("shape", SHAPES[:4], ids=str)
@pytest.mark.parametrize("per_head", [False, True], ids=["list_heads=Hkv", "list_heads=Hq"])
def test_tile_backward(rng, shape, per_head):
    b, hq, hkv, sq, skv, d = shape
    q, k, v = qkv(rng, b, hq, hkv, sq, skv, d)
    do = rng.standard_normal(q.shape, dtype=np.float32)
    nb = cdiv(skv, TILE)
    lh = hq if per_head else hkv
    idx, cnt = random_lists(rng, (b, lh, cdiv(sq, TILE)), nb, min(nb, 2))
    cnt.flat[0] = 0  # an empty row
    o, lse = sa.block_sparse_attention(q, k, v, idx, cnt)
    dq, dk, dv = sa.attention_backward(q, k, v, o, lse, do, idx, cnt)
    assert_grads((dq, dk, dv),
                 backward_np(q, k, v, do, tile_mask((b, hq, sq, skv), idx, cnt)))
    assert np.all(dq[0, :hq // lh, :min(sq, TILE)] == 0)  # the empty row's queries


@pytest.mark.parametrize("shape", SHAPES[:4], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_query_backward(rng, shape, causal):
    b, hq, hkv, sq, skv, d = shape
    q, k, v = qkv(rng, b, hq, hkv, sq, skv, d)
    do = rng.standard_normal(q.shape, dtype=np.float32)
    nb = cdiv(skv, TILE)
    idx, cnt = random_lists(rng, (b, hkv, sq), nb, min(nb, 2))
    flags = dict(causal=causal, allow_future_blocks=causal)
    o, lse = sa.query_sparse_attention(q, k, v, idx, cnt, **flags)
    got = sa.attention_backward(q, k, v, o, lse, do, idx, cnt, per_query=True, **flags)
    mask = query_mask((b, hq, sq, skv), hkv, idx, cnt)
    if causal:
        mask = mask & causal_mask(b, hq, sq, skv)
    assert_grads(got, backward_np(q, k, v, do, mask))


def test_bshd_and_bf16_bits(rng):
    q, k, v = qkv(rng, 2, 4, 2, 200, 300, 64)
    do = rng.standard_normal(q.shape, dtype=np.float32)
    o, lse = sa.dense_attention(q, k, v, causal=True)
    ref = sa.attention_backward(q, k, v, o, lse, do, causal=True)
    t = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    got = sa.attention_backward(t(q), t(k), t(v), t(o), lse, t(do), layout="bshd", causal=True)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, t(b))
    bits = sa.attention_backward(sa.bf16_bits(q), sa.bf16_bits(k), sa.bf16_bits(v), o, lse,
                                 sa.bf16_bits(do), causal=True)
    for a, b in zip(bits, ref):
        np.testing.assert_array_equal(a, b)


@pytest.fixture
def fwd(rng):
    q, k, v = qkv(rng, 1, 2, 1, 256, 384, 64)
    do = rng.standard_normal(q.shape, dtype=np.float32)
    idx = np.array([[[[0, 2], [1, 2]]]], np.int32)  # (1, 1, 2, 2)
    o, lse = sa.block_sparse_attention(q, k, v, idx)
    return q, k, v, o, lse, do, idx


def test_argument_errors(fwd):
    q, k, v, o, lse, do, idx = fwd
    with pytest.raises(TypeError, match=r"^o must be a numpy array"):
        sa.attention_backward(q, k, v, o.tolist(), lse, do, idx)
    with pytest.raises(TypeError, match=r"^do must be float32"):
        sa.attention_backward(q, k, v, o, lse, do.astype(np.float64), idx)
    with pytest.raises(TypeError, match=r"^o must be float32"):
        sa.attention_backward(q, k, v, o.astype(np.int32), lse, do, idx)
    with pytest.raises(ValueError, match=r"^o must have shape q's shape"):
        sa.attention_backward(q, k, v, o[:, :1], lse, do, idx)
    with pytest.raises(ValueError, match=r"^do must have shape"):
        sa.attention_backward(q, k, v, o, lse, do[..., :32], idx)
    with pytest.raises(ValueError, match=r"^lse must have shape \(B, Hq, Sq\)"):
        sa.attention_backward(q, k, v, o, lse[..., :-1], do, idx)
    with pytest.raises(ValueError, match=r"^counts needs indices"):
        sa.attention_backward(q, k, v, o, lse, do, counts=np.zeros((1, 1, 2), np.int32))
    with pytest.raises(ValueError, match=r"^per_query needs indices"):
        sa.attention_backward(q, k, v, o, lse, do, per_query=True)
    with pytest.raises(ValueError, match=r"^indices must be 4-D \(B, heads_kv, len_q"):
        sa.attention_backward(q, k, v, o, lse, do, idx, per_query=True)
    with pytest.raises(TypeError, match=r"^causal must be True or False"):
        sa.attention_backward(q, k, v, o, lse, do, idx, causal=2)


def test_library_errors(fwd):
    q, k, v, o, lse, do, idx = fwd
    bad = idx.copy()
    bad[0, 0, 1, 1] = 3  # 3 blocks of 128 keys: index 3 is out of range
    with pytest.raises(sa.SparseAttnError) as e:
        sa.attention_backward(q, k, v, o, lse, do, bad)
    assert e.value.name == "SA_ERR_INDEX" and e.value.function == "sa_ref_tile_sparse_backward"
    dup = idx.copy()
    dup[0, 0, 0, 1] = 0
    with pytest.raises(sa.SparseAttnError, match="SA_ERR_DUPLICATE"):
        sa.attention_backward(q, k, v, o, lse, do, dup)
    with pytest.raises(sa.SparseAttnError, match="SA_ERR_EMPTY_ROW"):
        sa.attention_backward(q, k, v, o, lse, do, idx, np.array([[[0, 2]]], np.int32),
                              allow_empty_rows=False)
    # 256 queries, 384 keys, causal: tile 0 (last key 255) sees blocks 0 and 1; block 2 is future.
    with pytest.raises(sa.SparseAttnError, match="SA_ERR_FUTURE_BLOCK"):
        sa.attention_backward(q, k, v, o, lse, do, idx, causal=True)
    sa.attention_backward(q, k, v, o, lse, do, idx, causal=True, allow_future_blocks=True)
    qs = np.zeros((1, 1, 256, 2), np.int32)
    with pytest.raises(sa.SparseAttnError) as e:
        sa.attention_backward(q, k, v, o, lse, do, qs, per_query=True)
    assert e.value.name == "SA_ERR_DUPLICATE" and e.value.function == "sa_ref_query_sparse_backward"
    with pytest.raises(sa.SparseAttnError) as e:
        sa.attention_backward(q, k, v, o, lse, do, np.full((1, 1, 256, 1), 9, np.int32),
                              per_query=True)
    assert e.value.name == "SA_ERR_INDEX"
