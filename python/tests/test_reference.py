"""The CPU path (numpy arrays) against a plain numpy softmax attention."""
import numpy as np
import pytest

import sparseattn as sa
from conftest import (TILE, assert_close, attention_np, bf16_np, causal_mask, qkv, query_mask,
                      random_lists, tile_mask)

# (B, Hq, Hkv, Sq, Skv, D): one tile and block; GQA with a partial last tile and block; MQA;
# more queries than one tile with few keys; D 128.
SHAPES = [(1, 1, 1, 128, 128, 64), (2, 4, 2, 200, 300, 64), (1, 4, 1, 130, 520, 64),
          (1, 2, 2, 300, 129, 64), (1, 2, 1, 256, 384, 128)]


def cdiv(a, b):
    return -(-a // b)


def test_bf16_rounding_matches_numpy(rng):
    x = rng.standard_normal(10000, dtype=np.float32) * 100
    # exact ties: 1 + 2^-8 rounds down to 1 (even), 1 + 3 * 2^-8 up to 1 + 2^-6
    ties = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 0.0, -0.0], np.float32)
    for a in (x, ties):
        np.testing.assert_array_equal(sa.bf16_round(a), bf16_np(a))
        np.testing.assert_array_equal(sa.bf16_to_float32(sa.bf16_bits(a)), bf16_np(a))
    assert sa.bf16_bits(np.float32([1.0]))[0] == 0x3F80


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("per_head", [False, True], ids=["list_heads=Hkv", "list_heads=Hq"])
def test_block_sparse_matches_numpy(rng, shape, per_head):
    b, hq, hkv, sq, skv, d = shape
    q, k, v = qkv(rng, b, hq, hkv, sq, skv, d)
    nb = cdiv(skv, TILE)
    lh = hq if per_head else hkv
    idx, cnt = random_lists(rng, (b, lh, cdiv(sq, TILE)), nb, min(nb, 3))
    o, lse = sa.block_sparse_attention(q, k, v, idx, cnt)
    assert o.shape == q.shape and o.dtype == np.float32
    assert lse.shape == (b, hq, sq) and lse.dtype == np.float32
    o_ref, lse_ref = attention_np(q, k, v, tile_mask((b, hq, sq, skv), idx, cnt))
    assert_close(o, lse, o_ref, lse_ref)


def test_counts_none_uses_every_entry(rng):
    q, k, v = qkv(rng, 1, 2, 1, 256, 512, 64)
    idx, _ = random_lists(rng, (1, 1, 2), 4, 2)
    o, lse = sa.block_sparse_attention(q, k, v, idx)
    o_ref, lse_ref = attention_np(q, k, v, tile_mask((1, 2, 256, 512), idx))
    assert_close(o, lse, o_ref, lse_ref)


def test_empty_rows_give_zero_and_minus_inf(rng):
    q, k, v = qkv(rng, 1, 1, 1, 256, 256, 64)
    idx = np.array([[[[0], [1]]]], np.int32)
    cnt = np.array([[[0, 1]]], np.int32)
    o, lse = sa.block_sparse_attention(q, k, v, idx, cnt)
    assert np.all(o[0, 0, :128] == 0) and np.all(np.isneginf(lse[0, 0, :128]))
    assert np.all(np.isfinite(lse[0, 0, 128:]))


@pytest.mark.parametrize("shape", [(2, 4, 2, 200, 300, 64), (1, 2, 1, 256, 384, 128)], ids=str)
def test_bshd_is_bhsd_transposed(rng, shape):
    b, hq, hkv, sq, skv, d = shape
    q, k, v = qkv(rng, b, hq, hkv, sq, skv, d)
    idx, cnt = random_lists(rng, (b, hkv, cdiv(sq, TILE)), cdiv(skv, TILE), 2)
    o, lse = sa.block_sparse_attention(q, k, v, idx, cnt)
    t = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    o2, lse2 = sa.block_sparse_attention(t(q), t(k), t(v), idx, cnt, layout="bshd")
    assert o2.shape == (b, sq, hq, d) and o2.flags.c_contiguous
    np.testing.assert_array_equal(o2, t(o))
    np.testing.assert_array_equal(lse2, lse)
    od, lsed = sa.dense_attention(t(q), t(k), t(v), layout="bshd")
    od_ref, lsed_ref = sa.dense_attention(q, k, v)
    np.testing.assert_array_equal(od, t(od_ref))
    np.testing.assert_array_equal(lsed, lsed_ref)


def test_bf16_bits_input_equals_float32_input(rng):
    q, k, v = qkv(rng, 1, 2, 1, 128, 256, 64)
    idx = np.array([[[[1, 0]]]], np.int32)
    o, lse = sa.block_sparse_attention(q, k, v, idx)
    o2, lse2 = sa.block_sparse_attention(*(sa.bf16_bits(x) for x in (q, k, v)), idx)
    np.testing.assert_array_equal(o, o2)
    np.testing.assert_array_equal(lse, lse2)


def test_index_lists_of_other_integer_types(rng):
    q, k, v = qkv(rng, 1, 1, 1, 128, 384, 64)
    o, lse = sa.block_sparse_attention(q, k, v, np.array([[[[2, 0]]]], np.int32))
    for idx in ([[[[2, 0]]]], np.array([[[[2, 0]]]], np.int64), np.array([[[[2, 0]]]], np.uint8)):
        o2, lse2 = sa.block_sparse_attention(q, k, v, idx)
        np.testing.assert_array_equal(o, o2)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dense_matches_numpy(rng, shape):
    b, hq, hkv, sq, skv, d = shape
    q, k, v = qkv(rng, b, hq, hkv, sq, skv, d)
    o, lse = sa.dense_attention(q, k, v)
    o_ref, lse_ref = attention_np(q, k, v, np.ones((b, hq, sq, skv), bool))
    assert_close(o, lse, o_ref, lse_ref)


def test_every_block_listed_is_dense(rng):
    q, k, v = qkv(rng, 1, 4, 2, 200, 300, 64)
    full = np.broadcast_to(np.arange(3, dtype=np.int32), (1, 2, 2, 3))
    o, lse = sa.block_sparse_attention(q, k, v, full)
    od, lsed = sa.dense_attention(q, k, v)
    np.testing.assert_allclose(o, od, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, lsed, rtol=1e-6)


# (Sq, Skv): square, chunked prefill (fewer queries than keys), more queries than keys.
CAUSAL = [(256, 256), (200, 300), (128, 520), (300, 129)]


@pytest.mark.parametrize("sq,skv", CAUSAL, ids=str)
def test_causal_dense_matches_numpy(rng, sq, skv):
    q, k, v = qkv(rng, 1, 2, 1, sq, skv, 64)
    o, lse = sa.dense_attention(q, k, v, causal=True)
    o_ref, lse_ref = attention_np(q, k, v, causal_mask(1, 2, sq, skv))
    assert_close(o, lse, o_ref, lse_ref)


@pytest.mark.parametrize("sq,skv", CAUSAL, ids=str)
def test_causal_block_sparse_matches_numpy(rng, sq, skv):
    q, k, v = qkv(rng, 1, 2, 1, sq, skv, 64)
    nb = cdiv(skv, TILE)
    idx, cnt = random_lists(rng, (1, 1, cdiv(sq, TILE)), nb, min(nb, 3))
    o, lse = sa.block_sparse_attention(q, k, v, idx, cnt, causal=True, allow_future_blocks=True)
    mask = tile_mask((1, 2, sq, skv), idx, cnt) & causal_mask(1, 2, sq, skv)
    o_ref, lse_ref = attention_np(q, k, v, mask)
    assert_close(o, lse, o_ref, lse_ref)


def test_causal_future_block_is_refused(rng):
    q, k, v = qkv(rng, 1, 1, 1, 256, 256, 64)
    idx = np.array([[[[0, 1], [0, 1]]]], np.int32)  # tile 0 sees no key of block 1
    with pytest.raises(sa.SparseAttnError) as e:
        sa.block_sparse_attention(q, k, v, idx, causal=True)
    assert e.value.code == -18 and e.value.name == "SA_ERR_FUTURE_BLOCK"
    sa.block_sparse_attention(q, k, v, idx, causal=True, allow_future_blocks=True)


@pytest.mark.parametrize("shape", [(1, 1, 1, 128, 256, 64), (2, 4, 2, 200, 300, 64),
                                   (1, 2, 1, 130, 384, 128)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_query_sparse_matches_numpy(rng, shape, causal):
    b, hq, hkv, sq, skv, d = shape
    q, k, v = qkv(rng, b, hq, hkv, sq, skv, d)
    nb = cdiv(skv, TILE)
    idx, cnt = random_lists(rng, (b, hkv, sq), nb, min(nb, 2))
    o, lse = sa.query_sparse_attention(q, k, v, idx, cnt, causal=causal,
                                       allow_future_blocks=causal)
    mask = query_mask((b, hq, sq, skv), hkv, idx, cnt)
    if causal:
        mask &= causal_mask(b, hq, sq, skv)
    o_ref, lse_ref = attention_np(q, k, v, mask)
    assert_close(o, lse, o_ref, lse_ref)


def test_query_lists_of_a_tile_equal_its_tile_list(rng):
    q, k, v = qkv(rng, 1, 4, 2, 256, 512, 64)
    idx, cnt = random_lists(rng, (1, 2, 2), 4, 3, empty_rows=False)
    o, lse = sa.block_sparse_attention(q, k, v, idx, cnt)
    qidx = np.repeat(idx, TILE, axis=2)
    qcnt = np.repeat(cnt, TILE, axis=2)
    o2, lse2 = sa.query_sparse_attention(q, k, v, qidx, qcnt)
    np.testing.assert_allclose(o2, o, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse2, lse, rtol=1e-6)


def test_validate_false_skips_the_duplicate_check(rng):
    q, k, v = qkv(rng, 1, 1, 1, 128, 256, 64)
    dup = np.array([[[[1, 1]]]], np.int32)
    with pytest.raises(sa.SparseAttnError):
        sa.block_sparse_attention(q, k, v, dup)
    o, lse = sa.block_sparse_attention(q, k, v, dup, validate=False)  # the block counts twice
    o1, lse1 = sa.block_sparse_attention(q, k, v, dup[..., :1])
    np.testing.assert_allclose(o, o1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, lse1 + np.log(2), rtol=1e-5)
