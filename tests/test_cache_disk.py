"""The compile cache on a full or unusable disk, and the temporary files it cleans up
(issue 13 item 13); the GPU path's disk cache and the compiler fingerprint (issue 12).

- a cache folder on a full filesystem (a 4 KiB tmpfs, when this runs as root) or a
  JSON write that fails with ENOSPC: the program is compiled into a private
  temporary folder with one CacheWarning, and no half-written entry is left;
- that private folder (and compile_cpu's own temporary folder) is gone when the
  process exits; temporary files of killed compiles and killed checkpoint saves
  are removed by the next write.
"""
from __future__ import annotations

import errno
import glob
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings

import numpy as np
import pytest

import rlxc.backends as B
import rlxc.cache as C
from rlxc import Func

SCRIPT = textwrap.dedent("""
    import json, os, sys, warnings
    import numpy as np
    import rlxc.backends as B
    import rlxc.cache as C
    from rlxc import Func
    from rlxc.lowering.cpu.driver import compile_cpu
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        f = Func("disk", lambda s: (s.input("x", (5,)) * 3.0).tanh() + 1.0)
        out = f.run(x=np.arange(5, dtype=np.float32))[0]
    tmp_so = compile_cpu(f.module, "disk2").so_path if len(sys.argv) > 1 else None
    print(json.dumps({"out": out.tolist(), "pid": os.getpid(), "tmp_so": tmp_so,
                      "private": C._private[0] if C._private else None,
                      "warnings": [str(w.message) for w in caught], **B.STATS}))
""")


def _want():
    return (np.tanh(np.arange(5, dtype=np.float32) * np.float32(3.0)) + 1.0).tolist()


def _run(cache, *args):
    env = {**os.environ, "RLXC_CACHE_DIR": str(cache)}
    p = subprocess.run([sys.executable, "-c", SCRIPT, *args], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, f"exit {p.returncode}: {p.stderr[-2000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _age(path, seconds):
    t = time.time() - seconds
    os.utime(path, (t, t))


@pytest.fixture
def tiny_fs(tmp_path):
    """A 4 KiB tmpfs (root only): nothing bigger than one page fits."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {p.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_full_filesystem_falls_back_to_a_private_folder(tiny_fs):
    cache = tiny_fs / "cache"
    r = _run(cache, "tmp")
    assert np.allclose(r["out"], _want())
    assert r["fallbacks"] == 1 and r["compiles"] == 1
    (w,) = [w for w in r["warnings"] if "compile cache" in w]
    assert "private temporary directory" in w and str(cache) in w
    assert [p.name for p in tiny_fs.rglob("*")] == ["cache"]  # nothing half-written
    assert r["private"] and not os.path.exists(r["private"])  # removed at exit
    assert r["tmp_so"] and not os.path.exists(os.path.dirname(r["tmp_so"]))
    again = _run(cache)  # still no entry (it cannot fit): compiles again, still correct
    assert again["compiles"] == 1 and np.allclose(again["out"], _want())


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("RLXC_CACHE_DIR", str(d))
    monkeypatch.setattr(C, "_warned", set())
    B.clear_memory_cache()
    yield d
    B.clear_memory_cache()


def test_json_that_does_not_fit_leaves_no_orphan_library(cache, monkeypatch):
    """The library fits, its JSON does not (ENOSPC on the commit step): the library is
    removed again and the program runs from the private folder."""
    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", path)
    monkeypatch.setattr(C, "write_atomic", full)
    f0 = B.STATS["fallbacks"]
    f = Func("nojson", lambda s: s.input("x", (5,)) * 2.0)
    with pytest.warns(C.CacheWarning, match="No space left"):
        out = f.run(x=np.arange(5, dtype=np.float32))[0]
    np.testing.assert_array_equal(out, np.arange(5) * 2.0)
    assert B.STATS["fallbacks"] == f0 + 1
    assert sorted(p.name for p in cache.iterdir()) == []  # no .so, no .tmp
    lib = B.library(f)
    assert os.path.dirname(lib.path) == C.private_dir()


def test_unwritable_cache_path_falls_back(tmp_path, monkeypatch):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    monkeypatch.setenv("RLXC_CACHE_DIR", str(not_a_dir))
    monkeypatch.setattr(C, "_warned", set())
    B.clear_memory_cache()
    f = Func("unwritable", lambda s: s.input("x", (3,)) + 1.0)
    with pytest.warns(C.CacheWarning, match="not a writable directory"):
        out = f.run(x=np.zeros(3, np.float32))[0]
    np.testing.assert_array_equal(out, 1.0)
    B.clear_memory_cache()


def test_stale_temporary_files_are_removed(cache):
    cache.mkdir(parents=True)
    dead, me = _dead_pid(), os.getpid()
    stale = [cache / f".tmp-p{dead}-0123456789ab.so", cache / f".tmp-.tmp-p{dead}-x.soQ1w2",
             cache / ".tmp-unknown"]
    kept = [cache / f".tmp-p{dead}-fresh.so", cache / f".tmp-p{me}-mine.part",
            cache / "unrelated.txt", cache / f".tmp-p{me}-long-running.so"]
    for p in stale + kept:
        p.write_bytes(b"x")
    for p in stale[:2] + kept[1:]:
        _age(p, 2 * C.DEAD_AGE)
    _age(stale[2], 2 * C.STALE_AGE)
    _age(kept[3], 2 * C.STALE_AGE)  # a live process's, however old
    Func("sweep", lambda s: s.input("x", (2,)) * 5.0).run(x=np.ones(2, np.float32))
    left = {p.name for p in cache.iterdir()}
    assert not any(p.name in left for p in stale)
    assert all(p.name in left for p in kept)


def test_killed_process_private_folders_are_removed(tmp_path, monkeypatch):
    dead = _dead_pid()
    old = tempfile.mkdtemp(prefix=f"rlxc-cache-p{dead}-")
    _age(old, 2 * C.DEAD_AGE)
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    r = _run(blocker / "cache", "tmp")  # a path under a file: never writable
    assert np.allclose(r["out"], _want()) and r["fallbacks"] == 1
    assert not os.path.exists(old)
    assert not os.path.exists(r["private"])
    assert not glob.glob(os.path.join(tempfile.gettempdir(), f"rlxc-*p{r['pid']}-*"))


def test_checkpoint_save_removes_temporaries_of_killed_saves(tmp_path):
    from rlxc.checkpoint import load_tensors, save_tensors

    dead = _dead_pid()
    stale = [tmp_path / f".w.safetensors.p{dead}.abc123.tmp", tmp_path / ".w.safetensors.old.tmp"]
    kept = [tmp_path / f".w.safetensors.p{dead}.fresh.tmp", tmp_path / ".other.safetensors.x.tmp"]
    for p in stale + kept:
        p.write_bytes(b"partial")
    _age(stale[0], 2 * C.DEAD_AGE)
    _age(stale[1], 2 * C.STALE_AGE)
    _age(kept[1], 2 * C.STALE_AGE)  # another checkpoint's: not this save's business
    save_tensors(tmp_path / "w.safetensors", {"a": np.ones(3, np.float32)})
    assert load_tensors(tmp_path / "w.safetensors")["a"].tolist() == [1, 1, 1]
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)
    assert not list(tmp_path.glob(f".w.safetensors.p{os.getpid()}.*"))


# ------------------------------------------------------------------ fingerprint

def test_fingerprint_hashes_every_source_file_recursively(tmp_path, monkeypatch):
    root = tmp_path / "lowering"
    (root / "cpu").mkdir(parents=True)
    (root / "a.py").write_text("A = 1\n")
    (root / "cpu" / "driver.py").write_text("B = 1\n")
    (root / "cpu" / "notes.txt").write_text("not code")
    real = C._package_dir
    monkeypatch.setattr(C, "_package_dir",
                        lambda name: str(root) if name == "rlxc.lowering" else real(name))

    def fp():
        monkeypatch.setattr(C, "_fingerprint", None)
        return C.compiler_fingerprint()
    base = fp()
    assert fp() == base
    (root / "cpu" / "notes.txt").write_text("still not code")
    assert fp() == base
    (root / "cpu" / "driver.py").write_text("B = 2\n")  # a file in a subfolder
    changed = fp()
    assert changed != base
    (root / "cpu" / "new.py").write_text("")  # a new file
    assert fp() != changed
    monkeypatch.setattr(C, "_fingerprint", None)
    assert not hasattr(B, "CPU_SOURCES")


def test_fingerprint_covers_the_dialect():
    assert "rlxc.dialect" in C.FINGERPRINT_PACKAGES and "rlxc.lowering" in C.FINGERPRINT_PACKAGES
    assert os.path.isfile(os.path.join(C._package_dir("rlxc.dialect"), "ops.py"))


# ------------------------------------------------------------------ GPU

@pytest.fixture
def emulated_gpu(monkeypatch):
    """The GPU path on the emulating driver (lowering/gpu/emu.py): compile_cuda builds
    the emulation artifact, programs load on an EmuDriver."""
    from rlxc.lowering.gpu import driver as gpu_kernels
    from rlxc.lowering.gpu import emu as gpu_emu
    from rlxc.runtime import cuda as rt

    real_program, real_context = rt.CudaProgram, rt.context
    monkeypatch.setattr(rt, "context", lambda ordinal=0, drv=None:
                        real_context(ordinal, drv or gpu_emu.EmuDriver()))
    monkeypatch.setattr(gpu_kernels, "compile_cuda",
                        lambda module, name=None, arch="sm_90", **k:
                        gpu_emu.emulation_artifact(module, name))
    monkeypatch.setattr(rt, "CudaProgram", lambda meta, blobs, **k:
                        real_program(meta, blobs, drv=gpu_emu.EmuDriver()))


def test_gpu_programs_use_the_disk_cache(cache, emulated_gpu):
    f = Func("gpu_cached", lambda s: (s.input("x", (5,)) * 3.0).tanh() + 1.0)
    x = np.arange(5, dtype=np.float32)
    c0 = B.STATS["compiles"]
    np.testing.assert_allclose(B.cuda_program(f).run([x])[0], _want(), rtol=1e-6)
    assert B.STATS["compiles"] == c0 + 1
    (js,) = cache.glob("*.json")
    info = json.loads(js.read_text())
    assert info["kind"] == "cuda" and info["file"].endswith(".rlxgpu")
    B.clear_memory_cache()  # as a new process: from disk, nothing compiled
    d0 = B.STATS["disk_hits"]
    np.testing.assert_allclose(B.cuda_program(f).run([x])[0], _want(), rtol=1e-6)
    assert B.STATS["compiles"] == c0 + 1 and B.STATS["disk_hits"] == d0 + 1
    # an altered entry (forged output shape, checksum recomputed) is dropped and rebuilt
    info["meta"]["outputs"][0]["shape"] = [50]
    fields = {k: v for k, v in info.items() if k != "checksum"}
    js.write_text(json.dumps({**fields, "checksum": C._checksum(fields)}))
    B.clear_memory_cache()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        np.testing.assert_allclose(B.cuda_program(f).run([x])[0], _want(), rtol=1e-6)
    assert B.STATS["compiles"] == c0 + 2
    assert any("dropped entry" in str(w.message) for w in caught)


def test_links_are_reproducible(tmp_path):
    """The linker names the base version definition after the soname, else after the
    output path (a random `.tmp-pPID-*` name in the cache): two builds of the same code
    differed, and concurrent compiles of one Func each left a payload in the cache.  The
    soname is now the file name, or a digest of the objects for a temporary one."""
    import shutil

    from rlxc.lowering.cpu import target

    ir = ('define i32 @f(i32 %x) {\n  %y = add i32 %x, 1\n  ret i32 %y\n}\n'
          '@g = weak global i32 0\n')
    obj = target.emit_object(target.compile_ir(ir))
    a = target.link_shared([obj], str(tmp_path / ".tmp-p1-aaaa.so"))
    b = target.link_shared([obj], str(tmp_path / ".tmp-p2-bbbbbbbb.so"))
    with open(a, "rb") as fa, open(b, "rb") as fb:
        assert fa.read() == fb.read()
    lib = target.link_shared([obj], str(tmp_path / "libmodel.so"))
    if shutil.which("readelf"):
        out = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True).stdout
        assert "Library soname: [libmodel.so]" in out
        out = subprocess.run(["readelf", "-d", a], capture_output=True, text=True).stdout
        assert "Library soname: [rlxc-" in out and ".tmp" not in out
