"""Compiled artifacts from Python: `import NAME`, `rlxc.runtime.load`, robustness.

Artifacts are built once per module in-process (lowering/artifact/writer.py; the CLI is
tested in test_aot_cli.py).  The import test runs in a fresh interpreter and
checks that neither xdsl nor llvmlite got imported.  Damaged artifacts
(truncated or foreign .so, bad or mismatched JSON, wrong ABI) must raise
ArtifactError before anything is handed to the dynamic loader.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rlxc
from rlxc import ArtifactError, NameLookupError, ShapeError

pytest.importorskip("rlxc.lowering.cpu.driver", reason="lowering/cpu/driver.py not available")

from rlxc import export as aot  # noqa: E402
from rlxc.runtime import load  # noqa: E402


def _clf(s):
    x = s.input("x", (6, 5))
    y = s.input("y", (6,), "i32")
    logits = x.linear(s.param("w", (5, 3)), s.param("b", (3,)))
    return logits.cross_entropy(y), logits


def _data():
    rng = np.random.default_rng(1)
    return {"x": rng.normal(size=(6, 5)).astype(np.float32),
            "y": np.array([0, 1, 2, 1, 0, 2], np.int32)}


@pytest.fixture(scope="module")
def arts(tmp_path_factory):
    """Three artifacts: clf (params baked), clfu (nothing baked), clft (--train, AdamW)."""
    root = tmp_path_factory.mktemp("aot_import")
    f = rlxc.Func("clf", _clf).init_randn(seed=5, stddev=0.4)
    aot.build_artifact(aot.spec_from_func(f, "clf"), str(root / "clf"))
    aot.build_artifact(aot.spec_from_func(f, "clfu", {}), str(root / "clfu"))
    spec = aot.spec_from_func(f, "clft")
    spec.train = aot.train_spec(f, rlxc.optim.AdamW(0.01))
    aot.build_artifact(spec, str(root / "clft"))
    return root, f


def _close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == np.shape(w) and g.dtype == np.asarray(w).dtype
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6)


def test_import_in_fresh_subprocess(arts):
    root, f = arts
    d = _data()
    script = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        sys.path.insert(0, {str(root / 'clf')!r})
        import clf
        x = np.array({d['x'].tolist()!r}, np.float32)
        y = np.array({d['y'].tolist()!r}, np.int32)
        outs = clf.run(x=x, y=y)
        heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('xdsl', 'llvmlite'))
        print(json.dumps({{"outs": [o.tolist() for o in outs], "heavy": heavy,
                          "names": clf.input_names(), "params": clf.param_names()}}))
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["heavy"] == [], f"importing a compiled model imported {res['heavy'][:5]}"
    assert res["names"] == ["x", "y"] and res["params"] == ["w", "b"]
    want = f.run_on("interp", **d)
    _close([np.asarray(o, np.float32) for o in res["outs"]], want)


def test_load_run_and_metadata(arts):
    root, f = arts
    m = load(root / "clf")
    assert m.name == "clf" and m.input_names() == ["x", "y"] and m.param_names() == ["w", "b"]
    assert [t.dtype for t in m.inputs] == ["f32", "i32"]
    assert m.output_shapes() == [(), (6, 3)] and m.metadata["abi_version"] == 2
    d = _data()
    _close(m.run(**d), f.run_on("interp", **d))
    _close(m.run(d), f.run_on("interp", **d))  # dict form
    _close(m.run(x=d["x"].ravel(), y=d["y"]), f.run_on("interp", **d))  # flat input
    assert "clf" in repr(m)


def test_run_argument_errors(arts):
    root, _ = arts
    m = load(root / "clf")
    d = _data()
    with pytest.raises(NameLookupError, match=r"missing input 'y'.*expected inputs: \['x', 'y'\]"):
        m.run(x=d["x"])
    with pytest.raises(NameLookupError, match=r"unknown input 'z'; valid inputs: \['x', 'y'\]"):
        m.run(z=1, **d)
    with pytest.raises(NameLookupError, match="set_param"):
        m.run(w=np.zeros((5, 3)), **d)
    with pytest.raises(ShapeError, match=r"input 'x' expects shape \(6, 5\), got \(5, 6\)"):
        m.run(x=d["x"].T, y=d["y"])
    with pytest.raises(TypeError, match="expects integers"):
        m.run(x=d["x"], y=d["y"].astype(np.float32))


def test_unset_params_and_set_param(arts):
    root, f = arts
    m = load(root / "clfu")
    d = _data()
    assert m.unset_params() == ["w", "b"]
    with pytest.raises(NameLookupError, match=r'param "w" is not set: call clfu_set_param'):
        m.run(**d)
    with pytest.raises(NameLookupError, match=r"unknown param 'q'; valid params: \['w', 'b'\]"):
        m.set_param("q", np.zeros(3))
    with pytest.raises(ShapeError, match=r"param 'w' expects shape \(5, 3\), got \(4,\)"):
        m.set_param("w", np.zeros(4))
    m.set_param("w", f.params()["w"])
    assert m.unset_params() == ["b"]
    with pytest.raises(NameLookupError, match='param "b" is not set'):
        m.get_param("b")
    with pytest.raises(NameLookupError, match=r"unknown param 'typo'"):
        m.set_params({"b": f.params()["b"].ravel(), "typo": np.zeros(1)})
    assert m.unset_params() == ["b"]   # checked before anything is set: b stays unset
    with pytest.raises(ShapeError, match=r"param 'w' expects shape"):
        m.set_params({"b": f.params()["b"].ravel(), "w": np.zeros(4)})
    assert m.unset_params() == ["b"]
    m.set_params({"b": f.params()["b"].ravel()})
    _close(m.run(**d), f.run_on("interp", **d))
    np.testing.assert_array_equal(m.get_param("w"), f.params()["w"])


def test_contexts_are_independent(arts):
    root, f = arts
    a, b = load(root / "clf", new=True), load(root / "clf", new=True)
    d = _data()
    before = a.run(**d)
    b.set_param("b", np.array([5.0, -5.0, 0.0], np.float32))
    _close(a.run(**d), before)
    _close(b.run(**d), f.with_param("b", [5.0, -5.0, 0.0]).run_on("interp", **d))
    np.testing.assert_array_equal(a.get_param("b"), f.params()["b"])  # baked data untouched


def test_load_returns_the_module_import_gives(arts, tmp_path, monkeypatch):
    """Issue 13 item 11: one module per artifact, whether loaded or imported."""
    root, f = arts
    d = _copy(root, tmp_path, "clfu")
    m = load(d)
    assert load(d) is m and load(d / "clfu.json") is m and load(d, new=True) is not m
    m.set_param("w", f.params()["w"])
    monkeypatch.syspath_prepend(str(d))
    monkeypatch.delitem(sys.modules, "clfu", raising=False)
    import clfu

    try:
        assert clfu.module is m and clfu.run == m.run
        assert clfu.module.unset_params() == ["b"]  # the param set through load() shows
    finally:
        sys.modules.pop("clfu", None)


NUMPY_ONLY = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    import clf
    x = np.asarray(json.loads(sys.argv[2]), np.float32)
    y = np.asarray(json.loads(sys.argv[3]), np.int32)
    outs = clf.run(x=x, y=y)
    print(json.dumps({"outs": [o.tolist() for o in outs],
                      "runtime": type(clf.module).__module__,
                      "rlxc": sorted(m for m in sys.modules if m.split(".")[0] == "rlxc")}))
""")


@pytest.mark.slow
def test_import_with_numpy_only(arts, tmp_path):
    """Issue 13 item 9: a fresh venv holding NumPy and nothing else imports and runs the
    package (it carries its runtime in NAME/_runtime)."""
    root, f = arts
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    p = subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "-q",
                        "--disable-pip-version-check", f"numpy=={np.__version__}"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        pytest.skip(f"cannot install numpy into a fresh venv: {p.stderr.strip()[-300:]}")
    probe = subprocess.run([py, "-c", "import rlxc"], capture_output=True, text=True)
    assert probe.returncode != 0, "the fresh venv must not see rlxc"
    d = _copy(root, tmp_path)
    data = _data()
    p = subprocess.run([py, "-c", NUMPY_ONLY, str(d), json.dumps(data["x"].tolist()),
                        json.dumps(data["y"].tolist())], capture_output=True, text=True,
                       timeout=120, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["rlxc"] == [] and res["runtime"] == "clf._runtime.loader", res
    _close([np.asarray(o, np.float32) for o in res["outs"]], f.run_on("interp", **data))


@pytest.mark.parametrize("fname, art", [("tensor", "tensor"), ("layer.0", "layer_0"),
                                        ("my-model", "my_model")])
def test_any_func_name_builds(tmp_path, fname, art):
    """Issue 13 item 11: Func names are any string; the artifact takes a C-safe symbol
    (and "tensor" once collided with a type of the glue)."""
    f = rlxc.Func(fname, lambda s: (s.input("x", (3,)) * s.param("w", (3,))).sum()
                  ).init_randn(seed=1, stddev=1.0)
    assert f.symbol == art
    aot.build_artifact(aot.spec_from_func(f), str(tmp_path))
    m = load(tmp_path)
    x = np.array([1.0, 2.0, 3.0], np.float32)
    assert m.name == art
    _close(m.run(x=x), f.run_on("interp", x=x))
    _close(f.run(x=x), f.run_on("interp", x=x))


@pytest.mark.parametrize("name, msg", [("for", "Python keyword"), ("json", "shadow"),
                                       ("numpy", "shadow"), ("a-b", "not a C identifier")])
def test_bad_artifact_names_are_rejected(name, msg):
    """Issue 13 item 20: a package named like a keyword or a module cannot be imported."""
    f = rlxc.Func("f", lambda s: s.input("x", (3,)) * 2.0)
    with pytest.raises(ValueError, match=msg):
        aot.spec_from_func(f, name)
    with pytest.raises(ValueError, match=msg if name != "a-b" else "keyword"):
        aot.spec_from_func(rlxc.Func(name if name != "a-b" else "if", lambda s: s.input(
            "x", (3,)) * 2.0))


def test_train_step_matches_python_step(arts):
    from rlxc.train import train_step

    root, f = arts
    m = load(root / "clft")
    assert m.metadata["train"]["optimizer"] == "adamw"
    d = _data()
    opt = rlxc.optim.AdamW(0.01)
    g = f
    losses = []
    for step in range(6):
        opt.lr = 0.01 if step < 3 else 0.02  # the lr argument overrides the compiled one
        loss_c = m.train_step(lr=opt.lr, **d)
        g, loss_py = train_step(g, opt, d, device="interp")
        losses.append(loss_c)
        np.testing.assert_allclose(loss_c, loss_py, rtol=1e-5, atol=1e-6)
    for n in ("w", "b"):
        np.testing.assert_allclose(m.get_param(n), g.params()[n], rtol=1e-5, atol=1e-6)
    assert losses[-1] < losses[0]
    with pytest.raises(rlxc.RlxError, match="lr must be finite"):
        m.train_step(lr=float("nan"), **d)
    with pytest.raises(rlxc.RlxError, match="without --train"):
        load(root / "clf").train_step(**d)


# -- damaged artifacts ------------------------------------------------------------------------
@pytest.mark.parametrize("opt", [
    rlxc.optim.SGD(0.1), rlxc.optim.SGD(0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    rlxc.optim.Adam(0.05, weight_decay=0.1), rlxc.optim.Lion(0.01, weight_decay=0.1)],
    ids=["sgd", "sgd-nesterov-wd", "adam-l2", "lion-wd"])
def test_train_step_every_optimizer(opt, tmp_path):
    """The C scalar recipe (Optimizer.scalar_recipe) of each optimizer kind."""
    from rlxc.train import train_step

    def lin(s):
        err = s.input("x", (8, 3)) @ s.param("w", (3, 1)) - s.input("y", (8, 1))
        return (err * err).mean()

    f = rlxc.Func("lin", lin).init_params(lambda n, d: np.full(d, 0.1))
    spec = aot.spec_from_func(f, "lin")
    spec.train = aot.train_spec(f, opt)
    aot.build_artifact(spec, str(tmp_path))
    m = load(tmp_path)
    rng = np.random.default_rng(2)
    d = {"x": rng.normal(size=(8, 3)).astype(np.float32),
         "y": rng.normal(size=(8, 1)).astype(np.float32)}
    g = f
    for _ in range(4):
        loss_c = m.train_step(lr=opt.lr, **d)
        g, loss_py = train_step(g, opt, d, device="interp")
        np.testing.assert_allclose(loss_c, loss_py, rtol=1e-5)
    np.testing.assert_allclose(m.get_param("w"), g.params()["w"], rtol=1e-5, atol=1e-7)


def test_kernel_error_is_index_error(tmp_path):
    def emb(s):
        return s.param("emb", (5, 3)).gather(s.input("idx", (4,), "i32"), axis=0).sum()

    f = rlxc.Func("emb", emb).init_randn(1, 1.0)
    aot.build_artifact(aot.spec_from_func(f, "emb"), str(tmp_path))
    m = load(tmp_path)
    ok = np.array([0, 1, 2, 4], np.int32)
    _close(m.run(idx=ok), f.run_on("interp", idx=ok))
    with pytest.raises(IndexError, match=r"rlx.gather: index out of range \[0, 5\)"):
        m.run(idx=np.array([0, 1, 2, 7], np.int32))
    _close(m.run(idx=ok), f.run_on("interp", idx=ok))  # the context is still usable


def _copy(root, tmp_path, name="clf"):
    dst = tmp_path / name
    shutil.copytree(root / name, dst)
    return dst


def _edit_json(d, name, fn):
    p = d / f"{name}.json"
    meta = json.loads(p.read_text())
    fn(meta)
    p.write_text(json.dumps(meta))


def _cc_so(tmp_path, src: str, out):
    c = tmp_path / "foreign.c"
    c.write_text(src)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(c)], check=True)


def _rehash(d, name="clf", size=True):
    """Make the JSON describe the library file as it now is (hash, and size unless told)."""
    from rlxc.runtime.loader import sha256_file

    lib = d / f"lib{name}.so"
    _edit_json(d, name, lambda m: m.update(library_sha256=sha256_file(lib),
                                           **({"library_size": lib.stat().st_size}
                                              if size else {})))


def _truncate_so(d, tmp_path):
    p = d / "libclf.so"
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _foreign_so(d, tmp_path):
    _cc_so(tmp_path, "int something_else(void) { return 1; }\n", d / "libclf.so")
    _rehash(d)


def _abi3_so(d, tmp_path):
    _cc_so(tmp_path, "unsigned clf_abi_version(void) { return 3; }\n", d / "libclf.so")
    _rehash(d)


def _half_so(d, tmp_path):  # right ABI symbol, the rest missing
    _cc_so(tmp_path, "unsigned clf_abi_version(void) { return 2; }\n", d / "libclf.so")
    _rehash(d)


def _truncate_rehash(d, tmp_path, size=False):
    _truncate_so(d, tmp_path)
    _rehash(d, size=size)


def _truncate_json(d, tmp_path):
    p = d / "clf.json"
    p.write_text(p.read_text()[:100])


CORRUPTIONS = {
    "truncated .so": (_truncate_so, "the JSON records"),
    "truncated .so, hash edited": (_truncate_rehash, "the JSON records"),
    "truncated .so, hash and size edited": (lambda d, t: _truncate_rehash(d, t, True),
                                            "past the end of the file"),
    "modified .so": (lambda d, t: (d / "libclf.so").write_bytes(
        (d / "libclf.so").read_bytes()[:-1] + b"\1"), "does not match the JSON"),
    "foreign .so": (_foreign_so, "symbol clf_abi_version missing"),
    "library ABI 3": (_abi3_so, "library ABI version 3, this runtime supports 2"),
    "incomplete .so": (_half_so, "symbol clf_ir_hash missing"),
    "missing .so": (lambda d, t: os.unlink(d / "libclf.so"), "is missing"),
    "truncated json": (_truncate_json, "not valid JSON"),
    "json ABI 1": (lambda d, t: _edit_json(d, "clf", lambda m: m.update(abi_version=1)),
                   "artifact ABI version 1, this runtime supports 2"),
    "foreign json": (lambda d, t: _edit_json(d, "clf", lambda m: m.update(format="onnx")),
                     "not an rlxc artifact"),
    "json missing field": (lambda d, t: _edit_json(d, "clf", lambda m: m.pop("inputs")),
                           "missing field 'inputs'"),
    "json bad shape": (lambda d, t: _edit_json(
        d, "clf", lambda m: m["inputs"][0].update(shape=[6, -5])), "non-negative ints"),
    "json vs library": (lambda d, t: _edit_json(
        d, "clf", lambda m: m["inputs"][0].update(shape=[5, 6])), "in the library but"),
    "json ir_hash": (lambda d, t: _edit_json(d, "clf", lambda m: m.update(ir_hash="0" * 64)),
                     "library built from IR"),
    "json bad dtype": (lambda d, t: _edit_json(
        d, "clf", lambda m: m["params"][0].update(dtype="f16")), "dtype 'f16'"),
    "json path library": (lambda d, t: _edit_json(
        d, "clf", lambda m: m.update(library="../libc.so")), "plain file name"),
}


@pytest.mark.parametrize("what", list(CORRUPTIONS))
def test_damaged_artifact_raises(arts, tmp_path, what):
    root, _ = arts
    d = _copy(root, tmp_path)
    damage, msg = CORRUPTIONS[what]
    damage(d, tmp_path)
    with pytest.raises(ArtifactError) as e:
        load(d)
    assert msg in str(e.value), str(e.value)


@pytest.mark.parametrize("edit_size", [False, True])
def test_truncated_library_with_edited_hash_refuses_in_a_subprocess(arts, tmp_path, edit_size):
    """Issue 13 item 10: dlopen of a truncated .so dies of SIGBUS; the size recorded in the
    JSON (and, if that was edited too, the ELF segment table) must stop it first."""
    root, _ = arts
    d = _copy(root, tmp_path)
    _truncate_rehash(d, tmp_path, edit_size)
    script = f"from rlxc.runtime import load; load({str(d)!r})"
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1, (p.returncode, p.stderr[-500:])
    assert "ArtifactError" in p.stderr and "truncated" in p.stderr, p.stderr[-500:]


def test_damaged_package_import_fails_cleanly(arts, tmp_path):
    root, _ = arts
    d = _copy(root, tmp_path)
    _truncate_so(d, tmp_path)
    script = f"import sys; sys.path.insert(0, {str(d)!r}); import clf"
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1 and "ArtifactError" in p.stderr and "truncated" in p.stderr


def test_rebuild_in_place_loads_the_new_library(arts, tmp_path):
    """dlopen returns an already loaded library for the same path; the loader must not."""
    root, f = arts
    d = _copy(root, tmp_path)
    d_ = _data()
    old = load(d)
    g = rlxc.Func("clf", lambda s: [t * 2.0 for t in _clf(s)]).init_randn(seed=5, stddev=0.4)
    aot.build_artifact(aot.spec_from_func(g, "clf"), str(d))
    new = load(d)
    _close(new.run(**d_), g.run_on("interp", **d_))
    _close(old.run(**d_), f.run_on("interp", **d_))


def test_missing_directory_and_ambiguous(tmp_path, arts):
    with pytest.raises(ArtifactError, match="does not exist"):
        load(tmp_path / "nothing")
    with pytest.raises(ArtifactError, match="expected one NAME.json"):
        load(tmp_path)
    root, _ = arts
    with pytest.raises(ArtifactError, match="no artifact named 'zzz'"):
        load(root / "clf", name="zzz")
