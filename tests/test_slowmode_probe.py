"""benchmarks/corestate.py (is this core shared by a busy SMT sibling right now?) and the
diagnostics of benchmarks/bench_slowmode.py (the "slow process" reproducer)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from scripts import ROOT, load_script


def _load(name):
    return load_script(f"benchmarks/{name}.py", name)


cs = _load("corestate")


def test_classify_against_reference_and_default():
    # measured on the 2-vCPU VM: ~5.2 adds/cycle unshared, ~2.5-2.9 with a busy sibling
    assert cs.classify(5.2) == "unshared"
    assert cs.classify(2.7) == "shared"
    assert cs.classify(3.0, full=5.2) == "shared"
    assert cs.classify(4.0, full=5.2) == "unshared"      # 4.0 >= 0.7 * 5.2
    assert cs.classify(4.0, full=6.0) == "shared"        # 4.0 <  0.7 * 6.0
    with pytest.raises(ValueError, match="adds per cycle"):
        cs.classify(0.0)


needs_probe = pytest.mark.skipif(cs.unavailable() is not None,
                                 reason=f"corestate: {cs.unavailable()}")


@needs_probe
def test_probe_measures_clock_and_issue_rate():
    s = cs.sample()
    assert 0.3 < s.ghz < 8.0, s          # a dependent multiply chain gives the clock
    assert 0.8 < s.adds_per_cycle < 12, s  # at least ~1 add/cycle even when shared
    frac, best, ghz = cs.survey(0.05)
    assert 0.0 <= frac <= 1.0 and best >= s.adds_per_cycle * 0.2 and ghz > 0.3
    assert cs.describe(0.02).startswith("core state: shared ")


@needs_probe
def test_mxcsr_reads_masks_and_clears_flags():
    v = cs.mxcsr()
    assert v & 0x1f80 == 0x1f80   # every FP exception masked (the process default)
    cs.clear_flags()
    assert cs.mxcsr() & 0x3f == 0


def test_refuses_a_shared_cache_directory(tmp_path, monkeypatch):
    d = tmp_path / "rlxc-corestate"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if cs.unavailable() is not None:
        pytest.skip(cs.unavailable())
    with pytest.raises(cs.CoreStateError, match="not a private directory"):
        cs.build()


def test_smaps_finds_the_mapping_of_an_array():
    bs = _load("bench_slowmode")
    a = np.zeros(1 << 20, np.uint8)   # 1 MiB: its own anonymous mapping or the heap
    m = bs._smaps(a.__array_interface__["data"][0])
    assert m and "name" in m, m
    if os.path.isdir("/sys/kernel/mm/transparent_hugepage"):   # a THP kernel reports it
        assert isinstance(m.get("AnonHugePages"), int), m
    assert bs._smaps(0) == {}


@needs_probe
def test_worker_reports_workspace_facts(tmp_path):
    """One reproducer process (the dynamic ONNX CNN, 200 calls): the workspace is found
    (runtime/dyncpu.py DynExecutor's) with its mapping, and the timing fields are filled."""
    pytest.importorskip("onnx")
    env = dict(os.environ, RLXC_NUM_THREADS="1")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_slowmode.py"),
                          "--worker", "cnn_dyn", "--calls", "200", "--cpu",
                          str(min(os.sched_getaffinity(0)))],
                         env=env, capture_output=True, text=True, timeout=300)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, out.stderr[-3000:]
    import json

    d = json.loads(line[7:])
    assert d["ws_bytes"] > 0 and d["ws_mod4k"] % 64 == 0   # runtime/call.py aligned_empty
    assert "name" in d["ws_map"]
    assert d["raw_us"] > 0 and 0.0 <= d["shared_frac"] <= 1.0
    assert d["mxcsr"] & 0x8040 == 0   # rlxc leaves FTZ/DAZ off (IEEE denormals)
