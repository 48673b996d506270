"""benchmarks/isacap: cpuid capped at AVX2 by CPUID faulting (compare.py --peer-isa avx2).

Each check runs in a fresh child process: CPUID faulting is per thread and inherited by
threads created later, and a SIGSEGV handler must not be left in the test process."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
sys.path.insert(0, BENCH)
import isacap  # noqa: E402

sys.path.remove(BENCH)

WHY = isacap.unavailable()
needs_fault = pytest.mark.skipif(WHY is not None, reason=f"isacap cannot run here: {WHY}")


def _child(code, timeout=120):
    env = dict(os.environ)
    env.pop("PYTHONFAULTHANDLER", None)
    src = f"import sys; sys.path.insert(0, {BENCH!r}); import isacap\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_unavailable_names_the_missing_cpu_flag(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 avx512f\n")
    why = isacap.unavailable(str(info))
    if isacap.platform.machine() in ("x86_64", "AMD64"):
        assert "cpuid_fault" in why
    else:
        assert "x86-64" in why


@needs_fault
def test_capped_cpuid_hides_avx512_from_every_thread_and_numpy():
    r = _child("""
        real = [isacap.cpuid(7, 0), isacap.cpuid(7, 1), isacap.cpuid(0xD, 0), isacap.cpuid(1)]
        isacap.enable()
        st = isacap.state()
        assert st["faulting"] and st["handler"], st
        capped = isacap.cpuid(7, 0)
        assert isacap.state()["emulated"] > st["emulated"]      # it went through the trap
        assert not capped[1] >> 16 & 1, hex(capped[1])           # AVX512F
        assert not capped[1] >> 30 & 1 and not capped[1] >> 31 & 1   # BW, VL
        assert not capped[3] >> 24 & 1                           # AMX-TILE
        assert not isacap.cpuid(7, 1)[0] >> 5 & 1                # AVX512_BF16
        assert capped[1] >> 5 & 1 == real[0][1] >> 5 & 1         # AVX2 as the CPU says
        assert isacap.cpuid(1) [2] == real[3][2]                 # FMA, AVX, OSXSAVE kept
        assert isacap.cpuid(0xD, 0)[0] == real[2][0]             # XCR0-wide state kept
        import threading
        seen = []
        t = threading.Thread(target=lambda: seen.append((isacap.avx512f(),
                                                         isacap.state()["faulting"])))
        t.start(); t.join()
        assert seen == [(False, True)], seen                     # inherited by new threads
        import numpy
        try:
            from numpy._core._multiarray_umath import __cpu_features__ as f
        except ImportError:
            from numpy.core._multiarray_umath import __cpu_features__ as f
        assert not f["AVX512F"], f
        assert f["AVX2"] == bool(real[0][1] >> 5 & 1)
        print("OK", bool(real[0][1] >> 16 & 1))
    """)
    assert r.returncode == 0, r.stderr
    assert "OK" in r.stdout


@needs_fault
@pytest.mark.parametrize("how", ["fault", "fault_in_thread", "raise", "faulthandler_before",
                                 "faulthandler_after"])
def test_real_sigsegv_still_kills(how):
    """A SIGSEGV that is not a trapped cpuid reaches the previous handler or the default
    action: the process dies of it, and Python's faulthandler still reports it, whether it
    was enabled before the cap or after (then reinstall() chains to it)."""
    r = _child(f"""
        import ctypes, faulthandler, os, signal, threading
        how = {how!r}
        if how == "faulthandler_before":
            faulthandler.enable()
        isacap.enable()
        if how == "faulthandler_after":
            faulthandler.enable()
            assert isacap.reinstall() is True
        assert not isacap.avx512f()
        print("capped", flush=True)
        if how == "raise":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif how == "fault_in_thread":
            t = threading.Thread(target=lambda: ctypes.string_at(0)); t.start(); t.join()
        else:
            ctypes.string_at(0)
        print("SURVIVED", flush=True)
    """, timeout=60)
    assert "capped" in r.stdout, r.stderr
    assert "SURVIVED" not in r.stdout
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stderr)
    if how.startswith("faulthandler"):
        assert "Segmentation fault" in r.stderr, r.stderr


@needs_fault
def test_enable_refuses_when_threads_already_run():
    r = _child("""
        import threading
        ev = threading.Event()
        t = threading.Thread(target=ev.wait); t.start()
        try:
            isacap.enable()
        except isacap.IsacapError as e:
            print("REFUSED", e)
        ev.set(); t.join()
    """)
    assert r.returncode == 0, r.stderr
    assert "REFUSED 2 threads already run" in r.stdout, r.stdout


@needs_fault
def test_compare_header_reports_capped_cpuid():
    """compare.py --peer-isa avx2 traps cpuid before NumPy loads and says so per peer."""
    pytest.importorskip("threadpoolctl")
    r = _child("""
        import types
        import compare
        compare._setup_threads(1); compare._setup_peer_isa('avx2')
        compare._setup_cpuid_cap('avx2')
        compare._MODS['torch'] = compare.Skip('off'); compare._MODS['jax'] = compare.Skip('off')
        print('\\n'.join(compare.peer_isa_report(types.SimpleNamespace(peer_isa='avx2'))))
        from numpy._core._multiarray_umath import __cpu_features__ as f
        print('numpy AVX512F', f['AVX512F'])
        import subprocess
        child = compare._cpuid_cap_prelude() + (
            "import isacap; print('child', isacap.avx512f(), isacap.state()['faulting'])")
        print(subprocess.run([sys.executable, "-c", child], capture_output=True,
                             text=True).stdout)
    """)
    assert r.returncode == 0, r.stderr
    assert "cpuid: capped at AVX2 by CPUID faulting" in r.stdout, r.stdout
    assert "leaf 7 AVX512F=0" in r.stdout and "SIGSEGV handler in place" in r.stdout
    assert "numpy AVX512F False" in r.stdout
    assert "child False True" in r.stdout     # exec dropped the trap; the prelude re-arms it


def test_compare_header_says_when_cpuid_is_not_capped():
    """Without the cap (here: never set up) the header says XLA's dots are NOT capped."""
    r = _child("""
        import types
        import compare
        compare._CPUID_CAP.update(on=False, why="no cpuid_fault")
        compare._MODS['torch'] = compare.Skip('off'); compare._MODS['jax'] = compare.Skip('off')
        print('\\n'.join(compare.peer_isa_report(types.SimpleNamespace(peer_isa='avx2'))))
    """)
    assert r.returncode == 0, r.stderr
    assert "cpuid: NOT capped (no cpuid_fault)" in r.stdout, r.stdout


@needs_fault
def test_rlxc_compiles_and_runs_under_the_cap(tmp_path):
    """rlxc in the capped process (compare.py's): its load-time check reads
    /proc/cpuinfo, its library's own check reads the capped cpuid; an AVX2 (znver3) build
    passes both and runs, and so does a native one (LLVM then sees an AVX2 host)."""
    env_cache = str(tmp_path / "cache")
    r = _child(f"""
        import os
        os.environ["RLXC_CACHE_DIR"] = {env_cache!r}
        isacap.enable()
        import numpy as np
        from rlxc import Func
        from rlxc.registry import backend
        from rlxc.runtime.cpufeatures import host_features, missing_features
        assert "avx2" in host_features()
        assert missing_features(["avx2", "fma"]) == []
        x = np.arange(64, dtype=np.float32)
        for cpu in ("znver3", "native"):
            backend("cpu").default_cpu = cpu
            f = Func("isacap_" + cpu, lambda s: (s.input("x", (64,)) * 2.0 + 1.0).tanh().sum())
            got = f.jit().run(x)[0]
            assert np.allclose(got, np.tanh(x * 2 + 1).sum(), rtol=1e-5), (cpu, got)
        assert not isacap.avx512f() and isacap.state()["handler"]
        print("OK")
    """, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "OK" in r.stdout


@needs_fault
def test_openmp_worker_threads_inherit_the_cap(tmp_path):
    """libgomp's pool (like XLA's and Eigen's) is created after enable(): every worker
    executes its own cpuid and must see the capped leaf 7."""
    src = tmp_path / "omp.c"
    src.write_text(textwrap.dedent("""
        #include <cpuid.h>
        int omp_cpuid_avx512f(int *nthreads) {
            int seen = 0, n = 0;
            #pragma omp parallel num_threads(4) reduction(+:seen, n)
            { unsigned a, b, c, d; __cpuid_count(7, 0, a, b, c, d);
              seen += (b >> 16) & 1; n += 1; }
            *nthreads = n; return seen;
        }
    """))
    so = tmp_path / "omp.so"
    cc = subprocess.run([os.environ.get("CC", "cc"), "-O2", "-fPIC", "-shared", "-fopenmp",
                         "-o", str(so), str(src)], capture_output=True, text=True)
    if cc.returncode != 0:
        pytest.skip(f"cc -fopenmp does not build here: {cc.stderr.strip()[:200]}")
    r = _child(f"""
        import ctypes
        isacap.enable()
        lib = ctypes.CDLL({str(so)!r})
        n = ctypes.c_int()
        seen = lib.omp_cpuid_avx512f(ctypes.byref(n))
        print("threads", n.value, "avx512f", seen, "trapped", isacap.state()["emulated"])
    """)
    assert r.returncode == 0, r.stderr
    assert "threads 4 avx512f 0" in r.stdout, r.stdout
    assert int(r.stdout.split("trapped")[1]) >= 4


def test_build_refuses_a_shared_cache_directory(tmp_path, monkeypatch):
    """The shim is loaded into the process: never from a directory others can write."""
    shared = tmp_path / "rlxc-isacap"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(isacap.IsacapError, match="not a private directory"):
        isacap.build()
