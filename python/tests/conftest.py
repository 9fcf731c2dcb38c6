"""Shared helpers: a plain numpy attention (float64 on BF16-rounded inputs) that the library's
reference is compared against, and masks built from block lists."""
import math

import numpy as np
import pytest

TILE = 128


def bf16_np(x):
    """Round float32 to BF16 (nearest even) in numpy alone, independent of the library."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
    return (r.astype(np.uint32) << 16).view(np.float32)


def attention_np(q, k, v, mask):
    """Softmax attention of BHSD q, k, v (GQA by repeating K/V heads) where mask (B, Hq, Sq,
    Skv) is True. Returns (o, lse) in float64; a row without a key gives O = 0, LSE = -inf."""
    q, k, v = (bf16_np(x).astype(np.float64) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    empty = ~mask.any(axis=-1)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    o = (p @ v) / np.where(l > 0, l, 1.0)
    lse = (m + np.log(np.where(l > 0, l, 1.0)))[..., 0]
    o[empty] = 0.0
    lse[empty] = -np.inf
    return o, lse


def causal_mask(b, hq, sq, skv):
    i = np.arange(sq)[:, None]
    j = np.arange(skv)[None, :]
    return np.broadcast_to(j <= i + (skv - sq), (b, hq, sq, skv))


def tile_mask(shape, indices, counts=None):
    """(B, Hq, Sq, Skv) mask of tile lists indices (B, L, q_tiles, max_blocks)."""
    b_, hq, sq, skv = shape
    L = indices.shape[1]
    mask = np.zeros((b_, hq, sq, skv), bool)
    for b in range(b_):
        for h in range(hq):
            lh = h // (hq // L)
            for t in range(indices.shape[2]):
                n = indices.shape[3] if counts is None else counts[b, lh, t]
                for blk in indices[b, lh, t, :n]:
                    mask[b, h, t * TILE:(t + 1) * TILE, blk * TILE:(blk + 1) * TILE] = True
    return mask


def query_mask(shape, hkv, indices, counts=None):
    """(B, Hq, Sq, Skv) mask of per-query lists indices (B, Hkv, Sq, max_blocks)."""
    b_, hq, sq, skv = shape
    g = hq // hkv
    mask = np.zeros((b_, hq, sq, skv), bool)
    for b in range(b_):
        for h in range(hq):
            for i in range(sq):
                n = indices.shape[3] if counts is None else counts[b, h // g, i]
                for blk in indices[b, h // g, i, :n]:
                    mask[b, h, i, blk * TILE:(blk + 1) * TILE] = True
    return mask


def random_lists(rng, rows_shape, kv_blocks, max_blocks, empty_rows=True):
    """Lists without duplicates: indices rows_shape + (max_blocks,), counts rows_shape (some 0
    when empty_rows)."""
    n = int(np.prod(rows_shape))
    idx = np.stack([rng.permutation(kv_blocks)[:max_blocks] for _ in range(n)]).astype(np.int32)
    cnt = rng.integers(0 if empty_rows else 1, max_blocks + 1, size=n).astype(np.int32)
    return idx.reshape(tuple(rows_shape) + (max_blocks,)), cnt.reshape(rows_shape)


def qkv(rng, b, hq, hkv, sq, skv, d):
    return (rng.standard_normal((b, hq, sq, d), dtype=np.float32),
            rng.standard_normal((b, hkv, skv, d), dtype=np.float32),
            rng.standard_normal((b, hkv, skv, d), dtype=np.float32))


def assert_close(o, lse, o_ref, lse_ref, rtol=1e-4, atol=2e-5):
    o, lse = np.asarray(o, np.float64), np.asarray(lse, np.float64)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_ref))
    fin = np.isfinite(lse_ref)
    np.testing.assert_allclose(lse[fin], lse_ref[fin], rtol=rtol, atol=atol)
    np.testing.assert_allclose(o, o_ref, rtol=rtol, atol=atol)


@pytest.fixture
def rng():
    return np.random.default_rng(20261201)
