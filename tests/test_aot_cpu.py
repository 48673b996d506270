"""A library built for a newer CPU refuses to load instead of dying of SIGILL (issue 13 item 6).

NAME.json records the instruction-set features the code may use
(lowering/artifact/isa.py asks LLVM); the runtime loader compares them with
/proc/cpuinfo before dlopen, and the glue checks them again with cpuid/xgetbv
in NAME_check_cpu / NAME_check_abi / NAME_create.  The "newer CPU" here is a
real one: the first CPU name rlxc accepts whose features this host lacks
(graniterapids' amx-fp16 on a Sapphire Rapids host, sapphirerapids' AMX on an
AMD host, znver4's sse4a on an Intel one).  No code of it ever runs.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

import rlxc
from rlxc import ArtifactError

pytest.importorskip("rlxc.lowering.cpu.driver", reason="lowering/cpu/driver.py not available")

from rlxc import export  # noqa: E402
from rlxc.cli.compile import CPU_NAMES  # noqa: E402
from rlxc.lowering.artifact.isa import PORTABLE_CPU, required_features  # noqa: E402
from rlxc.runtime import cpufeatures  # noqa: E402
from rlxc.runtime import load  # noqa: E402

CC = shutil.which("cc") or shutil.which("gcc")


def _func():
    return rlxc.Func("net", lambda s: (s.input("x", (4, 8)) @ s.param("w", (8, 8))).tanh()
                     ).init_randn(seed=2, stddev=0.3)


def _foreign_cpu():
    """(cpu name, features this host lacks) for the first such CPU, or skip."""
    host = cpufeatures.host_features()
    if host is None:
        pytest.skip("this OS does not report CPU features (/proc/cpuinfo)")
    for cpu in ("graniterapids", "sapphirerapids", "znver4") + CPU_NAMES:
        missing = [f for f in required_features(cpu) if f not in host]
        if missing:
            return cpu, missing
    pytest.skip("this host has every feature of every CPU rlxc knows")


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    cpu, missing = _foreign_cpu()
    d = tmp_path_factory.mktemp("cpu") / "net"
    export.build_artifact(export.spec_from_func(_func(), "net", cpu=cpu), str(d))
    return d, cpu, missing


def test_portable_is_x86_64_v3_and_recorded(tmp_path):
    d = tmp_path / "p"
    meta = export.build_artifact(export.spec_from_func(_func(), "p", cpu="portable"), str(d))
    assert PORTABLE_CPU == "x86-64-v3" and meta["cpu"] == "x86-64-v3"
    feats = set(json.loads((d / "p.json").read_text())["cpu_features"])
    assert {"avx2", "fma", "f16c", "bmi2", "sse4.2"} <= feats
    assert not {f for f in feats if f.startswith(("avx512", "amx"))}, feats
    assert load(d).run(x=[[0.5] * 8] * 4)[0].shape == (4, 8)


def test_llvm_defines_the_features():
    assert "avx512f" in required_features("skylake-avx512")
    assert "avx512f" not in required_features("x86-64-v3")
    assert "sse4a" in required_features("znver4") and "sse4a" not in required_features("haswell")


def test_native_build_refused_on_an_older_cpu(tmp_path, monkeypatch):
    """A host that only has x86-64-v3 (an AVX2 machine) refuses a native AVX-512 build."""
    native = required_features("native")
    extra = [f for f in native if f not in required_features(PORTABLE_CPU)]
    if not extra:
        pytest.skip("this host has no feature beyond x86-64-v3")
    d = tmp_path / "n"
    export.build_artifact(export.spec_from_func(_func(), "n"), str(d))
    monkeypatch.setattr(cpufeatures, "host_features",
                        lambda: frozenset(required_features(PORTABLE_CPU)))
    with pytest.raises(ArtifactError) as e:
        load(d)
    msg = str(e.value)
    assert "which this CPU lacks" in msg and all(f in msg for f in extra), msg


def test_python_refuses_before_dlopen(foreign):
    d, cpu, missing = foreign
    with pytest.raises(ArtifactError) as e:
        load(d)
    msg = str(e.value)
    assert f"built for CPU {cpu}" in msg and ", ".join(missing) in msg, msg


def test_library_refuses_itself_when_python_cannot_tell(foreign, monkeypatch):
    """Without /proc/cpuinfo the library's own cpuid check (NAME_check_cpu) refuses."""
    d, cpu, missing = foreign
    monkeypatch.setattr(cpufeatures, "host_features", lambda: None)
    with pytest.raises(ArtifactError) as e:
        load(d)
    msg = str(e.value)
    assert "which this CPU lacks" in msg and ", ".join(missing) in msg, msg


PROGRAM = textwrap.dedent(r"""
    #include <stdio.h>
    #include "net.h"

    int main(void)
    {
        int rc = net_check_abi();
        net_ctx *ctx;
        printf("check_abi %d %s\n", rc, rc == RLX_ERR_CPU ? "RLX_ERR_CPU" : "?");
        printf("error %s\n", net_last_error(NULL));
        ctx = net_create();
        printf("create %s\n", ctx == NULL ? "NULL" : "ctx");
        if (ctx != NULL) {
            static float x[32], y[32];
            const float *in[] = {x};
            float *out[] = {y};
            net_run(ctx, in, out); /* would die of SIGILL */
            net_destroy(ctx);
        }
        return 0;
    }
""")


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_c_program_gets_a_clean_error(foreign, tmp_path):
    d, cpu, missing = foreign
    src = tmp_path / "main.c"
    src.write_text(PROGRAM)
    exe = tmp_path / "main"
    subprocess.run([CC, "-std=c99", "-Wall", "-Werror", str(src), "-I", str(d), "-L", str(d),
                    "-lnet", f"-Wl,-rpath,{d}", "-o", str(exe)], check=True)
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    lines = p.stdout.splitlines()
    assert lines[0] == "check_abi 8 RLX_ERR_CPU" and lines[2] == "create NULL", p.stdout
    assert f"built for CPU {cpu}" in lines[1] and ", ".join(missing) in lines[1], lines[1]


def test_cpu_check_runs_in_a_fresh_process(foreign):
    """The whole path (import of the package included) in a new interpreter: exit 1, no signal."""
    d, cpu, missing = foreign
    p = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(d)!r}); "
                        "import net"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "ArtifactError" in p.stderr and missing[0] in p.stderr, \
        (p.returncode, p.stderr[-400:])
