"""Activation files (docs/activations.md): the numpy writer and the C reader (sa_act_*) on tiny
synthetic tensors, no model."""
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sparseattn as sa
from sparseattn import activations as act

from conftest import attention_np, bf16_np, causal_mask


def _layers(rng):
    # Layer 2: GQA 4 on 2 KV heads, D 64, partial blocks; layer 7: rank 3 (batch 1), MQA, D 256.
    return {
        2: (rng.standard_normal((1, 4, 130, 64), dtype=np.float32),
            rng.standard_normal((1, 2, 130, 64), dtype=np.float32),
            rng.standard_normal((1, 2, 130, 64), dtype=np.float32)),
        7: (rng.standard_normal((2, 40, 256), dtype=np.float32),
            rng.standard_normal((1, 40, 256), dtype=np.float32),
            rng.standard_normal((1, 40, 256), dtype=np.float32)),
    }


def test_bf16_rounding_matches_the_library(rng):
    x = np.concatenate([rng.standard_normal(10000, dtype=np.float32) * 1e3,
                        np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -0.0, np.inf, -np.inf, 3e38],
                                 np.float32)])
    np.testing.assert_array_equal(act.bf16_bits(x), sa.bf16_bits(x))
    np.testing.assert_array_equal(act.bf16_to_float32(act.bf16_bits(x)), bf16_np(x))


def test_round_trip_through_the_c_reader(rng, tmp_path):
    layers = _layers(rng)
    path = tmp_path / "acts.safetensors"
    meta = {"model": "synthetic", "scale": 0.125, "causal": True, "sliding_window": 0,
            "rope_theta": 1e4, "layers.7.sliding_window": 16, "layers.7.scale": 1 / 16}
    n = act.write(path, layers, meta)
    assert n == path.stat().st_size
    # The framing a safetensors reader expects: header length, JSON, data after 8-aligned header.
    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    assert hlen % 8 == 0
    header = json.loads(raw[8:8 + hlen])
    assert header["layers.2.q"]["dtype"] == "BF16"
    assert header["__metadata__"]["format"] == act.FORMAT

    got, info, got_meta = act.read_with_library(path)
    assert sorted(got) == [2, 7]
    assert got_meta["model"] == "synthetic" and got_meta["causal"] == "1"
    assert got_meta["heads_q"] == "4" and got_meta["head_dim"] == "64"  # from layer 2
    assert got_meta["layers.7.heads_q"] == "2" and got_meta["layers.7.head_dim"] == "256"
    for layer, (q, k, v) in layers.items():
        for a, b in zip(got[layer], (q, k, v)):
            want = act.bf16_bits(b)
            np.testing.assert_array_equal(a, want.reshape(a.shape))
    assert info[2] == dict(shape=(1, 4, 2, 130, 130, 64), scale=0.125, causal=True,
                           sliding_window=0, rope_theta=1e4)
    assert info[7]["shape"] == (1, 2, 1, 40, 40, 256)
    assert info[7]["sliding_window"] == 16 and info[7]["scale"] == 1 / 16

    # The numpy reader reads the same bits.
    py_layers, py_meta = act.read(path)
    assert py_meta == got_meta
    for layer in layers:
        for a, b in zip(py_layers[layer], got[layer]):
            np.testing.assert_array_equal(a.reshape(b.shape), b)


def test_uint16_input_and_f32_tensors(rng, tmp_path):
    q = act.bf16_bits(rng.standard_normal((1, 2, 5, 64), dtype=np.float32))
    k = act.bf16_bits(rng.standard_normal((1, 1, 5, 64), dtype=np.float32))
    path = tmp_path / "bits.safetensors"
    act.write(path, {0: (q, k, k)})
    got, info, _ = act.read_with_library(path)
    np.testing.assert_array_equal(got[0][0], q)
    assert info[0]["scale"] == pytest.approx(1 / 8) and not info[0]["causal"]


def test_what_the_reader_computes_on(rng, tmp_path):
    """Causal dense attention on the tensors read back equals the numpy attention on the BF16
    values written: the file carries exactly the inputs."""
    layers = _layers(rng)
    path = tmp_path / "a.safetensors"
    act.write(path, {2: layers[2]}, {"causal": 1})
    (q, k, v), = act.read_with_library(path)[0].values()
    o, lse = sa.dense_attention(act.bf16_to_float32(q), act.bf16_to_float32(k),
                                act.bf16_to_float32(v), causal=True)
    o_ref, lse_ref = attention_np(*layers[2], causal_mask(1, 4, 130, 130))
    np.testing.assert_allclose(np.asarray(o, np.float64), o_ref, rtol=1e-2, atol=1e-2)
    fin = np.isfinite(lse_ref)
    np.testing.assert_allclose(lse[fin], lse_ref[fin], rtol=1e-4, atol=1e-4)
    assert math.isfinite(float(lse[0, 0, 0]))


@pytest.mark.parametrize("edit, words", [
    ((b'"format":"sparseattn.activations"', b'"format":"sparseattn.other_stuff"'), "format"),
    ((b'"BF16"', b'"F64_"'), "dtype"),
    ((b'"heads_kv":"2"', b'"heads_kv":"3"'), "heads_kv"),
])
def test_the_c_reader_refuses_bad_files(rng, tmp_path, edit, words):
    path = tmp_path / "bad.safetensors"
    act.write(path, {2: _layers(rng)[2]})
    raw = path.read_bytes()
    assert edit[0] in raw and len(edit[0]) == len(edit[1])
    path.write_bytes(raw.replace(edit[0], edit[1], 1))
    with pytest.raises(sa.SparseAttnError) as e:
        act.read_with_library(path)
    assert e.value.code == -11 and e.value.function == "sa_act_open"
    assert words in e.value.detail


def test_writer_checks(rng, tmp_path):
    q, k, v = _layers(rng)[2]
    with pytest.raises(ValueError, match="do not fit"):
        act.write(tmp_path / "x", {0: (q[:, :3], k, v)})
    with pytest.raises(ValueError, match="differ"):
        act.write(tmp_path / "x", {0: (q, k, v[:, :, :10])})
    with pytest.raises(ValueError, match="rank"):
        act.write(tmp_path / "x", {0: (q[0, 0], k, v)})
    with pytest.raises(TypeError):
        act.write(tmp_path / "x", {0: (q.astype(np.int32), k, v)})
    # Past the C reader's range: it would skip the layer without a word. A layer index is an
    # int option like the package's others: TypeError for a non-int, ValueError out of range.
    for bad in (act.MAX_LAYER + 1, -1):
        with pytest.raises(ValueError, match=r"^layer index must lie in \[0, 999999\], got %d$"
                                             % bad):
            act.write(tmp_path / "x", {bad: (q, k, v)})
    for bad in (2.0, True, "2"):
        with pytest.raises(TypeError, match=r"^layer index must be an int, got "):
            act.write(tmp_path / "x", {bad: (q, k, v)})
    with pytest.raises(TypeError, match=r"^layer index must be an int, got 'a'$"):
        act.write(tmp_path / "x", {3: (q, k, v), "a": (q, k, v)})  # judged before sorting
    assert not (tmp_path / "x").exists()
    act.write(tmp_path / "x", {np.int64(3): (q, k, v)})
    assert sorted(act.read(tmp_path / "x")[0]) == [3]


def test_writer_by_its_path_alone(rng, tmp_path):
    """As tools/capture_activations.py loads it: by its path, outside the package, with numpy
    alone (its int check, _checks.py, comes by its path too); libsparseattn is not loaded."""
    q, k, v = _layers(rng)[2]
    np.savez(tmp_path / "qkv.npz", q=q, k=k, v=v)
    script = """
import importlib.util, os, sys
import numpy as np
spec = importlib.util.spec_from_file_location("sa_activations_io", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
t = np.load(sys.argv[2])
qkv = (t["q"], t["k"], t["v"])
try:
    mod.write(sys.argv[3], {2.5: qkv})
except TypeError as e:
    print("TypeError:", e)
mod.write(sys.argv[3], {4: qkv})
assert sorted(mod.read(sys.argv[3])[0]) == [4]
assert "sparseattn" not in sys.modules
if os.path.exists("/proc/self/maps"):  # Linux: no libsparseattn among the mapped files
    with open("/proc/self/maps") as f:
        assert "libsparseattn" not in f.read()
"""
    path = Path(act.__file__)
    out = subprocess.run([sys.executable, "-c", script, str(path), str(tmp_path / "qkv.npz"),
                          str(tmp_path / "w.safetensors")], capture_output=True, text=True,
                         cwd=tmp_path, env=dict(os.environ, PYTHONPATH=""))
    assert out.returncode == 0, out.stderr
    assert out.stdout == "TypeError: layer index must be an int, got 2.5\n"


def test_metadata_values_the_c_reader_takes(rng, tmp_path):
    """numpy scalars, booleans and None (a model config's "no window") in the metadata: the C
    reader opens the file and reads the numbers; a bytes path works too."""
    q, k, v = _layers(rng)[2]
    path = tmp_path / "m.safetensors"
    meta = {"causal": np.True_, "sliding_window": None, "scale": 1 / np.sqrt(np.float64(64)),
            "rope_theta": np.float32(1e4), "heads_q": np.int64(q.shape[1])}
    act.write(path, {2: (q, k, v)}, meta)
    _, info, meta = act.read_with_library(bytes(path))
    assert info[2]["scale"] == 0.125 and info[2]["causal"] and info[2]["rope_theta"] == 1e4
    assert "sliding_window" not in meta


def _cli():
    """build/tools/sparseattn beside the library under test, or None."""
    import os
    path = os.path.join(os.path.dirname(sa.library_path), "tools", "sparseattn")
    return path if os.access(path, os.X_OK) else None


def test_select_eval_on_a_synthetic_file(rng, tmp_path):
    """select-eval --activations: every selector and both oracle bounds, causal as the file says;
    the oracle bounds every tile selector's mean recall (oracle_query the per-query one's), and at
    k = all blocks every list is complete."""
    import subprocess
    cli = _cli()
    if cli is None:
        pytest.skip("no tools/sparseattn beside %s" % sa.library_path)
    # Keys with a few heavy blocks, so that selectors differ.
    q = rng.standard_normal((1, 4, 520, 64), dtype=np.float32)
    k = rng.standard_normal((1, 2, 520, 64), dtype=np.float32)
    k[:, :, 128:160] += 2 * q[:, ::2, 128:160].mean(axis=2, keepdims=True)
    v = rng.standard_normal((1, 2, 520, 64), dtype=np.float32)
    path = tmp_path / "synthetic.safetensors"
    act.write(path, {4: (q, k, v), 9: (k[:, :1].repeat(4, 1), k, v)},
              {"causal": 1, "scale": 0.125, "model": "synthetic"})
    out = subprocess.run([cli, "select-eval", "--activations", str(path), "--budgets", "2,5,9",
                          "--json"], capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    names = {r["selector"] for r in rows}
    assert {"r1", "r4", "nvfp4", "nvfp4_query", "oracle", "oracle_query", "random"} <= names
    assert {r["layer"] for r in rows} == {4, 9} and {r["k"] for r in rows} == {2, 5}  # 9 > 5 blocks
    for r in rows:
        assert r["causal"] == 1 and len(r["per_head"]) == 4 and 0 <= r["recall_p5"] <= 1
        bound = {(b["layer"], b["k"], b["per_query"]): b["recall_mean"] for b in rows
                 if b["selector"] in ("oracle", "oracle_query")}
        assert r["recall_mean"] <= bound[(r["layer"], r["k"], r["per_query"])] + 1e-5, r
        if r["k"] == 5:
            assert r["recall_mean"] == pytest.approx(1, abs=1e-5) and r["out_rel_l2"] < 1e-5
    text = subprocess.run([cli, "select-eval", "--activations", str(path), "--layers", "9"],
                          capture_output=True, text=True, check=True).stdout
    assert "layer 9" in text and "layer 4 " not in text and "mean over the layers" in text
    bad = subprocess.run([cli, "select-eval", "--activations", str(tmp_path / "none")],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "none" in bad.stderr


def test_select_eval_head_lists(rng, tmp_path):
    """select-eval --activations --head-lists: each tile selector also in the head-list modes its
    CPU function takes (Selector.head_lists), named in the JSON's head_lists; the per-head
    oracle bounds every group and per-head list's mean recall, and the pooled oracle bounds the
    per-head oracle (it may give a head more blocks, never fewer in all); a bad mode is refused."""
    import subprocess
    cli = _cli()
    if cli is None:
        pytest.skip("no tools/sparseattn beside %s" % sa.library_path)
    q = rng.standard_normal((1, 4, 700, 64), dtype=np.float32)
    q *= np.array([0.5, 1.0, 2.0, 3.0], np.float32)[None, :, None, None]  # heads of unequal spread
    k = rng.standard_normal((1, 2, 700, 64), dtype=np.float32)
    v = rng.standard_normal((1, 2, 700, 64), dtype=np.float32)
    path = tmp_path / "heads.safetensors"
    act.write(path, {3: (q, k, v)}, {"causal": 1, "scale": 0.125, "model": "synthetic"})
    out = subprocess.run([cli, "select-eval", "--activations", str(path), "--budgets", "2",
                          "--head-lists", "group,per_head,pooled", "--json"],
                         capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    got = {(r["selector"], r["head_lists"]) for r in rows}
    for s in sa.selectors():
        for mode in ("group", "per_head", "pooled"):
            want = mode in s.head_lists and (mode == "group" or not s.per_query)
            assert ((s.name, mode) in got) == want, (s.name, mode)
    recall = {(r["selector"], r["head_lists"]): r["recall_mean"] for r in rows}
    tile = {(r["selector"], r["head_lists"]) for r in rows if not r["per_query"]}
    for (name, mode), value in recall.items():
        if mode != "pooled" and (name, mode) in tile:  # per-query lists have their own bound
            assert value <= recall[("oracle", "per_head")] + 1e-5, (name, mode)
    assert recall[("oracle", "per_head")] <= recall[("oracle", "pooled")] + 1e-5
    bad = subprocess.run([cli, "select-eval", "--activations", str(path), "--head-lists", "x"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "head-lists" in bad.stderr
