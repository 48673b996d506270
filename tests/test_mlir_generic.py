"""rlx text that leaves rlxc and comes back: MLIR's generic op form and the train module.

- `rlxc compile --emit rlx-generic` and `rlxc opt --print-generic` print the generic
  op form; upstream MLIR (iree-base-compiler's `iree.compiler.ir`, optional: skipped
  when absent) parses it with unregistered dialects allowed, verifies it, prints it
  again, and `rlxc opt` reads that back to a module that computes the same numbers.
- `--emit rlx --train` prints ONE module (model, then train step) that `rlxc opt` and
  `rlxc compile` read back.
- `rlxc compile` recognises MLIR text by content, whatever the file's suffix.
The CLI runs in-process through click's CliRunner (fast).
"""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from rlxc.cli.main import main
from rlxc.dialect import module as M
from rlxc.dialect.interpreter import interpret

MODEL = '''\
import rlxc


def factory():
    def mlp(s):
        x = s.input("x", (8, 4))
        y = s.input("y", (8,), "i32")
        h = x.linear(s.param("w1", (4, 16)), s.param("b1", (16,))).relu()
        return h.linear(s.param("w2", (16, 3)), s.param("b2", (3,))).cross_entropy(y)
    return rlxc.Func("mlp", mlp).init_randn(seed=1, stddev=0.1)
'''


@pytest.fixture
def model(tmp_path):
    p = tmp_path / "model.py"
    p.write_text(MODEL)
    return f"{p}:factory"


def cli(*args):
    """The command's result; IR is read from .stdout (.output also holds stderr, where a
    compile slower than a second prints its progress line)."""
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r


def _inputs():
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(8, 4)).astype(np.float32),
            "y": (np.arange(8) % 3).astype(np.int32),
            "w1": rng.normal(size=(4, 16)).astype(np.float32),
            "b1": rng.normal(size=(16,)).astype(np.float32),
            "w2": rng.normal(size=(16, 3)).astype(np.float32),
            "b2": rng.normal(size=(3,)).astype(np.float32)}


def _run(text: str, fn: int = 0):
    mod = M.split(M.parse_any(text))[fn]
    f = M.get_func(mod)
    args = [_inputs()[a.name] for a in M.signature(f)]
    return interpret(mod, args)


def test_emit_rlx_generic_is_generic_and_reads_back(model, tmp_path):
    r = cli("compile", model, "--emit", "rlx-generic")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith('"builtin.module"() ({')
    assert '"rlx.matmul"(' in r.stdout and "rlx.matmul %" not in r.stdout
    custom = cli("compile", model, "--emit", "rlx").stdout
    # same module: the generic text parses back to the custom one
    assert M.to_text(M.parse(r.stdout)) == M.to_text(M.parse(custom))
    p = tmp_path / "g.mlir"
    p.write_text(r.stdout)
    o = cli("opt", p, "--print-generic")
    assert o.exit_code == 0, o.output
    assert o.stdout.startswith('"builtin.module"() ({')


def test_emit_rlx_with_train_prints_one_module_that_reads_back(model, tmp_path):
    r = cli("compile", model, "--emit", "rlx", "--train", "--optimizer", "sgd")
    assert r.exit_code == 0, r.output
    assert r.stdout.count("builtin.module") == 1
    p = tmp_path / "trained.mlir"
    p.write_text(r.stdout)
    o = cli("opt", p, "-p", "cse")
    assert o.exit_code == 0, o.output
    assert "func.func @mlp(" in o.stdout and "func.func @mlp_train_step(" in o.stdout
    # rlxc compile reads it back: the model is the first function
    c = cli("compile", p, "--emit", "rlx")
    assert c.exit_code == 0, c.output
    assert "func.func @mlp(" in c.stdout and "train_step" not in c.stdout
    c2 = cli("compile", p, "--emit", "rlx", "--train", "--optimizer", "sgd")
    assert c2.exit_code == 0, c2.output
    assert M.to_text(M.parse_any(c2.stdout)) == M.to_text(M.parse_any(r.stdout))


def test_compile_reads_mlir_by_content(model, tmp_path):
    text = cli("compile", model, "--emit", "rlx").stdout
    p = tmp_path / "model.txt"          # not a .mlir suffix
    p.write_text("// a comment first\n" + text)
    c = cli("compile", p, "--emit", "rlx")
    assert c.exit_code == 0, c.output
    assert c.stdout == text
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\n")
    c = cli("compile", bad, "--emit", "rlx")
    assert c.exit_code == 2 and "neither" in c.output


def test_upstream_mlir_parses_and_verifies_generic_form(model, tmp_path):
    ir = pytest.importorskip("iree.compiler.ir", reason="upstream MLIR bindings: "
                             "pip install iree-base-compiler")
    r = cli("compile", model, "--emit", "rlx-generic", "--train", "--optimizer", "adamw")
    assert r.exit_code == 0, r.output
    with ir.Context() as ctx:
        ctx.allow_unregistered_dialects = True
        m = ir.Module.parse(r.stdout)
        assert m.operation.verify()
        back = m.operation.get_asm(print_generic_op_form=True)
    p = tmp_path / "upstream.mlir"
    p.write_text(back)
    o = cli("opt", p, "-p", "cse")
    assert o.exit_code == 0, o.output
    ref = _run(cli("compile", model, "--emit", "rlx").stdout)
    got = _run(o.stdout)
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(ref[0]), rtol=1e-6)
    # and upstream rejects a broken module (the check can fail)
    with ir.Context() as ctx:
        ctx.allow_unregistered_dialects = True
        with pytest.raises(Exception):
            ir.Module.parse(r.stdout.replace('"func.return"', '"func.return"(%nope)', 1))
