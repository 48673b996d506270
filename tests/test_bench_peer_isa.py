"""benchmarks/compare.py --peer-isa avx2: every peer is restricted to AVX2 before it loads,
and the header checks it took effect (OpenBLAS's kernel, one-thread sgemm rate)."""
import os
import subprocess
import sys

import pytest

from scripts import ROOT, load_script


def _compare():
    return load_script("benchmarks/compare.py", "bench_compare")


def test_peer_isa_avx2_sets_every_library(monkeypatch):
    cmp = _compare()
    for k in list(cmp.PEER_ISA_ENV) + ["XLA_FLAGS", "OPENBLAS_L2_SIZE"]:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "1")
    cmp._setup_peer_isa("avx2")
    assert os.environ["OPENBLAS_CORETYPE"] == "Haswell"
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2"
    assert os.environ["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert "--xla_cpu_max_isa=AVX2" in os.environ["XLA_FLAGS"]
    assert "OPENBLAS_L2_SIZE" not in os.environ
    cmp._setup_peer_isa("avx2")      # idempotent: the flag is not appended twice
    assert os.environ["XLA_FLAGS"].count("--xla_cpu_max_isa") == 1


def test_peer_isa_native_and_coretype_override(monkeypatch):
    cmp = _compare()
    for k in list(cmp.PEER_ISA_ENV) + ["XLA_FLAGS"]:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    cmp._setup_peer_isa("native")
    assert "OPENBLAS_CORETYPE" not in os.environ       # the host picks
    assert "ATEN_CPU_CAPABILITY" not in os.environ
    assert "XLA_FLAGS" not in os.environ
    cmp._setup_peer_isa("avx2", blas_coretype="Sandybridge")
    assert os.environ["OPENBLAS_CORETYPE"] == "Sandybridge"
    with pytest.raises(ValueError, match="peer-isa"):
        cmp._setup_peer_isa("avx512")


def test_peer_isa_report_names_openblas_kernel():
    """In a fresh process (OpenBLAS reads OPENBLAS_CORETYPE when it loads), --peer-isa avx2
    makes the header report OpenBLAS's Haswell kernel and a one-thread sgemm rate."""
    pytest.importorskip("threadpoolctl")
    code = (
        "import sys, types; sys.path.insert(0, %r)\n"
        "import compare\n"
        "compare._setup_threads(1); compare._setup_peer_isa('avx2')\n"
        "compare._MODS['torch'] = compare.Skip('off'); compare._MODS['jax'] = compare.Skip('off')\n"
        "print('\\n'.join(compare.peer_isa_report(types.SimpleNamespace(peer_isa='avx2'))))\n"
        "print('BLAS', compare.blas_info())\n"
    ) % os.path.join(ROOT, "benchmarks")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "peer ISA: avx2" in r.stdout
    line = [ln for ln in r.stdout.splitlines() if "NumPy BLAS on one thread" in ln]
    assert line, r.stdout
    assert "GFLOP/s" in line[0], line[0]
    if "openblas" in r.stdout.split("BLAS ", 1)[-1].lower():   # NumPy's wheels ship OpenBLAS
        assert "kernel: Haswell" in line[0], line[0]


def test_make_bench_quick_passes_cpu_and_peer_isa():
    r = subprocess.run(["make", "-n", "-C", ROOT, "bench-quick", "BENCH_CPU=znver3",
                        "PEER_ISA=avx2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--cpu znver3" in r.stdout and "--peer-isa avx2" in r.stdout


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_sample_orders_are_balanced(n):
    """compare.py times the implementations in orders where each one directly follows each
    other one equally often (the previous one's spinning threads slow the next); a plain
    rotation kept every predecessor fixed."""
    from collections import Counter

    items = [f"impl{i}" for i in range(n)]
    rows = _compare().balanced_orders(items)
    assert rows and all(sorted(r) == sorted(items) for r in rows)
    pairs = Counter((a, b) for r in rows for a, b in zip(r, r[1:]))
    if n >= 2:
        assert len(pairs) == n * (n - 1) and len(set(pairs.values())) == 1, pairs
