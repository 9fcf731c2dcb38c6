"""What the benchmarks (bench/peers.py, bench/clocks.py, bench/causal.py) take from the package
instead of keeping their own struct mirrors: gpu_attn_default, Stage.launcher, stage_table and
random_tile_lists (sparseattn._gpu)."""
import ctypes

import numpy as np
import pytest

import sparseattn as sa
from sparseattn import _capi, _gpu
from conftest import qkv


def test_gpu_attn_default_is_the_library_default():
    a = _gpu.gpu_attn_default()
    assert isinstance(a, _capi.SaGpuAttn)
    assert (a.validate, a.allow_empty_rows, a.causal, a.allow_future_blocks) == (1, 1, 0, 0)
    assert not any((a.q, a.k, a.v, a.o, a.lse, a.stream, a.verdict, a.lists.indices,
                    a.lists.counts))
    assert (a.shape.batch, a.lists.list_heads, a.lists.max_blocks) == (0, 0, 0)
    b = _gpu.gpu_attn_default()
    b.validate = 0
    assert a.validate == 1  # a new struct each call


def test_stage_table_lists_the_registry():
    table = _gpu.stage_table()
    assert table == [{"id": s.id, "name": s.name, "sparse": s.sparse, "roles": s.roles}
                     for s in sa.stages()]
    if sa.stages():
        assert all(isinstance(r["roles"], int) and isinstance(r["name"], str) for r in table)
        assert any(r["sparse"] and r["roles"] & sa.SA_ROLE_DEFAULT_TILE for r in table)
    else:  # a build without CUDA
        assert table == []


@pytest.mark.parametrize("pattern", [_capi.SA_LISTS_INDEPENDENT, _capi.SA_LISTS_PAIRED])
def test_random_tile_lists(pattern):
    shape = (2, 4, 2, 640, 2048, 128)  # 5 Q tiles (odd: the last one has no pair), 16 blocks
    x = _gpu.random_tile_lists(shape, 2, 6, pattern, 11)
    assert x.shape == (2, 2, 5, 6) and x.dtype == np.int32 and x.flags.c_contiguous
    for row in x.reshape(-1, 6).tolist():
        assert row == sorted(set(row)) and 0 <= row[0] and row[-1] < 16
    if pattern == _capi.SA_LISTS_PAIRED:
        assert np.array_equal(x[:, :, 0], x[:, :, 1]) and np.array_equal(x[:, :, 2], x[:, :, 3])
    # The C call itself, into a ctypes buffer: the same values.
    buf = (ctypes.c_int32 * x.size)()
    s = _capi.SaShape(*shape)
    assert sa._core.lib.sa_random_tile_lists(ctypes.byref(s), 2, 6, pattern, 11, buf) == 0
    assert list(buf) == x.reshape(-1).tolist()
    assert np.array_equal(_gpu.random_tile_lists(s, 2, 6, pattern, 11), x)  # SaShape or tuple
    assert not np.array_equal(_gpu.random_tile_lists(shape, 2, 6, pattern, 12), x)


def test_random_tile_lists_feed_the_reference(rng):
    q, k, v = qkv(rng, 1, 4, 2, 256, 1024, 64)
    ind = _gpu.random_tile_lists((1, 4, 2, 256, 1024, 64), 4, 3, seed=5)
    o, lse = sa.block_sparse_attention(q, k, v, ind)  # validated: distinct, in range
    assert o.shape == q.shape and np.all(np.isfinite(lse))


@pytest.mark.parametrize("args, code", [
    ((3, 4, _capi.SA_LISTS_INDEPENDENT), "SA_ERR_LIST_HEADS"),  # 3 is neither Hkv nor Hq
    ((2, 17, _capi.SA_LISTS_INDEPENDENT), "SA_ERR_ARG"),  # more blocks than the 16 there are
    ((2, 0, _capi.SA_LISTS_INDEPENDENT), "SA_ERR_ARG"),
    ((2, 4, 2), "SA_ERR_ARG"),  # no such pattern
])
def test_random_tile_lists_errors(args, code):
    list_heads, k, pattern = args
    with pytest.raises(sa.SparseAttnError) as e:
        _gpu.random_tile_lists((2, 4, 2, 640, 2048, 128), list_heads, k, pattern, 1)
    assert e.value.name == code and e.value.function == "sa_random_tile_lists"


def test_random_tile_lists_argument_checks():
    """Its ints are judged against their C parameters (int; the seed uint64_t) before the call:
    ctypes would wrap them (seed -1 to 2**64 - 1, pattern 2**32 to 0) or take 1.5 as 1."""
    shape = (2, 4, 2, 640, 2048, 128)
    for seed in (-1, 2**64):
        with pytest.raises(ValueError, match=r"^seed must lie in \[0, 18446744073709551615\], "
                                             r"got %d$" % seed):
            _gpu.random_tile_lists(shape, 2, 6, seed=seed)
    for seed in (1.5, True, "1"):
        with pytest.raises(TypeError, match=r"^seed must be an int, got "):
            _gpu.random_tile_lists(shape, 2, 6, seed=seed)
    with pytest.raises(ValueError, match=r"^pattern must lie in \[-2147483648, 2147483647\], "
                                         r"got 4294967296$"):
        _gpu.random_tile_lists(shape, 2, 6, 2**32)
    with pytest.raises(TypeError, match=r"^pattern must be an int, got 0.0$"):
        _gpu.random_tile_lists(shape, 2, 6, 0.0)
    with pytest.raises(ValueError, match=r"^max_blocks must lie in \[-2147483648, 2147483647\]"):
        _gpu.random_tile_lists(shape, 2, 2**32 + 6)
    for name, bad in (("list_heads", 2.0), ("max_blocks", np.float32(6)),
                      ("list_heads", np.bool_(True))):
        with pytest.raises(TypeError, match=r"^%s must be an int, got " % name):
            _gpu.random_tile_lists(shape, **dict(dict(list_heads=2, max_blocks=6), **{name: bad}))
    with pytest.raises(TypeError, match=r"^len_q must be an int, got 640.0$"):
        _gpu.random_tile_lists((2, 4, 2, 640.0, 2048, 128), 2, 6)
    with pytest.raises(ValueError, match=r"^heads_q must lie in \[-2147483648, 2147483647\]"):
        _gpu.random_tile_lists((2, 2**32 + 4, 2, 640, 2048, 128), 2, 6)
    with pytest.raises(ValueError, match=r"^shape must be an SaShape or \(batch, heads_q, "):
        _gpu.random_tile_lists(shape + (1,), 2, 6)
    # In range for C, the library judges them (a negative size: SA_ERR_SHAPE).
    with pytest.raises(sa.SparseAttnError) as e:
        _gpu.random_tile_lists((2, 4, 2, -640, 2048, 128), 2, 6)
    assert e.value.name == "SA_ERR_SHAPE"
    # numpy ints are ints: the same lists as Python ints.
    x = _gpu.random_tile_lists(tuple(np.int64(d) for d in shape), np.int32(2), np.uint8(6),
                               np.int64(_capi.SA_LISTS_PAIRED), np.uint64(2**64 - 1))
    assert np.array_equal(x, _gpu.random_tile_lists(shape, 2, 6, _capi.SA_LISTS_PAIRED,
                                                    2**64 - 1))


def test_launcher_without_a_gpu_raises_the_stage_status():
    st = sa.stages()
    if not st:
        pytest.skip("the library was built without CUDA: no stage to launch")
    if sa.gpu_available():
        pytest.skip("a GPU is present: test_launcher_matches_block_sparse_attention runs")
    a = _gpu.gpu_attn_default()
    a.shape = _capi.SaShape(1, 1, 1, 128, 128, 128)
    a.q = a.k = a.v = a.o = 1 << 20  # never read: the launch stops at the missing device
    a.lists = _capi.SaTileLists(1 << 20, None, 1, 1)
    run = st[0].launcher(a)
    with pytest.raises(sa.SparseAttnError) as e:
        run()
    assert e.value.name in ("SA_ERR_NO_DEVICE", "SA_ERR_NOT_BUILT")
    assert e.value.function == "stage %d (%s)" % (st[0].id, st[0].name)


def test_launcher_matches_block_sparse_attention(rng):
    torch = pytest.importorskip("torch")
    if not (torch.cuda.is_available() and sa.gpu_available()):
        pytest.skip("needs torch with CUDA and an sm_90 GPU the library can use")
    st = sa.stage_with(sa.SA_ROLE_DEFAULT_TILE)
    q, k, v = (torch.from_numpy(x).to("cuda", torch.bfloat16)
               for x in qkv(rng, 1, 4, 1, 256, 1024, 128))
    ind = torch.from_numpy(_gpu.random_tile_lists((1, 4, 1, 256, 1024, 128), 1, 4)).cuda()
    o_ref, lse_ref = sa.block_sparse_attention(q, k, v, ind, stage=st)
    o, lse = torch.empty_like(q), torch.empty_like(lse_ref)
    a = _gpu.gpu_attn_default()
    a.shape = _capi.SaShape(1, 4, 1, 256, 1024, 128)
    a.q, a.k, a.v, a.o, a.lse = (t.data_ptr() for t in (q, k, v, o, lse))
    a.lists = _capi.SaTileLists(ind.data_ptr(), None, 1, 4)
    a.stream = torch.cuda.current_stream().cuda_stream
    run = st.launcher(a)
    assert run() == 0
    torch.cuda.synchronize()
    assert float((o.float() - o_ref.float()).norm() / o_ref.float().norm()) < 1e-3
    assert float((lse - lse_ref).abs().max()) < 1e-3
