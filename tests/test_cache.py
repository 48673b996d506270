"""The compile cache of rlxc.backends: memory hits, disk hits, corruption, concurrency.

Every test uses its own RLXC_CACHE_DIR (tmp_path), never the user's home.
Entries that a test corrupts are first created by a subprocess, so this
process never maps the library it damages.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rlxc.backends as B
import rlxc.cache as C
from rlxc import Func

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import rlxc.backends as B
    from rlxc import Func
    tag = sys.argv[1]
    f = Func("cached_" + tag, lambda s: (s.input("x", (5,)) * 3.0).tanh().sum()
             + s.param("w", ()))
    f = f.with_param("w", 1.0)
    out = f.run(x=np.arange(5, dtype=np.float32))[0]
    print(json.dumps({"out": float(out), "llvmlite": "llvmlite" in sys.modules, **B.STATS}))
""")


def _func(tag):
    f = Func("cached_" + tag, lambda s: (s.input("x", (5,)) * 3.0).tanh().sum()
             + s.param("w", ()))
    return f.with_param("w", 1.0)


def _expected():
    return float(np.tanh(np.arange(5) * 3.0).sum() + 1.0)


def _subprocess(tag, cache, wait=True):
    env = {**os.environ, "RLXC_CACHE_DIR": str(cache)}
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, tag], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    if not wait:
        return p
    return _result(p)


def _result(p):
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("RLXC_CACHE_DIR", str(d))
    B.clear_memory_cache()
    monkeypatch.setattr(C, "_fingerprint", None)  # recomputed, as a subprocess does
    monkeypatch.setattr(C, "_warned", set())
    yield d
    B.clear_memory_cache()


def _entries(d):
    js = sorted(p for p in d.iterdir() if p.suffix == ".json")
    sos = sorted(p for p in d.iterdir() if p.suffix == ".so")
    return js, sos


def test_hits_and_misses(cache):
    f = _func("hits")
    c0 = B.STATS["compiles"]
    assert np.isclose(f.run(x=np.arange(5, dtype=np.float32))[0], _expected())
    assert B.STATS["compiles"] == c0 + 1
    m0 = B.STATS["memory_hits"]
    B.executor(f, "cpu")
    assert B.STATS["compiles"] == c0 + 1 and B.STATS["memory_hits"] == m0 + 1
    B.clear_memory_cache()
    d0 = B.STATS["disk_hits"]
    assert np.isclose(f.run(x=np.arange(5, dtype=np.float32))[0], _expected())
    assert B.STATS["compiles"] == c0 + 1 and B.STATS["disk_hits"] == d0 + 1
    g = Func("other", lambda s: s.input("x", (5,)) + 2.0)  # another IR: a miss
    g.run(x=np.zeros(5, np.float32))
    assert B.STATS["compiles"] == c0 + 2
    js, sos = _entries(cache)
    assert len(js) == 2 and len(sos) == 2
    info = json.loads(js[0].read_text())
    assert info["format"] == C.FORMAT and info["kind"] == "cpu" and len(info["sha256"]) == 64


def test_second_process_compiles_nothing(cache):
    first = _subprocess("proc", cache)
    assert first["compiles"] == 1
    second = _subprocess("proc", cache)
    assert second["compiles"] == 0 and second["disk_hits"] == 1
    assert np.isclose(second["out"], _expected())
    assert first["llvmlite"] and not second["llvmlite"], "a cache hit must not even load LLVM"


def _corrupt_so(path):
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flip_so", "truncate_so", "truncate_json", "garbage_json",
                                    "delete_so"])
def test_corrupt_entry_is_rebuilt_not_loaded(cache, damage):
    _subprocess("bad", cache)
    (js,), (so,) = _entries(cache)
    if damage == "flip_so":
        _corrupt_so(so)
    elif damage == "truncate_so":
        so.write_bytes(so.read_bytes()[:1000])
    elif damage == "truncate_json":
        js.write_text(js.read_text()[:40])
    elif damage == "garbage_json":
        js.write_text(json.dumps({"format": "rlxc-cpu-cache", "sha256": "0" * 64}))
    else:
        so.unlink()
    c0, r0 = B.STATS["compiles"], B.STATS["rejected"]
    f = _func("bad")
    with pytest.warns(C.CacheWarning, match="dropped entry"):
        assert np.isclose(f.run(x=np.arange(5, dtype=np.float32))[0], _expected())
    assert B.STATS["compiles"] == c0 + 1 and B.STATS["rejected"] == r0 + 1
    # the rebuilt entry is valid: a fresh process loads it without compiling
    again = _subprocess("bad", cache)
    assert again["compiles"] == 0 and np.isclose(again["out"], _expected())


def test_two_processes_compile_the_same_function_at_once(cache):
    procs = [_subprocess("race", cache, wait=False) for _ in range(2)]
    results = [_result(p) for p in procs]
    for r in results:
        assert np.isclose(r["out"], _expected())
    third = _subprocess("race", cache)
    assert third["compiles"] == 0 and np.isclose(third["out"], _expected())
    js, sos = _entries(cache)
    assert len(js) == 1
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp")]


def test_jit_with_param_does_not_recompile(cache):
    f = _func("jit")
    j = f.jit()
    c0 = B.STATS["compiles"]
    x = np.arange(5, dtype=np.float32)
    assert np.isclose(j.run(x=x)[0], _expected())
    assert np.isclose(j.run(x)[0], _expected())
    j2 = j.with_param("w", 5.0)
    assert np.isclose(j2.run(x=x)[0], _expected() + 4.0)
    assert np.isclose(j.run({"x": x})[0], _expected())  # the original keeps its binding
    assert np.isclose(j.run(x=x, w=np.float32(2.0))[0], _expected() + 1.0)  # per-call override
    assert np.isclose(j.run(x=x)[0], _expected())
    assert B.STATS["compiles"] == c0 and j2.lib is j.lib


def test_cache_key_covers_options(cache):
    f = _func("opts")
    a = B.library(f, "cpu")
    b = B.library(f, "cpu", opt=1)
    assert a is not b and B.library(f, "cpu") is a
    with pytest.raises(TypeError, match="unknown backend options"):
        B.library(f, "cpu", fast=True)
