"""Two rlxc libraries in one process keep to themselves (issue 13 item 7).

Each libNAME.so exports the documented ABI only (the version script of
lowering/artifact/cc.py); the kernels, the OpenMP thread setting and sgemm are
local.  Before, `NAME_set_num_threads` called the exported weak
`rlxc_set_num_threads` through the PLT, which the dynamic linker resolved to
the first definition in the process: another library's, or the program's.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import textwrap

import numpy as np
import pytest

import rlxc

pytest.importorskip("rlxc.lowering.cpu.driver", reason="lowering/cpu/driver.py not available")

from rlxc import export  # noqa: E402

CC = shutil.which("cc") or shutil.which("gcc")
NM = shutil.which("nm")


def _model(scale):
    return rlxc.Func("m", lambda s: (s.input("x", (64, 64)) @ s.param("w", (64, 64))).relu()
                     * scale).init_randn(seed=3, stddev=0.1)


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    root = tmp_path_factory.mktemp("iso")
    for n, scale in (("m1", 1.0), ("m2", 2.0)):
        export.build_artifact(export.spec_from_func(_model(scale), n), str(root / n))
    return root


def _abi(header: str, name: str) -> set[str]:
    """The functions NAME.h declares (static inline ones are not in the library)."""
    text = re.sub(r"/\*.*?\*/", "", open(header).read(), flags=re.S)
    inline = set(re.findall(rf"static inline \w+ ({name}_\w+)\(", text))
    return set(re.findall(rf"\b({name}_\w+)\(", text)) - inline


@pytest.mark.skipif(NM is None, reason="nm not found")
def test_library_exports_only_its_abi(libs):
    for n in ("m1", "m2"):
        out = subprocess.run([NM, "-D", "--defined-only", str(libs / n / f"lib{n}.so")],
                             capture_output=True, text=True, check=True).stdout
        exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
        assert exported == _abi(str(libs / n / f"{n}.h"), n), exported ^ _abi(
            str(libs / n / f"{n}.h"), n)


PROGRAM = textwrap.dedent(r"""
    #include <stdio.h>
    #include "m1.h"
    #include "m2.h"

    /* Interposes on the libraries' internal thread setter if they let it escape. */
    int escaped = 0;
    void rlxc_set_num_threads(int n) { (void)n; ++escaped; }

    int main(void)
    {
        static float x[64 * 64], y1[64 * 64], y2[64 * 64];
        const float *in[] = {x};
        float *o1[] = {y1}, *o2[] = {y2};
        m1_ctx *a;
        m2_ctx *b;
        int i;
        if (m1_check_abi() != RLX_OK || m2_check_abi() != RLX_OK)
            return 2;
        for (i = 0; i < 64 * 64; ++i)
            x[i] = (float)(i % 7) * 0.25f;
        m1_set_num_threads(1);
        m2_set_num_threads(2);
        a = m1_create();
        b = m2_create();
        if (!a || !b || m1_run(a, in, o1) != RLX_OK || m2_run(b, in, o2) != RLX_OK)
            return 3;
        for (i = 0; i < 64 * 64; ++i)
            if (y2[i] != 2.0f * y1[i] && !(y1[i] == 0.0f && y2[i] == 0.0f))
                break;
        printf("escaped %d same %d\n", escaped, i == 64 * 64);
        m1_destroy(a);
        m2_destroy(b);
        return 0;
    }
""")


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_two_libraries_in_one_program_keep_their_internals(libs, tmp_path):
    src = tmp_path / "two.c"
    src.write_text(PROGRAM)
    exe = tmp_path / "two"
    cmd = [CC, "-std=c99", "-Wall", "-O1", "-rdynamic", str(src), "-o", str(exe)]
    for n in ("m1", "m2"):
        cmd += ["-I", str(libs / n), "-L", str(libs / n), f"-l{n}", f"-Wl,-rpath,{libs / n}"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.split() == ["escaped", "0", "same", "1"], p.stdout


def test_two_libraries_loaded_from_python(libs):
    """Both libraries through the runtime (RTLD_LOCAL) still give their own results."""
    from rlxc.runtime import load

    x = np.linspace(-1, 1, 64 * 64, dtype=np.float32).reshape(64, 64)
    a, b = load(libs / "m1"), load(libs / "m2")
    np.testing.assert_allclose(b.run(x=x)[0], 2 * a.run(x=x)[0], rtol=1e-6)
