"""`rlxc opt`: named passes over MLIR text, in the style of mlir-opt, run as a subprocess.

Checks the printed module (it parses, verifies, and interprets to the expected
numbers), `--list-passes`, and that user errors (unknown pass, missing file,
bad IR, a pass rejecting its options) end with a one-paragraph message and the
right exit code, never a traceback.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlxc.dialect import module as M
from rlxc.dialect.interpreter import interpret
from rlxc.dialect.passes import PASSES
from rlxc.dialect.types import shape_of

SRC = """\
builtin.module {
  func.func @f(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}, %w: tensor<3xf32> {rlx.kind = "param", rlx.name = "w"}) -> tensor<f32> {
    %0 = rlx.mul %x, %w : tensor<3xf32>
    %1 = rlx.mul %x, %w : tensor<3xf32>
    %2 = rlx.add %0, %1 : tensor<3xf32>
    %3 = rlx.sum %2 axes = [0] : tensor<3xf32> -> tensor<f32>
    func.return %3 : tensor<f32>
  }
}
"""


def rlxc_cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "rlxc.cli.main", *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def src(tmp_path) -> Path:
    p = tmp_path / "f.mlir"
    p.write_text(SRC)
    return p


def _no_traceback(r):
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr


def test_pipeline_on_a_file(src):
    r = rlxc_cli("opt", str(src), "-p", "cse,rlx-vmap{batched=x size=2},cleanup")
    assert r.returncode == 0, r.stderr
    mod = M.parse(r.stdout)
    f = M.get_func(mod)
    assert shape_of(f.args[0]) == (2, 3) and shape_of(f.args[1]) == (3,)
    assert sum(op.name == "rlx.mul" for op in f.body.block.ops) == 1  # cse merged the two
    x = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    (out,) = interpret(mod, [x, np.ones(3, np.float32)])
    np.testing.assert_array_equal(out, [12, 30])


def test_stdin_output_file_and_empty_pipeline(tmp_path):
    out = tmp_path / "o.mlir"
    r = rlxc_cli("opt", "-", "-o", str(out), stdin=SRC)
    assert r.returncode == 0, r.stderr
    assert M.to_text(M.parse(out.read_text())) == M.to_text(M.parse(SRC))


def test_grad_pipeline(src):
    pytest.importorskip("rlxc.dialect.autodiff")
    r = rlxc_cli("opt", str(src), "-p", "rlx-grad{wrt=w},cse")
    assert r.returncode == 0, r.stderr
    mod = M.parse(r.stdout)
    x = np.array([1, 2, 3], np.float32)
    (g,) = interpret(mod, [x, np.zeros(3, np.float32)])
    np.testing.assert_allclose(g, 2 * x)  # d/dw sum(2 x w) = 2x


def test_list_passes():
    r = rlxc_cli("opt", "--list-passes")
    assert r.returncode == 0, r.stderr
    for name in PASSES:
        assert name in r.stdout
    assert "common subexpression" in r.stdout


def test_unknown_pass_is_a_usage_error(src):
    r = rlxc_cli("opt", str(src), "-p", "cse,frobnicate")
    assert r.returncode == 2
    _no_traceback(r)
    assert "unknown pass 'frobnicate'" in r.stderr
    for name in ("rlx-grad", "rlx-vmap", "canonicalize", "cse", "dce", "constant-fold"):
        assert name in r.stderr


def test_bad_pass_options_and_syntax_are_usage_errors(src):
    for pipe in ("rlx-vmap{batched=x}", "cse{", "rlx-vmap{size=2 batched=x bogus=1}"):
        r = rlxc_cli("opt", str(src), "-p", pipe)
        assert r.returncode == 2, (pipe, r.stderr)
        _no_traceback(r)


def test_missing_file_is_a_usage_error(tmp_path):
    r = rlxc_cli("opt", str(tmp_path / "nope.mlir"), "-p", "cse")
    assert r.returncode == 2
    _no_traceback(r)
    assert "does not exist" in r.stderr
    r = rlxc_cli("opt")
    assert r.returncode == 2 and "missing FILE" in r.stderr


def test_bad_ir_and_failing_pass_give_clean_errors(tmp_path, src):
    bad = tmp_path / "bad.mlir"
    bad.write_text("builtin.module { func.func @f() { %0 = rlx.nope } }")
    r = rlxc_cli("opt", str(bad))
    assert r.returncode == 1
    _no_traceback(r)
    assert "cannot parse" in r.stderr
    r = rlxc_cli("opt", str(src), "-p", "rlx-vmap{batched=w size=2}")
    assert r.returncode == 1
    _no_traceback(r)
    assert "params are shared, not batched: 'w'" in r.stderr


def test_installed_console_script(src):
    exe = Path(sys.executable).with_name("rlxc")
    if not exe.exists():
        pytest.skip("the rlxc console script is not installed next to this python")
    r = subprocess.run([str(exe), "opt", str(src), "-p", "dce"], capture_output=True,
                       text=True, timeout=60, env={**os.environ})
    assert r.returncode == 0, r.stderr
    M.parse(r.stdout)
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "opt" in r.stdout
