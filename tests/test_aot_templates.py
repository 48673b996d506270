"""The artifact templates and their filler (lowering/artifact/), and the layering rule.

The generated C, header and package text come from templates/*.in; these
tests pin the filler's strictness (no hole without a value, no value without a
hole, balanced sections), that the templates ship as package data, and that
lowering/ never imports rlxc's API layer (rlxc/export.py does the Func-level work).
"""
from __future__ import annotations

import ast
import glob
import os
import tomllib

import pytest

from rlxc.lowering.artifact import template

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
API_MODULES = ("rlxc.func", "rlxc.train", "rlxc.trainer", "rlxc.optim", "rlxc.export",
               "rlxc.backends", "rlxc.tensor", "rlxc.checkpoint")


def _imports(path):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "rlxc":
                yield from (f"rlxc.{a.name}" for a in node.names)
            else:
                yield node.module


def test_lowering_never_imports_the_api_layer():
    bad = []
    for path in glob.glob(os.path.join(ROOT, "lowering", "**", "*.py"), recursive=True):
        for mod in _imports(path):
            if mod == "rlxc" or mod.startswith(API_MODULES):
                bad.append(f"{os.path.relpath(path, ROOT)}: {mod}")
    assert not bad, bad


def test_templates_are_package_data():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        cfg = tomllib.load(f)
    pats = cfg["tool"]["setuptools"]["package-data"]["rlxc.lowering.artifact"]
    here = os.path.join(ROOT, "lowering", "artifact")
    files = {os.path.relpath(p, here) for p in glob.glob(os.path.join(here, "templates", "*"))}
    shipped = {os.path.relpath(p, here) for pat in pats for p in glob.glob(os.path.join(here, pat))}
    assert files and files == shipped, files - shipped


def test_filler_is_strict(monkeypatch):
    texts = {"t.in": "a @x@ b\n@if s@\nin @y@\n@else@\nout\n@end@\nend\n",
             "open.in": "@if s@\nx\n", "stray.in": "@end@\n"}
    monkeypatch.setattr(template, "template_text", lambda name: texts[name])
    assert template.fill("t.in", {"x": 1, "y": 2}, {"s": True}) == "a 1 b\nin 2\nend\n"
    assert template.fill("t.in", {"x": 1}, {"s": False}) == "a 1 b\nout\nend\n"
    with pytest.raises(ValueError, match=r"t.in: no value for @x@"):
        template.fill("t.in", {}, {"s": False})
    with pytest.raises(ValueError, match=r"t.in: values \['z'\] fill no hole"):
        template.fill("t.in", {"x": 1, "z": 3}, {"s": False})
    with pytest.raises(ValueError, match="no value for section 's'"):
        template.fill("t.in", {"x": 1})
    with pytest.raises(ValueError, match="not closed"):
        template.fill("open.in", {}, {"s": True})
    with pytest.raises(ValueError, match="without @if@"):
        template.fill("stray.in", {})



def test_train_header_comment_is_one_line_per_entry():
    """Issue 13 item 11: the --train paragraph of the header comment started on the last
    signature line ("... (baked) *")."""
    import rlxc
    from rlxc import export
    from rlxc.lowering.artifact.header import emit_header

    f = rlxc.Func("t", lambda s: ((s.input("x", (2, 3)) @ s.param("w", (3, 1))) ** 2).sum()
                  ).init_randn(seed=0, stddev=0.5)
    spec = export.spec_from_func(f, "t")
    spec.train = export.train_spec(f, rlxc.optim.SGD(0.1))
    head = emit_header(spec).split("\n */\n", 1)[0].splitlines()
    assert head[0].startswith("/* t.h") and all(ln.startswith(" *") for ln in head[1:]), head
    sig = [ln for ln in head if ln.startswith(" *   param ")]
    assert sig == [" *   param   0  w                f32 [3, 1] (baked)"], sig
    i = head.index(sig[-1])
    assert head[i + 1:i + 3] == [" *", " * Training (compiled with --train --optimizer sgd, "
                                       "lr 0.1):"], head[i:i + 3]
