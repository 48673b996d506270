"""The C ABI: examples/embed_c built with make + cc, run, and checked.

One `make` per module builds the two example models (through `rlxc
compile`) and the three programs: run_mlp (outputs compared with Func.run),
train_tiny (the loss goes down when training from C) and threads (two
contexts on two threads at once).  Error handling is checked by a small C
program written here, against an artifact without baked params.  With
valgrind installed, the programs are rerun under
`valgrind --leak-check=full --error-exitcode=1` (marked slow).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("rlxc.lowering.cpu.driver", reason="lowering/cpu/driver.py not available")

from rlxc import export as aot  # noqa: E402
from rlxc.lowering.artifact.cc import check_header  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "embed_c")
VALGRIND = shutil.which("valgrind")
# one thread: libgomp's worker threads are not joined at exit, which valgrind reports
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RLXC_NUM_THREADS": "1"}
# a CPU valgrind can emulate (it has no AVX-512): the programs run under it too
CPU = "x86-64-v3"


def _example_models():
    sys.path.insert(0, EXAMPLE)
    try:
        import model
    finally:
        sys.path.remove(EXAMPLE)
    return model


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    out = tmp_path_factory.mktemp("embed_c")
    rlxc_cmd = f"{sys.executable} -m rlxc.cli.main"
    p = subprocess.run(["make", "-C", EXAMPLE, f"BUILD={out}", f"RLXC={rlxc_cmd}",
                        f"RLXC_FLAGS=--cpu {CPU}"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return out


def _run(cmd, env=None, timeout=120):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or ENV)


def _parse_outputs(text: str) -> list[np.ndarray]:
    outs = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"output (\d+) (\S+) \[([\d, ]*)\]", line)
        if m:
            shape = tuple(int(d) for d in m.group(3).split(",") if d.strip())
            vals = np.array([float(v) for v in lines[i + 1].split()], np.float32)
            outs.append(vals.reshape(shape))
    return outs


def test_run_mlp_matches_func(build):
    p = _run([str(build / "run_mlp")])
    assert p.returncode == 0, p.stderr
    model = _example_models()
    f = model.mlp()
    x = model.example_input(f.input_shape_of("x"))
    got = _parse_outputs(p.stdout)
    for want in (f.run(x=x), f.run_on("interp", x=x)):  # native Func.run and the reference
        assert [g.shape for g in got] == [w.shape for w in want]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert "input 0 x [8, 16]" in p.stdout and "param 0 w1 [16, 32]" in p.stdout
    assert 'set_param("no_such_param") -> 2: unknown param "no_such_param"; valid params: ' \
           '"w1", "b1", "w2", "b2"' in p.stdout


def test_run_dyn_one_library_at_batch_1_7_64(build):
    """run_dyn.c: ONE libmlpd.so (a dynamic batch) at batch 1, 7 and 64, each checked
    against Func.run and the interpreter; bad sizes are error codes naming the dim."""
    p = _run([str(build / "run_dyn")])
    assert p.returncode == 0, p.stdout + p.stderr
    model = _example_models()
    f = model.mlp_dyn()
    blocks = p.stdout.split("batch B=")[1:]
    assert [int(b.split("\n", 1)[0]) for b in blocks] == [1, 7, 64]
    for B, block in zip((1, 7, 64), blocks):
        x = model.example_input((B, 16))
        got = _parse_outputs(block)
        for want in (f.run(x=x), f.run_on("interp", x=x)):
            assert [g.shape for g in got] == [w.shape for w in want] == [(B, 4), (B, 4)]
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert "set_dims(0) -> 7: set_dims: dimension 'B' (sizes[0]) is 0" in p.stdout
    assert "set_dims(-3) -> 7: set_dims: dimension 'B' (sizes[0]) is -3" in p.stdout
    assert "set_dims(4611686018427387904) -> 7: set_dims: sizes too large (B=" in p.stdout
    assert "current B=64 rows" in p.stdout
    check_header(str(build / "mlpd" / "mlpd.h"), "c")
    check_header(str(build / "mlpd" / "mlpd.h"), "c++")


def test_train_from_c_lowers_loss(build):
    p = _run([str(build / "train_tiny")])
    assert p.returncode == 0, p.stdout + p.stderr
    losses = [float(v) for v in re.findall(r"loss ([-\d.e+]+)", p.stdout)]
    assert len(losses) >= 5 and losses[-1] < 0.1 * losses[0]
    assert all(b <= a for a, b in zip(losses, losses[1:])), losses
    assert "loss went down" in p.stdout


def test_two_threads_two_contexts(build):
    p = _run([str(build / "threads")], env=dict(os.environ))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "threads: OK" in p.stdout


def _needed(lib) -> set[str]:
    """The short names (gomp, c, m) of the libraries `lib` records as DT_NEEDED."""
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[lib(\w+)\.so", out))


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf not found")
def test_readme_names_the_libraries_the_model_needs(build):
    """examples/embed_c/README.md's line on libmlp.so names exactly its dependencies
    (issue 13 item 11: it said libm, which the library does not record)."""
    text = open(os.path.join(EXAMPLE, "README.md")).read()
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("libmlp.so"))
    named = set(re.findall(r"\blib(\w+)\b", line.split(None, 1)[1]))
    assert named == _needed(build / "mlp" / "libmlp.so"), (line, _needed(build / "mlp" /
                                                                         "libmlp.so"))
    assert "m" in _needed(build / "tiny" / "libtiny.so")  # AdamW's pow: "only when it calls it"


def test_header_is_strict_c99_and_cpp17(build):
    for name in ("mlp", "tiny"):
        h = str(build / name / f"{name}.h")
        check_header(h, "c")
        check_header(h, "c++")


ERRORS_C = textwrap.dedent(r"""
    #include <stdio.h>
    #include <string.h>
    #include "mlpu.h"

    #define CHECK(cond) do { if (!(cond)) { printf("FAIL line %d: %s\n", __LINE__, #cond); \
                                            return 1; } } while (0)

    int main(void)
    {
        static float x[MLPU_INPUT0_NUMEL], o0[MLPU_OUTPUT0_NUMEL], o1[MLPU_OUTPUT1_NUMEL];
        static float w1[MLPU_PARAM0_NUMEL], back[MLPU_PARAM0_NUMEL];
        const float *in[1] = {x};
        float *out[2] = {o0, o1};
        const float *bad_in[1] = {NULL};
        mlpu_ctx *ctx = mlpu_create();
        int i;
        CHECK(ctx != NULL);
        CHECK(mlpu_check_abi() == RLX_OK);
        CHECK(mlpu_num_params() == 4 && mlpu_param_rank(0) == 2 && mlpu_param_shape(0)[1] == 32);
        CHECK(mlpu_param_name(9) == NULL && mlpu_input_rank(-1) == -1);
        CHECK(mlpu_run(ctx, in, out) == RLX_ERR_PARAM_UNSET);
        CHECK(strstr(mlpu_last_error(ctx), "param \"w1\" is not set") != NULL);
        CHECK(mlpu_param_is_set(ctx, 0) == 0);
        CHECK(mlpu_set_param(ctx, "w1", w1, 3) == RLX_ERR_COUNT);
        CHECK(strstr(mlpu_last_error(ctx), "has 512 elements, got 3") != NULL);
        CHECK(mlpu_set_param(ctx, "w9", w1, 3) == RLX_ERR_UNKNOWN_NAME);
        CHECK(mlpu_set_param(ctx, "w1", NULL, MLPU_PARAM0_NUMEL) == RLX_ERR_NULL);
        CHECK(mlpu_get_param(ctx, "w1", back, MLPU_PARAM0_NUMEL) == RLX_ERR_PARAM_UNSET);
        for (i = 0; i < (int)MLPU_PARAM0_NUMEL; ++i)
            w1[i] = (float)i;
        for (i = 0; i < mlpu_num_params(); ++i) {
            static float zeros[1024];
            CHECK(mlpu_set_param(ctx, mlpu_param_name(i), i ? zeros : w1,
                                 mlpu_param_numel(i)) == RLX_OK);
        }
        CHECK(mlpu_param_is_set(ctx, 0) == 1);
        CHECK(mlpu_run(ctx, bad_in, out) == RLX_ERR_NULL);
        CHECK(strstr(mlpu_last_error(ctx), "input 0 (\"x\") is NULL") != NULL);
        CHECK(mlpu_run(NULL, in, out) == RLX_ERR_NULL);
        CHECK(mlpu_run(ctx, in, out) == RLX_OK);
        CHECK(mlpu_last_error(ctx)[0] == '\0');
        CHECK(mlpu_get_param(ctx, "w1", back, MLPU_PARAM0_NUMEL) == RLX_OK);
        CHECK(memcmp(back, w1, sizeof w1) == 0);
        mlpu_destroy(ctx);
        mlpu_destroy(NULL);
        printf("errors: OK\n");
        return 0;
    }
""")


@pytest.fixture(scope="module")
def errors_prog(tmp_path_factory):
    """The example mlp compiled without baked params, and ERRORS_C linked against it."""
    out = tmp_path_factory.mktemp("mlpu")
    f = _example_models().mlp()
    aot.build_artifact(aot.spec_from_func(f, "mlpu", {}, cpu=CPU), str(out))
    (out / "errors.c").write_text(ERRORS_C)
    subprocess.run(["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-I", str(out),
                    str(out / "errors.c"), "-L", str(out), "-lmlpu", f"-Wl,-rpath,{out}",
                    "-o", str(out / "errors")], check=True)
    return out


def test_c_error_codes(errors_prog):
    p = _run([str(errors_prog / "errors")])
    assert p.returncode == 0 and "errors: OK" in p.stdout, p.stdout + p.stderr


def test_c_side_abi_check_detects_a_stale_header(errors_prog, tmp_path):
    h = (errors_prog / "mlpu.h").read_text()
    stale = re.sub(r'#define MLPU_IR_HASH "[0-9a-f]+"', '#define MLPU_IR_HASH "0123"', h)
    assert stale != h
    (tmp_path / "mlpu.h").write_text(stale)
    (tmp_path / "abi.c").write_text(
        '#include "mlpu.h"\nint main(void) { return mlpu_check_abi() == RLX_OK ? 0 : 3; }\n')
    subprocess.run(["cc", "-std=c99", "-I", str(tmp_path), str(tmp_path / "abi.c"), "-L",
                    str(errors_prog), "-lmlpu", f"-Wl,-rpath,{errors_prog}", "-o",
                    str(tmp_path / "abi")], check=True)
    assert _run([str(tmp_path / "abi")]).returncode == 3


@pytest.mark.slow
@pytest.mark.skipif(VALGRIND is None, reason="valgrind not installed")
@pytest.mark.parametrize("prog", ["run_mlp", "train_tiny", "threads", "errors", "run_dyn"])
def test_valgrind_clean(build, errors_prog, prog):
    path = errors_prog / "errors" if prog == "errors" else build / prog
    p = _run([VALGRIND, "--leak-check=full", "--error-exitcode=1", "--quiet", str(path)],
             timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
