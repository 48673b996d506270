"""`rlxc compile` end to end: every --emit stage, both SRC forms, the artifact, usage errors.

The CLI runs in a subprocess (the installed `rlxc` entry point through
`python -m rlxc.cli.main`), as a user would run it.  The transform-expression
parser and the error paths that never reach the backend are also checked
in-process with click's CliRunner, which is much faster.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner

from rlxc.cli.compile import TransformError, apply_transform, parse_transform

MODEL_SRC = textwrap.dedent('''
    import numpy as np
    import rlxc

    def mlp():
        def build(s):
            x = s.input("x", (4, 3))
            w = s.param("w", (3, 5))
            b = s.param("b", (5,))
            return (x @ w + b).tanh().sum(), (x * 2.0).sum(0)
        return rlxc.Func("mlp", build).init_randn(seed=3, stddev=0.5)

    def unbound():
        return rlxc.Func("unbound", lambda s: (s.input("x", (2, 2)) @ s.param("w", (2, 2))).sum())

    def not_a_func():
        return 42

    def boom():
        raise RuntimeError("model bug")

    def keyword_name():
        return rlxc.Func("for", lambda s: s.input("x", (2,)) * 2.0)

    def exits():
        import sys
        sys.exit(3)

    def dashed():
        return rlxc.Func("my-model.v2", lambda s: (s.input("x", (3,)) * s.param("w", (3,))).sum()
                         ).init_randn(seed=1, stddev=1.0)
''')


def _rlxc(*args, cwd=None, check=True, env=None):
    cmd = [sys.executable, "-m", "rlxc.cli.main", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_models")
    (d / "models.py").write_text(MODEL_SRC)
    sys.path.insert(0, str(d))
    try:
        import models as m  # noqa: F401
    finally:
        sys.path.remove(str(d))
    f = m.mlp()
    (d / "mlp.mlir").write_text(f.mlir())
    return d, f


def _has_backend(name):
    try:
        __import__(f"rlxc.lowering.{name}")
        return True
    except ImportError:
        return False


needs_cpu = pytest.mark.skipif(not _has_backend("cpu.driver"), reason="lowering/cpu/driver.py not available")


# -- the transform-expression parser (in-process) ------------------------------------------
@pytest.mark.parametrize("text, want", [
    ("grad(wrt=[w])", ("grad", {"wrt": ["w"]})),
    ("grad(w)", ("grad", {"wrt": ["w"]})),
    ("value_and_grad(wrt=[w, b])", ("value_and_grad", {"wrt": ["w", "b"]})),
    ("grad_all", ("grad_all", {})),
    ("value_and_grad_all()", ("value_and_grad_all", {})),
    ("vmap(x, 8)", ("vmap", {"batched": ["x"], "batch_size": 8})),
    ("vmap([x, y], batch_size=4)", ("vmap", {"batched": ["x", "y"], "batch_size": 4})),
    ("vmap(batched='layer.x', size=2)", ("vmap", {"batched": ["layer.x"], "batch_size": 2})),
    ("jvp(tangent_for=[x])", ("jvp", {"tangent_for": ["x"]})),
    (" hvp( wrt = [ x ] ) ", ("hvp", {"wrt": ["x"]})),
])
def test_parse_transform(text, want):
    assert parse_transform(text) == want


@pytest.mark.parametrize("text, msg", [
    ("gard(wrt=[w])", "valid transforms: grad, value_and_grad"),
    ("grad(wtr=[w])", "unknown keyword 'wtr'; valid keywords: wrt"),
    ("grad", "missing 'wrt'"),
    ("vmap(x, 0)", "positive integer"),
    ("vmap(x, 8, 9)", "takes 2 argument"),
    ("grad(wrt=[w]", "expected ')'"),
    ("grad(wrt=__import__('os'))", "expected ')'"),
    ("grad(wrt=[w]); rm", "unexpected"),
    ("grad(wrt=[w], wrt=[b])", "given twice"),
    ("grad(wrt=[])", "non-empty list"),
])
def test_parse_transform_errors(text, msg):
    with pytest.raises(TransformError) as e:
        parse_transform(text)
    assert msg in str(e.value)


def test_apply_transform_names(models):
    _, f = models
    g = apply_transform(f, "value_and_grad(wrt=[w])")
    assert g.output_count() == 2 and g.output_shapes()[1] == (3, 5)
    assert apply_transform(f, "vmap(x, 8)").input_shape_of("x") == (8, 4, 3)
    with pytest.raises(TransformError, match="unknown name 'q' for wrt; valid: x, w, b"):
        apply_transform(f, "grad(wrt=[q])")
    with pytest.raises(TransformError, match="valid: x"):
        apply_transform(f, "vmap(w, 2)")


# -- usage errors: exit 2, a message listing the choices, no traceback -----------------------
def _invoke(args):
    from rlxc.cli.main import main

    return CliRunner().invoke(main, ["compile", *args])


@pytest.mark.parametrize("args, listing", [
    (["{d}/nope.py:mlp", "--emit", "rlx"], "models.py"),
    (["{d}/models.py:nope", "--emit", "rlx"],
     "functions in it: boom, dashed, exits, keyword_name, mlp, not_a_func, unbound"),
    (["{d}/models.py", "--emit", "rlx"], "functions in it: boom, dashed, exits"),
    (["{d}/models.py:mlp", "--emit", "rlx", "--transform", "gard(w)"],
     "valid transforms: grad, value_and_grad, grad_all"),
    (["{d}/models.py:mlp", "--emit", "rlx", "--transform", "grad(wrt=[q])"], "valid: x, w, b"),
    (["{d}/models.py:mlp", "--emit", "rlx", "--tragsform", "grad(w)"],
     "valid options: --cpu, --emit"),
    (["{d}/models.py:mlp", "--emit", "mlir"], "'rlx', 'loops', 'llvm', 'asm', 'ptx'"),
    (["{d}/models.py:mlp", "--target", "tpu", "--emit", "rlx"], "'tpu' is not one of 'cpu', 'cuda'"),
    (["{d}/models.py:mlp", "--cpu", "pentium9", "--emit", "rlx"], "x86-64-v3"),
    (["{d}/models.py:mlp", "--optimizer", "adagrad", "--train", "--emit", "rlx"],
     "valid: sgd, adam, adamw, lion, nadamw, radam, lamb, adafactor, muon"),
    (["{d}/models.py:mlp", "--params", "{d}/none.safetensors", "--emit", "rlx"],
     ".safetensors files in"),
    (["{d}/models.py:mlp"], "missing -o OUTDIR"),
    (["{d}/models.py:mlp", "--emit", "ptx"], "--target cuda"),
    (["{d}/models.py:mlp", "--name", "class", "--emit", "rlx"], "is a Python keyword"),
    (["{d}/models.py:mlp", "--name", "my-model", "--emit", "rlx"], "not a C identifier"),
    (["{d}/models.py:mlp", "--name", "json", "--emit", "rlx"], "would shadow it"),
    (["{d}/models.py:mlp", "--name", "numpy", "--emit", "rlx"], "would shadow it"),
    (["{d}/models.py:mlp", "--target", "cuda", "--train", "-o", "{d}/x"], "use --target cpu"),
])
def test_usage_errors(models, args, listing):
    d, _ = models
    r = _invoke([a.format(d=d) for a in args])
    assert r.exit_code == 2, r.output
    assert listing in r.output, r.output
    assert "Usage:" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("factory, msg", [
    ("not_a_func", "returned int, not an rlxc.Func"), ("boom", "RuntimeError: model bug"),
    ("keyword_name", "the Func 'for': artifact name 'for' is a Python keyword"),
    ("exits", "exits() called sys.exit(3) instead of returning an rlxc.Func")])
def test_model_errors_exit_1(models, factory, msg):
    d, _ = models
    r = _invoke([f"{d}/models.py:{factory}", "--emit", "rlx"])
    assert r.exit_code == 1 and msg in r.output and "Traceback" not in r.output


def test_sys_exit_in_factory_is_reported_in_subprocess(models):
    d, _ = models
    p = _rlxc("compile", f"{d}/models.py:exits", "--emit", "rlx", check=False)
    assert p.returncode == 1 and "called sys.exit(3)" in p.stderr, (p.returncode, p.stderr)


@needs_cpu
def test_any_func_name_gets_a_c_safe_artifact_name(models, tmp_path):
    d, _ = models
    out = tmp_path / "dash"
    _rlxc("compile", f"{d}/models.py:dashed", "-o", str(out))
    assert sorted(os.listdir(out)) == ["libmy_model_v2.so", "my_model_v2", "my_model_v2.h",
                                       "my_model_v2.json"]
    import rlxc.runtime

    m = rlxc.runtime.load(out)
    assert m.name == "my_model_v2"
    assert m.run(x=np.ones(3, np.float32))[0].shape == ()


def test_usage_error_in_subprocess(models):
    d, _ = models
    p = _rlxc("compile", f"{d}/models.py:mlp", "--emit", "rlx", "--transform", "vmap(q, 2)",
              check=False)
    assert p.returncode == 2 and "valid: x" in p.stderr and "Traceback" not in p.stderr


def test_params_file_errors(models, tmp_path):
    from rlxc.checkpoint import save_tensors

    d, _ = models
    bad = tmp_path / "bad.safetensors"
    save_tensors(bad, {"w": np.zeros((3, 5), np.float32), "zz": np.zeros(2, np.float32)})
    r = _invoke([f"{d}/models.py:mlp", "--params", str(bad), "--emit", "rlx"])
    assert r.exit_code == 2 and "'zz' is not a param of mlp; valid params: w, b" in r.output
    save_tensors(bad, {"w": np.zeros((5, 3), np.float32)})
    r = _invoke([f"{d}/models.py:mlp", "--params", str(bad), "--emit", "rlx"])
    assert r.exit_code == 1 and "has shape (5, 3), mlp declares (3, 5)" in r.output


# -- --emit, every stage, both SRC forms (subprocess) ----------------------------------------
def _src(d, form):
    return f"{d}/models.py:mlp" if form == "py" else f"{d}/mlp.mlir"


@pytest.mark.parametrize("form", ["py", "mlir"])
def test_emit_rlx(models, form):
    d, f = models
    out = _rlxc("compile", _src(d, form), "--emit", "rlx", "--transform", "grad(wrt=[w])").stdout
    assert "func.func @mlp" in out and "rlx.matmul" in out
    assert out.strip() == f.grad(["w"]).mlir().strip()


@needs_cpu
@pytest.mark.parametrize("form", ["py", "mlir"])
@pytest.mark.parametrize("stage, marker", [("loops", "for"), ("llvm", "define"),
                                           ("asm", "rlx_mlp")])
def test_emit_cpu_stages(models, form, stage, marker):
    d, _ = models
    p = _rlxc("compile", _src(d, form), "--emit", stage, "--cpu", "x86-64-v3")
    assert marker in p.stdout, p.stdout[:2000]


@pytest.mark.skipif(not _has_backend("gpu.driver"), reason="lowering/gpu/driver.py not available")
@pytest.mark.parametrize("form", ["py", "mlir"])
def test_emit_ptx(models, form):
    d, _ = models
    p = _rlxc("compile", _src(d, form), "--target", "cuda", "--emit", "ptx")
    assert ".entry" in p.stdout and ".target sm_" in p.stdout


# -- building (subprocess) ------------------------------------------------------------------
@needs_cpu
def test_build_py_with_transform(models, tmp_path):
    d, f = models
    out = tmp_path / "art"
    p = _rlxc("compile", _src(d, "py"), "-o", str(out), "--name", "vg",
              "--transform", "value_and_grad(wrt=[w])", "-v")
    files = sorted(os.listdir(out))
    assert files == ["libvg.so", "vg", "vg.h", "vg.json"], files
    assert (out / "vg" / "__init__.py").is_file()
    assert "timings for vg" in p.stderr and "link" in p.stderr  # -v: per-stage timings
    meta = json.loads((out / "vg.json").read_text())
    assert meta["abi_version"] == 2 and meta["target"] == "cpu" and meta["name"] == "vg"
    assert meta["transforms"] == ["value_and_grad(wrt=[w])"]
    assert meta["library_sha256"] == hashlib.sha256((out / "libvg.so").read_bytes()).hexdigest()
    assert [t["name"] for t in meta["inputs"]] == ["x"]
    assert [(t["name"], t["shape"], t["baked"]) for t in meta["params"]] == [
        ("w", [3, 5], True), ("b", [5], True)]
    assert [t["shape"] for t in meta["outputs"]] == [[], [3, 5]]
    import rlxc.runtime

    m = rlxc.runtime.load(out)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    got = m.run(x=x)
    want = f.value_and_grad(["w"]).run_on("interp", x=x)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@needs_cpu
def test_build_mlir_with_params_file(models, tmp_path):
    from rlxc.checkpoint import save_tensors

    d, f = models
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(3, 5)).astype(np.float32),
              "b": rng.normal(size=5).astype(np.float32)}
    save_tensors(tmp_path / "p.safetensors", params)
    out = tmp_path / "art"
    _rlxc("compile", _src(d, "mlir"), "-o", str(out), "--params", str(tmp_path / "p.safetensors"))
    import rlxc.runtime

    m = rlxc.runtime.load(out)
    assert m.name == "mlp" and m.unset_params() == []
    x = np.ones((4, 3), np.float32)
    want = f.with_params(params).run_on("interp", x=x)
    for g, w in zip(m.run(x=x), want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not _has_backend("gpu.driver"), reason="lowering/gpu/driver.py not available")
def test_build_cuda_artifact(models, tmp_path):
    from rlxc.runtime import cuda

    d, f = models
    out = tmp_path / "cu"
    _rlxc("compile", _src(d, "py"), "--target", "cuda", "-o", str(out))
    assert sorted(os.listdir(out)) == ["mlp", "mlp.json", "mlp.rlxcuda"]
    meta = json.loads((out / "mlp.json").read_text())
    assert meta["target"] == "cuda" and meta["header"] is None
    assert sorted(meta["cuda_params"]) == ["b", "w"]
    import rlxc.runtime

    if not cuda.available():
        with pytest.raises(cuda.CudaUnavailable):
            rlxc.runtime.load(out)
        return
    m = rlxc.runtime.load(out)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    for g, w in zip(m.run(x=x), f.run_on("interp", x=x)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_progress_lines(capsys):
    import io
    import time

    from rlxc.lowering.artifact.progress import Progress

    buf = io.StringIO()
    p = Progress("m", verbose=True, stream=buf, after=0.0).start()
    with p.stage("lowering"):
        time.sleep(0.6)
    p.finish()
    text = buf.getvalue()
    assert "rlxc: compiling m: lowering" in text and "done in" in text
    assert "timings for m" in text and "lowering" in text.splitlines()[-1]
