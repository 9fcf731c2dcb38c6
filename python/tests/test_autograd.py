"""sparseattn.autograd.sparse_attention: gradients through the CPU reference against torch's own
autograd of a float64 masked softmax on the same BF16-rounded inputs (skipped without torch)."""
import math

import numpy as np
import pytest

import sparseattn as sa
from conftest import bf16_np, causal_mask, qkv, query_mask, random_lists, tile_mask

torch = pytest.importorskip("torch")
from sparseattn.autograd import sparse_attention  # noqa: E402 (needs torch)


def torch_reference(q, k, v, mask, do):
    """(o, dq, dk, dv) in float64 by torch autograd; GQA by repeating K/V heads (so dk, dv are
    summed over each group), rows without a key give O = 0."""
    q, k, v = (torch.tensor(bf16_np(x), dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    m = torch.from_numpy(np.ascontiguousarray(mask))
    s = (q @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~m, -math.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row with no key: all -inf -> NaN -> 0
    o = p @ vv
    (o * torch.tensor(bf16_np(do), dtype=torch.float64)).sum().backward()
    return o.detach().numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


def rel_l2(x, ref):
    return float(np.linalg.norm(np.asarray(x, np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


def check(q, k, v, mask, do, **kw):
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    o, lse = sparse_attention(tq, tk, tv, **kw)
    assert o.dtype == torch.float32 and not lse.requires_grad
    o.backward(torch.from_numpy(do))
    o_ref, dq, dk, dv = torch_reference(q, k, v, mask, do)
    assert rel_l2(o.detach().numpy(), o_ref) < 1e-4
    for name, got, ref in (("dq", tq.grad, dq), ("dk", tk.grad, dk), ("dv", tv.grad, dv)):
        assert got.shape == ref.shape
        assert rel_l2(got.numpy(), ref) < 1e-3, name


@pytest.mark.parametrize("causal", [False, True])
def test_tile_lists(rng, causal):
    q, k, v = qkv(rng, 1, 4, 2, 300, 700, 64)  # partial last tile and block, GQA 2
    idx, cnt = random_lists(rng, (1, 2, 3), 6, 3)
    mask = tile_mask((1, 4, 300, 700), idx, cnt)
    if causal:
        mask = mask & causal_mask(1, 4, 300, 700)
    do = rng.standard_normal(q.shape, dtype=np.float32)
    check(q, k, v, mask, do, indices=torch.from_numpy(idx), counts=torch.from_numpy(cnt),
          causal=causal, allow_future_blocks=causal)


def test_query_lists(rng):
    q, k, v = qkv(rng, 1, 4, 1, 130, 500, 64)
    idx, cnt = random_lists(rng, (1, 1, 130), 4, 2)
    mask = query_mask((1, 4, 130, 500), 1, idx, cnt)
    do = rng.standard_normal(q.shape, dtype=np.float32)
    check(q, k, v, mask, do, indices=idx, counts=cnt, per_query=True)


def test_dense_causal(rng):
    q, k, v = qkv(rng, 1, 2, 2, 200, 200, 128)
    do = rng.standard_normal(q.shape, dtype=np.float32)
    check(q, k, v, causal_mask(1, 2, 200, 200), do, causal=True)


def test_a_training_step_lowers_the_loss(rng):
    """One plain gradient step on q, k, v through the sparse attention lowers the loss."""
    q, k, v = qkv(rng, 1, 2, 1, 256, 512, 64)
    idx, cnt = random_lists(rng, (1, 1, 2), 4, 2, empty_rows=False)
    target = torch.from_numpy(rng.standard_normal(q.shape, dtype=np.float32))
    params = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]

    def loss():
        o, _ = sparse_attention(*params, indices=idx, counts=cnt)
        return ((o - target) ** 2).mean()

    before = loss()
    before.backward()
    with torch.no_grad():
        for p in params:
            p -= 0.5 * p.grad
    assert loss().item() < before.item()


def test_errors(rng):
    q, k, v = qkv(rng, 1, 2, 1, 128, 256, 64)
    with pytest.raises(TypeError, match="must be a torch tensor"):
        sparse_attention(q, torch.from_numpy(k), torch.from_numpy(v))
    idx = np.full((1, 1, 1, 1), 7, np.int32)  # past the 2 KV blocks
    with pytest.raises(sa.SparseAttnError):
        sparse_attention(*(torch.from_numpy(x) for x in (q, k, v)), indices=idx)
    if gpu():
        qc, kc, vc = (torch.from_numpy(x).cuda() for x in (q, k, v))
        with pytest.raises(NotImplementedError, match="no GPU backward"):
            sparse_attention(qc, kc, vc, indices=torch.zeros((1, 1, 1, 1), dtype=torch.int32,
                                                             device="cuda"), per_query=True)
        with pytest.raises(ValueError, match="keep q, k and v on one device"):
            sparse_attention(torch.from_numpy(q), kc, vc)


def gpu():
    return torch.cuda.is_available() and sa.gpu_available()


def check_gpu(q, k, v, mask, do, **kw):
    """The GPU path (head_dim 128): O and the gradients against the float64 torch reference, at
    the GPU tolerance (BF16 O, BF16 P in the products)."""
    tq, tk, tv = (torch.tensor(x, device="cuda", requires_grad=True) for x in (q, k, v))
    o, lse = sparse_attention(tq, tk, tv, **kw)
    assert o.dtype == torch.float32 and o.is_cuda and not lse.requires_grad
    o.backward(torch.from_numpy(do).cuda())
    o_ref, dq, dk, dv = torch_reference(q, k, v, mask, do)
    assert rel_l2(o.detach().cpu().numpy(), o_ref) < 1e-2
    for name, got, ref in (("dq", tq.grad, dq), ("dk", tk.grad, dk), ("dv", tv.grad, dv)):
        assert got.shape == ref.shape and got.is_cuda
        assert rel_l2(got.cpu().numpy(), ref) < 1e-2, name


@pytest.mark.parametrize("causal", [False, True])
def test_gpu_tile_lists(rng, causal):
    if not gpu():
        pytest.skip("no sm_90 GPU")
    q, k, v = qkv(rng, 1, 4, 2, 300, 700, 128)
    idx, cnt = random_lists(rng, (1, 2, 3), 6, 3)
    mask = tile_mask((1, 4, 300, 700), idx, cnt)
    if causal:
        mask = mask & causal_mask(1, 4, 300, 700)
    do = rng.standard_normal(q.shape, dtype=np.float32)
    check_gpu(q, k, v, mask, do, indices=torch.from_numpy(idx).cuda(),
              counts=torch.from_numpy(cnt).cuda(), causal=causal, allow_future_blocks=causal)


def test_gpu_dense_causal(rng):
    if not gpu():
        pytest.skip("no sm_90 GPU")
    q, k, v = qkv(rng, 1, 2, 1, 200, 330, 128)
    do = rng.standard_normal(q.shape, dtype=np.float32)
    check_gpu(q, k, v, causal_mask(1, 2, 200, 330), do, causal=True)
    check_gpu(q, k, v, np.ones((1, 2, 200, 330), bool), do)


def test_gpu_dq_passes(rng):
    """block_sparse_attention_backward's two dQ passes (docs/backward.md) against the float64
    reference, and against each other; a dq_pass it does not know is refused before the GPU."""
    with pytest.raises(ValueError, match="dq_pass must be one of"):
        sa.block_sparse_attention_backward(None, None, None, None, None, None, None,
                                           dq_pass="atomic")
    if not gpu():
        pytest.skip("no sm_90 GPU")
    q, k, v = qkv(rng, 1, 4, 1, 384, 900, 128)
    idx, cnt = random_lists(rng, (1, 1, 3), 8, 4)
    mask = tile_mask((1, 4, 384, 900), idx, cnt)
    do = rng.standard_normal(q.shape, dtype=np.float32)
    tq, tk, tv = (torch.tensor(x, device="cuda").bfloat16() for x in (q, k, v))
    ti, tc = torch.from_numpy(idx).cuda(), torch.from_numpy(cnt).cuda()
    o, lse = sa.block_sparse_attention(tq, tk, tv, ti, tc)
    tdo = torch.from_numpy(do).cuda().bfloat16()
    _, dq_ref, dk_ref, dv_ref = torch_reference(q, k, v, mask, do)
    got = {}
    for dq_pass in ("stored", "recompute", "auto"):
        got[dq_pass] = sa.block_sparse_attention_backward(tq, tk, tv, o, lse, tdo, ti, tc,
                                                          dq_pass=dq_pass)
        for name, x, ref in zip(("dq", "dk", "dv"), got[dq_pass], (dq_ref, dk_ref, dv_ref)):
            assert rel_l2(x.cpu().numpy(), ref) < 1e-2, (dq_pass, name)
    # dK, dV come from the same kernel either way; dQ differs only by the order of FP32 sums.
    for i in (1, 2):
        assert torch.equal(got["stored"][i], got["recompute"][i])
    assert rel_l2(got["stored"][0].cpu().numpy(), got["recompute"][0].cpu().numpy()) < 1e-4
    assert all(torch.equal(a, b) for a, b in zip(got["auto"], got["stored"]))


def test_gpu_backward_verdict(rng):
    """block_sparse_attention_backward(verdict=...): good lists give the synchronous call's
    gradients bit for bit and leave the verdict clear; a bad list returns at once and the verdict
    holds the synchronous call's code; a verdict of another type is refused."""
    if not gpu():
        pytest.skip("no sm_90 GPU")
    q, k, v = qkv(rng, 1, 4, 1, 384, 900, 128)
    idx, cnt = random_lists(rng, (1, 1, 3), 8, 4, empty_rows=False)  # row 1's slot 0 is read
    do = rng.standard_normal(q.shape, dtype=np.float32)
    tq, tk, tv = (torch.tensor(x, device="cuda").bfloat16() for x in (q, k, v))
    ti, tc = torch.from_numpy(idx).cuda(), torch.from_numpy(cnt).cuda()
    o, lse = sa.block_sparse_attention(tq, tk, tv, ti, tc)
    tdo = torch.from_numpy(do).cuda().bfloat16()
    ref = sa.block_sparse_attention_backward(tq, tk, tv, o, lse, tdo, ti, tc)
    with sa.Verdict() as verdict:
        got = sa.block_sparse_attention_backward(tq, tk, tv, o, lse, tdo, ti, tc, verdict=verdict)
        assert verdict.read() == 0
        assert all(torch.equal(a, b) for a, b in zip(got, ref))
        bad = ti.clone()
        bad[0, 0, 1, 0] = 8  # block 8 of 8: out of range
        with pytest.raises(sa.SparseAttnError) as e:
            sa.block_sparse_attention_backward(tq, tk, tv, o, lse, tdo, bad, tc)
        sa.block_sparse_attention_backward(tq, tk, tv, o, lse, tdo, bad, tc, verdict=verdict)
        assert verdict.read() == e.value.code
    with pytest.raises(TypeError, match="verdict must be a sparseattn.Verdict"):
        sa.block_sparse_attention_backward(tq, tk, tv, o, lse, tdo, ti, tc, verdict=1)
