"""torch tensors: CPU tensors through the reference (skipped without torch), CUDA tensors
through the GPU stages and the KV-centric path (skipped without a GPU), each checked against
the CPU reference on the same BF16 inputs."""
import numpy as np
import pytest

import sparseattn as sa
from conftest import qkv, random_lists

torch = pytest.importorskip("torch")

gpu = pytest.mark.skipif(not (torch.cuda.is_available() and sa.gpu_available()),
                         reason="needs torch with CUDA and an sm_90 GPU the library can use")

REL_L2 = 1e-2  # the project's BF16 output tolerance
LSE_TOL = 1e-2


def cdiv(a, b):
    return -(-a // b)


def rel_l2(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30)


def to_np(t):
    return t.detach().float().cpu().numpy()


def assert_matches(o, lse, o_ref, lse_ref):
    o, lse = to_np(o), to_np(lse)
    assert np.all(np.isfinite(o))
    assert rel_l2(o, o_ref) <= REL_L2
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_ref))
    fin = np.isfinite(lse_ref)
    assert np.max(np.abs(lse[fin] - lse_ref[fin]), initial=0.0) <= LSE_TOL


# ---------------------------------------------------------------- CPU tensors
def test_cpu_tensors_bf16_and_float32(rng):
    q, k, v = qkv(rng, 1, 2, 1, 200, 300, 64)
    idx, cnt = random_lists(rng, (1, 1, 2), 3, 2)
    o_np, lse_np = sa.block_sparse_attention(q, k, v, idx, cnt)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    ti, tc = torch.from_numpy(idx), torch.from_numpy(cnt)
    o, lse = sa.block_sparse_attention(tq, tk, tv, ti, tc)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.float32
    np.testing.assert_array_equal(o.numpy(), o_np)
    np.testing.assert_array_equal(lse.numpy(), lse_np)
    ob, lseb = sa.block_sparse_attention(tq.bfloat16(), tk.bfloat16(), tv.bfloat16(), ti, tc)
    assert ob.dtype == torch.bfloat16 and lseb.dtype == torch.float32
    np.testing.assert_array_equal(ob.float().numpy(), sa.bf16_round(o_np))
    od, _ = sa.dense_attention(tq.bfloat16(), tk.bfloat16(), tv.bfloat16(), layout="bhsd")
    assert od.dtype == torch.bfloat16 and od.shape == tq.shape


def test_cpu_tensor_selectors(rng):
    q, k, _ = qkv(rng, 1, 2, 1, 256, 512, 64)
    idx, cnt = sa.select("r1", torch.from_numpy(q), torch.from_numpy(k), 2)
    ref, _ = sa.select("r1", q, k, 2)
    assert isinstance(idx, torch.Tensor) and idx.dtype == torch.int32
    np.testing.assert_array_equal(idx.numpy(), ref)
    idx, cnt = sa.select("oracle", torch.from_numpy(q), torch.from_numpy(k), 2,
                         head_lists="pooled", causal=True)
    ref, rc = sa.select("oracle", q, k, 2, head_lists="pooled", causal=True)
    assert isinstance(cnt, torch.Tensor) and tuple(idx.shape) == ref.shape == (1, 2, 2, 4)
    np.testing.assert_array_equal(idx.numpy(), ref)
    np.testing.assert_array_equal(cnt.numpy(), rc)


def test_mixed_kinds_are_refused(rng):
    q, k, v = qkv(rng, 1, 1, 1, 128, 128, 64)
    with pytest.raises(TypeError, match=r"^k is a CPU tensor but q is a numpy array"):
        sa.dense_attention(q, torch.from_numpy(k), v)
    with pytest.raises(TypeError, match=r"^q must be torch.bfloat16 or torch.float32"):
        sa.dense_attention(*(torch.from_numpy(x).half() for x in (q, k, v)))


# ---------------------------------------------------------------- CUDA tensors
def cuda(*xs):
    return [torch.from_numpy(x).cuda() for x in xs]


def cuda_bf16(*xs):
    return [torch.from_numpy(x).to("cuda", torch.bfloat16) for x in xs]


# (B, Hq, Hkv, Sq, Skv): GQA 4 with partial final tile and block; MQA 16; one list per head.
GPU_SHAPES = [(1, 4, 1, 256, 1024), (2, 4, 2, 300, 700), (1, 16, 1, 512, 2048)]


@gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_gpu_block_sparse_matches_reference(rng, shape, layout):
    b, hq, hkv, sq, skv = shape
    q, k, v = qkv(rng, b, hq, hkv, sq, skv, 128)
    idx, cnt = random_lists(rng, (b, hkv, cdiv(sq, 128)), cdiv(skv, 128), 4)
    o_ref, lse_ref = sa.block_sparse_attention(q, k, v, idx, cnt)
    t = (lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))) if layout == "bshd" else \
        (lambda x: x)
    o, lse = sa.block_sparse_attention(*cuda_bf16(t(q), t(k), t(v)), *cuda(idx, cnt),
                                       layout=layout)
    assert o.is_cuda and o.dtype == torch.bfloat16 and o.shape == t(q).shape
    assert lse.shape == (b, hq, sq)
    assert_matches(o, lse, t(o_ref), lse_ref)


@gpu
def test_gpu_every_sparse_stage(rng):
    q, k, v = qkv(rng, 1, 4, 1, 256, 1024, 128)
    idx, cnt = random_lists(rng, (1, 4, 2), 8, 3)  # one list per query head
    o_ref, lse_ref = sa.block_sparse_attention(q, k, v, idx, cnt)
    for st in sa.stages():
        if st.sparse:
            o, lse = sa.block_sparse_attention(*cuda_bf16(q, k, v), *cuda(idx, cnt), stage=st.id)
            assert_matches(o, lse, o_ref, lse_ref)


@gpu
@pytest.mark.parametrize("skv", [1024, 700])
def test_gpu_dense(rng, skv):
    q, k, v = qkv(rng, 1, 4, 2, 512, skv, 128)
    o_ref, lse_ref = sa.dense_attention(q, k, v)
    o, lse = sa.dense_attention(*cuda_bf16(q, k, v))
    assert_matches(o, lse, o_ref, lse_ref)


@gpu
def test_gpu_causal(rng):
    q, k, v = qkv(rng, 1, 4, 1, 256, 1024, 128)
    idx, cnt = random_lists(rng, (1, 1, 2), 8, 4)
    if not any(st.check(_probe_causal(st)) == 0 for st in sa.stages() if st.sparse):
        pytest.skip("no GPU stage masks causally")
    o_ref, lse_ref = sa.block_sparse_attention(q, k, v, idx, cnt, causal=True,
                                               allow_future_blocks=True)
    o, lse = sa.block_sparse_attention(*cuda_bf16(q, k, v), *cuda(idx, cnt), causal=True,
                                       allow_future_blocks=True)
    assert_matches(o, lse, o_ref, lse_ref)
    o_ref, lse_ref = sa.dense_attention(q, k, v, causal=True)
    o, lse = sa.dense_attention(*cuda_bf16(q, k, v), causal=True)
    assert_matches(o, lse, o_ref, lse_ref)


def _probe_causal(st):
    """An sa_gpu_attn that any causal sparse stage accepts (check() reads no memory)."""
    import ctypes
    from sparseattn import _capi, _core
    a = _capi.SaGpuAttn()
    _core.lib.sa_gpu_attn_default(ctypes.byref(a))
    a.shape = _capi.SaShape(1, 1, 1, 128, 128, 128)
    a.q = a.k = a.v = a.o = a.lse = a.lists.indices = 1 << 20
    a.lists.list_heads, a.lists.max_blocks = 1, 1
    a.causal = 1
    return a


@gpu
def test_gpu_bad_list_raises_or_goes_to_the_verdict(rng):
    q, k, v = qkv(rng, 1, 4, 1, 256, 1024, 128)
    idx, cnt = random_lists(rng, (1, 1, 2), 8, 3, empty_rows=False)
    good_block = idx[0, 0, 1, 0]
    idx[0, 0, 1, 0] = 8  # past the 8 blocks
    args = cuda_bf16(q, k, v) + cuda(idx, cnt)
    with pytest.raises(sa.SparseAttnError) as e:
        sa.block_sparse_attention(*args)
    assert e.value.code == -5
    st = sa.stage_with(sa.SA_ROLE_GPU_VERDICT | sa.SA_ROLE_SPARSE)
    if st is None:
        pytest.skip("no stage with SA_ROLE_GPU_VERDICT")
    with sa.Verdict() as verdict:
        sa.block_sparse_attention(*args, verdict=verdict, stage=st)  # returns at once
        assert verdict.read() == -5
        assert verdict.read() == 0  # reading resets it
        sa.block_sparse_attention(*args, verdict=verdict, stage=st)
        with pytest.raises(sa.SparseAttnError) as e:
            verdict.check()
        assert e.value.code == -5
        idx[0, 0, 1, 0] = good_block
        good = cuda_bf16(q, k, v) + cuda(idx, cnt)
        sa.block_sparse_attention(*good, verdict=verdict)
        assert verdict.check() == 0


@gpu
@pytest.mark.parametrize("partial_format", ["f32", "bf16"])
def test_gpu_query_sparse_matches_reference(rng, partial_format):
    q, k, v = qkv(rng, 1, 4, 1, 300, 1024, 128)
    idx, cnt = random_lists(rng, (1, 1, 300), 8, 4)
    o_ref, lse_ref = sa.query_sparse_attention(q, k, v, idx, cnt)
    o, lse = sa.query_sparse_attention(*cuda_bf16(q, k, v), *cuda(idx, cnt),
                                       partial_format=partial_format)
    assert_matches(o, lse, o_ref, lse_ref)


@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_query_sparse_hybrid(rng, causal):
    # Tiles of 128 queries that share 3 blocks (in every list) and add 0..2 of their own.
    q, k, v = qkv(rng, 1, 4, 1, 256, 1024, 128)
    idx = np.full((1, 1, 256, 5), -1, np.int32)
    cnt = np.zeros((1, 1, 256), np.int32)
    for t in range(2):
        # Causally (len_kv - len_q = 768) query qq sees blocks 0 .. (qq + 768) // 128; the shared
        # blocks are drawn among those the tile's first query sees.
        vis0 = (t * 128 + 768) // 128 + 1 if causal else 8
        shared = [int(b) for b in rng.permutation(vis0)[:3]]
        for i in range(128):
            qq = t * 128 + i
            vis = (qq + 768) // 128 + 1 if causal else 8
            own = [int(b) for b in rng.permutation(vis) if b not in shared]
            own = own[:int(rng.integers(0, 3))]
            row = shared + own
            idx[0, 0, qq, :len(row)] = row
            cnt[0, 0, qq] = len(row)
    o_ref, lse_ref = sa.query_sparse_attention(q, k, v, idx, cnt, causal=causal)
    o, lse = sa.query_sparse_attention(*cuda_bf16(q, k, v), *cuda(idx, cnt), causal=causal,
                                       schedule="hybrid")
    assert_matches(o, lse, o_ref, lse_ref)


@gpu
def test_gpu_query_sparse_causal(rng):
    # len_q > len_kv: the first queries see no key; future blocks allowed (they add nothing).
    q, k, v = qkv(rng, 1, 4, 1, 400, 300, 128)
    idx, cnt = random_lists(rng, (1, 1, 400), 3, 3)
    o_ref, lse_ref = sa.query_sparse_attention(q, k, v, idx, cnt, causal=True,
                                               allow_future_blocks=True)
    o, lse = sa.query_sparse_attention(*cuda_bf16(q, k, v), *cuda(idx, cnt), causal=True,
                                       allow_future_blocks=True)
    assert_matches(o, lse, o_ref, lse_ref)


@gpu
def test_gpu_selectors_agree_with_cpu():
    q, k, v = sa.workload("local", batch=1, heads_q=4, heads_kv=1, len_q=512, len_kv=2048,
                          head_dim=128, seed=5)
    for sel in sa.selectors():
        if not sel.has_cuda:
            continue
        ref, _ = sa.select(sel.name, q, k, 4)
        idx, cnt = sa.select(sel.name, *cuda_bf16(q, k), 4)
        assert idx.is_cuda and idx.dtype == torch.int32 and tuple(idx.shape) == ref.shape
        assert np.all(cnt.cpu().numpy() == 4)
        same = np.mean(np.all(idx.cpu().numpy() == ref, axis=-1))
        assert same >= 0.9, "%s: %.2f of rows equal the CPU's" % (sel.name, same)


@gpu
def test_gpu_head_lists_agree_with_cpu():
    """Every mode of each Selector.cuda_head_lists on CUDA tensors: the CPU function's layout,
    counts in range, and rows mostly equal to the CPU's (ties aside); the lists run through the
    GPU attention as per-head lists."""
    q, k, v = sa.workload("local", batch=1, heads_q=4, heads_kv=1, len_q=512, len_kv=2048,
                          head_dim=128, seed=5)
    ran = 0
    for sel in sa.selectors():
        for mode in sel.cuda_head_lists:
            if mode == "group":
                continue
            ref, rc = sa.select(sel.name, q, k, 4, head_lists=mode, causal=True)
            idx, cnt = sa.select(sel.name, *cuda_bf16(q, k), 4, head_lists=mode, causal=True)
            assert idx.is_cuda and tuple(idx.shape) == ref.shape and ref.shape[1] == 4
            same = np.mean(np.all(idx.cpu().numpy() == ref, axis=-1))
            assert same >= 0.9, "%s %s: %.2f of rows equal the CPU's" % (sel.name, mode, same)
            o, _ = sa.block_sparse_attention(*cuda_bf16(q, k, v), idx, cnt, causal=True)
            o_ref, _ = sa.block_sparse_attention(q, k, v, ref, rc, causal=True)
            if same == 1.0:
                np.testing.assert_allclose(o.float().cpu().numpy(), o_ref, atol=2e-2, rtol=2e-2)
            ran += 1
    assert ran >= 2  # nvfp4's per-head lists, nvfp4_mass's per-head and pooled ones


@gpu
def test_gpu_argument_errors(rng):
    q, k, v = qkv(rng, 1, 2, 1, 256, 512, 128)
    idx, cnt = random_lists(rng, (1, 1, 2), 4, 2)
    gq, gk, gv = cuda_bf16(q, k, v)
    gi, gc = cuda(idx, cnt)
    with pytest.raises(TypeError, match=r"^q must be torch.bfloat16 on the GPU"):
        sa.block_sparse_attention(gq.float(), gk, gv, gi)
    with pytest.raises(ValueError, match=r"^k must be contiguous"):
        sa.block_sparse_attention(gq, gk.transpose(2, 3).contiguous().transpose(2, 3), gv, gi)
    with pytest.raises(TypeError, match=r"^indices must be torch.int32"):
        sa.block_sparse_attention(gq, gk, gv, gi.long())
    with pytest.raises(TypeError, match=r"^indices must be a CUDA tensor"):
        sa.block_sparse_attention(gq, gk, gv, torch.from_numpy(idx))
    with pytest.raises(TypeError, match=r"^v is a CPU tensor but q is a CUDA tensor"):
        sa.block_sparse_attention(gq, gk, gv.cpu(), gi)
    with pytest.raises(ValueError, match=r"is dense"):
        dense_stage = sa.stage_with(sa.SA_ROLE_DEFAULT_DENSE)
        sa.block_sparse_attention(gq, gk, gv, gi, stage=dense_stage.name)
    with pytest.raises(ValueError, match=r"^no stage 99"):
        sa.block_sparse_attention(gq, gk, gv, gi, stage=99)
    with pytest.raises(sa.SparseAttnError) as e:  # head_dim 64: no GPU stage takes it
        sa.dense_attention(*cuda_bf16(*(x[..., :64].copy() for x in (q, k, v))))
    assert e.value.code == -13
    with pytest.raises(ValueError, match=r"^head_lists='per_head': the GPU function of "):
        sa.select("r4", gq, gk, 2, head_lists="per_head")
