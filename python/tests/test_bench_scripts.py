"""The benchmarks' own --self-test (bench/peers.py on the library this suite loaded, through the
sparseattn package; bench/causal.py's list and FlexAttention mask checks, which run on the CPU
where torch is importable), run as subprocesses with this interpreter."""
import os
import subprocess
import sys

import pytest

import sparseattn as sa

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench")


def run_bench(*argv):
    if not os.path.isfile(argv[0]):
        pytest.skip("no bench/ beside this python/ (an installed copy of the tests)")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable] + list(argv), capture_output=True, text=True,
                          env=env, timeout=600)


def test_peers_self_test_on_this_library():
    r = run_bench(os.path.join(BENCH, "peers.py"), "--self-test", "--lib", sa.library_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sparseattn package loads" in r.stdout and " 0 failed" in r.stdout
    assert "bench/shapes.h gives the study's shapes and tolerances" in r.stdout


def test_causal_self_test():
    r = run_bench(os.path.join(BENCH, "causal.py"), "--self-test")
    assert r.returncode == 0, r.stdout + r.stderr
    assert " 0 failed" in r.stdout


def test_causal_refuses_an_unknown_peer():
    r = run_bench(os.path.join(BENCH, "causal.py"), "--self-test", "--peers", "cudnn,fa5")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--peers: unknown fa5" in r.stderr


def test_peer_lists_read_alike():
    # The three benches share one reader (peers.peer_names): none for no peer, empty entries
    # skipped. peers.py refused none, and causal.py a trailing comma, before.
    r = run_bench(os.path.join(BENCH, "causal.py"), "--self-test", "--peers", "fa4,")
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_bench(os.path.join(BENCH, "peers.py"), "--self-test", "--peers", "none")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "parse_args: --peers none" in r.stdout and " 0 failed" in r.stdout
    r = run_bench(os.path.join(BENCH, "peers.py"), "--self-test", "--peers", "fa5")
    assert r.returncode == 2 and "--peers: unknown fa5" in r.stderr, r.stdout + r.stderr


def test_backward_refuses_an_unknown_peer():
    # A typo used to run no peer at all, silently (the names were only tested for membership).
    r = run_bench(os.path.join(BENCH, "backward.py"), "--lib", "unused.so", "--peers", "fa4,fa5")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--peers: unknown fa5" in r.stderr


def test_peers_refuses_a_stage_that_is_not_a_number():
    r = run_bench(os.path.join(BENCH, "peers.py"), "--self-test", "--stages", "17,x")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--stages takes stage ids" in r.stderr


def test_list_heads_skips_cleanly_or_runs():
    # Without torch or CUDA (CI): the skip code and a reason; with a GPU: one short run.
    r = run_bench(os.path.join(BENCH, "list_heads.py"), "--lens", "2048", "--reps", "1",
                  "--rounds", "1")
    if r.returncode == 77:
        assert "skipped" in r.stdout, r.stdout + r.stderr
    else:
        assert r.returncode == 0, r.stdout + r.stderr
        assert "one list per head" in r.stdout and "one list per group" in r.stdout


def test_list_heads_refuses_bad_lengths():
    r = run_bench(os.path.join(BENCH, "list_heads.py"), "--lens", "1000")
    assert r.returncode == 2 and "--lens" in r.stderr, r.stdout + r.stderr
