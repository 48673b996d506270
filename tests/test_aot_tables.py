"""glue.c's tensor_info tables come from ONE writer (lowering/artifact/glue.tensor_table).

A static artifact's rows are the int dims, numel and the param's blob offset; a
size-generic one (spec.dims) stores a dynamic axis as -1 - its dim's index and
counts it as 1 in numel.  Both go through the same function, so the glue of a
static and of a dynamic Func differ only where the shapes do.
"""
from __future__ import annotations

import numpy as np

from rlxc.lowering.artifact import glue
from rlxc.runtime.loader import TensorSpec


def _t(name, shape, dtype="f32", kind="input"):
    return TensorSpec(name, kind, tuple(shape), dtype)


def test_static_table_rows():
    text = glue.tensor_table("PAR", [_t("w", (4, 8), kind="param"), _t("b", (), "f64", "param")],
                             blob={"w": 0})
    assert text == (
        "static const int64_t PAR_dims0[] = {4, 8};\n"
        "static const int64_t PAR_dims1[] = {0};\n"
        "static const tensor_info PAR[] = {\n"
        '    {"w", "f32", 2, PAR_dims0, 32u, 4u, 0},\n'
        '    {"b", "f64", 0, PAR_dims1, 1u, 8u, -1},\n'
        "};")


def test_dynamic_table_rows_encode_symbols():
    text = glue.tensor_table("IN", [_t("x", ("B", 8)), _t("q", ("T", 0, "B"), "i32")],
                             ["B", "T"])
    assert "static const int64_t IN_dims0[] = {-1, 8};" in text
    assert "static const int64_t IN_dims1[] = {-2, 0, -1};" in text
    assert '{"x", "f32", 2, IN_dims0, 8u, 4u, -1},' in text
    assert '{"q", "i32", 3, IN_dims1, 0u, 4u, -1},' in text   # empty at every size


def test_empty_list_has_one_placeholder_row():
    assert glue.tensor_table("OUT", []) == (
        "static const tensor_info OUT[] = {\n"
        '    {"", "", 0, NULL, 0u, 0u, -1},\n'
        "};")


def test_dynamic_glue_uses_the_shared_writer(monkeypatch):
    """emit_glue of a spec with dims fills IN/OUT through tensor_table with those dims
    (dynglue has no table writer of its own)."""
    from rlxc.lowering.artifact import dynglue
    from rlxc.lowering.artifact.spec import ArtifactSpec

    assert not hasattr(dynglue, "dyn_table")
    calls = []
    real = glue.tensor_table

    def spy(prefix, lst, dims=(), blob=None):
        calls.append((prefix, list(dims)))
        return real(prefix, lst, dims, blob)

    monkeypatch.setattr(glue, "tensor_table", spy)

    class _F:
        name = "f"

        def mlir(self):
            return ""

    spec = ArtifactSpec("dy", _F(), [_t("x", ("B", 3))], [_t("y", ("B",), kind="output")],
                        [_t("w", (3,), kind="param")], {"w": np.zeros(3, np.float32)},
                        dims=["B"])
    text = glue.emit_glue(spec, "k", dyn_kernels={0: dynglue.DynKernel("k", ["B"], [0])})
    assert calls == [("IN", ["B"]), ("OUT", ["B"]), ("PAR", [])]
    assert "static const int64_t IN_dims0[] = {-1, 3};" in text
    assert '{"y", "f32", 1, OUT_dims0, 1u, 4u, -1},' in text
