"""Bad arguments: Python-side checks name the argument; library codes come back as
SparseAttnError with sa_strerror's text and the code."""
import numpy as np
import pytest

import sparseattn as sa
from conftest import qkv


@pytest.fixture
def inputs(rng):
    q, k, v = qkv(rng, 1, 2, 1, 256, 384, 64)
    idx = np.array([[[[0, 2], [1, 2]]]], np.int32)  # (1, 1, 2, 2)
    cnt = np.array([[[2, 1]]], np.int32)
    return q, k, v, idx, cnt


def test_dtype(inputs):
    q, k, v, idx, cnt = inputs
    with pytest.raises(TypeError, match=r"^q must be float32 .* got float64"):
        sa.block_sparse_attention(q.astype(np.float64), k, v, idx)
    with pytest.raises(TypeError, match=r"^v must be float32"):
        sa.dense_attention(q, k, v.astype(np.float16))
    with pytest.raises(TypeError, match=r"^indices must hold integers"):
        sa.block_sparse_attention(q, k, v, idx.astype(np.float32))
    with pytest.raises(TypeError, match=r"^counts must hold integers"):
        sa.block_sparse_attention(q, k, v, idx, cnt.astype(bool))
    with pytest.raises(TypeError, match=r"^k must be a numpy array or a torch tensor, got list"):
        sa.dense_attention(q, k.tolist(), v)
    with pytest.raises(ValueError, match=r"^indices holds values outside int32"):
        sa.block_sparse_attention(q, k, v, idx.astype(np.int64) + 2**40)


def test_shapes(inputs):
    q, k, v, idx, cnt = inputs
    with pytest.raises(ValueError, match=r"^k must be 4-D \(B, H, S, D\) for layout 'bhsd'"):
        sa.dense_attention(q, k[0], v)
    with pytest.raises(ValueError, match=r"^q must be 4-D \(B, S, H, D\) for layout 'bshd'"):
        sa.dense_attention(q[0], k, v, layout="bshd")
    with pytest.raises(ValueError, match=r"^v must have k's shape"):
        sa.dense_attention(q, k, v[:, :, :200])
    with pytest.raises(ValueError, match=r"^k's head_dim \(32\) differs from q's \(64\)"):
        sa.dense_attention(q, k[..., :32], v[..., :32])
    with pytest.raises(ValueError, match=r"^k's batch"):
        sa.dense_attention(q, np.concatenate([k, k]), np.concatenate([v, v]))
    with pytest.raises(ValueError, match=r"multiple of k's heads"):
        q3 = np.concatenate([q, q[:, :1]], axis=1)
        sa.dense_attention(q3, np.concatenate([k, k], axis=1), np.concatenate([v, v], axis=1))
    with pytest.raises(ValueError, match=r"^q has an empty dimension"):
        sa.dense_attention(q[:, :, :0], k, v)
    with pytest.raises(ValueError, match=r"^indices must be 4-D \(B, list_heads, q_tiles"):
        sa.block_sparse_attention(q, k, v, idx[:, :, :1])
    with pytest.raises(ValueError, match=r"^indices.shape\[1\] \(list heads\)"):
        sa.block_sparse_attention(q, k, v, np.concatenate([idx] * 3, axis=1))
    with pytest.raises(ValueError, match=r"^counts must have shape"):
        sa.block_sparse_attention(q, k, v, idx, cnt[..., :1])
    with pytest.raises(ValueError, match=r"^indices must be 4-D \(B, heads_kv, len_q"):
        sa.query_sparse_attention(q, k, v, idx)


def test_options(inputs):
    q, k, v, idx, cnt = inputs
    with pytest.raises(ValueError, match=r"^layout must be 'bhsd' or 'bshd', got 'bsdh'"):
        sa.block_sparse_attention(q, k, v, idx, layout="bsdh")
    with pytest.raises(TypeError, match=r"^validate must be True or False, got 2"):
        sa.block_sparse_attention(q, k, v, idx, validate=2)
    with pytest.raises(ValueError, match=r"^stage applies to the GPU path"):
        sa.block_sparse_attention(q, k, v, idx, stage=17)
    with pytest.raises(ValueError, match=r"^verdict applies to the GPU path"):
        sa.block_sparse_attention(q, k, v, idx, verdict=object())
    with pytest.raises(ValueError, match=r"^partial_format must be"):
        sa.query_sparse_attention(q, k, v, idx, partial_format="fp8")
    with pytest.raises(ValueError, match=r"^schedule must be"):
        sa.query_sparse_attention(q, k, v, idx, schedule="auto")
    # An int option: a non-int is a TypeError, an int out of range a ValueError (integer()).
    for bad in (0, 129, -1, 2**32 + 64):
        with pytest.raises(ValueError, match=r"^hybrid_share must lie in \[1, 128\], got %d$"
                                             % bad):
            sa.query_sparse_attention(q, k, v, idx, schedule="hybrid", hybrid_share=bad)
    for bad in (48.0, True, np.bool_(True), "48"):
        with pytest.raises(TypeError, match=r"^hybrid_share must be an int or None, got "):
            sa.query_sparse_attention(q, k, v, idx, schedule="hybrid", hybrid_share=bad)
    per_query = np.tile(np.array([0, 2], np.int32), (1, 1, 256, 1))  # (B, Hkv, Sq, 2)
    o, _ = sa.query_sparse_attention(q, k, v, per_query, schedule="hybrid",
                                     hybrid_share=np.int64(64))  # a numpy int is an int
    assert o.shape == q.shape


@pytest.mark.parametrize("case,code,name", [
    ("index", -5, "SA_ERR_INDEX"),
    ("duplicate", -6, "SA_ERR_DUPLICATE"),
    ("count", -7, "SA_ERR_COUNT"),
    ("empty", -8, "SA_ERR_EMPTY_ROW"),
])
def test_list_errors_carry_code_and_text(inputs, case, code, name):
    q, k, v, idx, cnt = inputs
    idx, cnt = idx.copy(), cnt.copy()
    kw = {}
    if case == "index":
        idx[0, 0, 1, 0] = 3  # 3 blocks of 128 in 384 keys
    elif case == "duplicate":
        idx[0, 0, 0, 1] = 0
    elif case == "count":
        cnt[0, 0, 1] = 3
    else:
        cnt[0, 0, 0] = 0
        kw["allow_empty_rows"] = False
    with pytest.raises(sa.SparseAttnError) as e:
        sa.block_sparse_attention(q, k, v, idx, cnt, **kw)
    err = e.value
    assert (err.code, err.name, err.function) == (code, name, "sa_ref_tile_sparse")
    assert err.message == sa.strerror(code)
    assert str(err) == "sa_ref_tile_sparse: %s (%s = %d)" % (sa.strerror(code), name, code)
    assert isinstance(err, RuntimeError)


def test_head_dim_unsupported_by_the_reference(rng):
    q, k, v = qkv(rng, 1, 1, 1, 128, 128, 96)
    with pytest.raises(sa.SparseAttnError) as e:
        sa.dense_attention(q, k, v)
    assert e.value.code == -4 and e.value.function == "sa_ref_dense_opts"


def test_per_query_errors(rng):
    q, k, v = qkv(rng, 1, 2, 1, 130, 256, 64)
    idx = np.zeros((1, 1, 130, 1), np.int32)
    idx[0, 0, 129, 0] = 2
    with pytest.raises(sa.SparseAttnError) as e:
        sa.query_sparse_attention(q, k, v, idx)
    assert e.value.code == -5 and e.value.function == "sa_ref_query_sparse"


@pytest.mark.skipif(sa.gpu_available(), reason="a GPU is present")
def test_verdict_without_gpu():
    with pytest.raises(sa.SparseAttnError) as e:
        sa.Verdict()
    assert e.value.name in ("SA_ERR_NO_DEVICE", "SA_ERR_NOT_BUILT")
