"""rlxc: an ahead-of-time ML compiler with JAX-style transforms.

Trace a pure function of named inputs and params into the `rlx` MLIR dialect,
transform it (grad, value_and_grad, vmap, jvp, hvp), and compile it to native
CPU or NVIDIA GPU code loaded by a small ctypes runtime.

The compiler parts (Func, GraphScope, Tensor, ...) load on first use, so that a
compiled module importing `rlxc.runtime` pulls in neither xdsl nor llvmlite.
"""
__version__ = "0.1.0"

import importlib

from rlxc.runtime.errors import ArtifactError, NameLookupError, RlxError, ShapeError  # noqa: E402

from . import lowp, optim  # noqa: E402  (NumPy only)
from .schedules import LrSchedule  # noqa: E402

_LAZY = {
    "Func": "rlxc.func",
    "default_device": "rlxc.registry",
    "GraphScope": "rlxc.tensor",
    "Tensor": "rlxc.tensor",
    "concat": "rlxc.tensor",
    "where": "rlxc.tensor",
    "argmax": "rlxc.indexops", "argmin": "rlxc.indexops", "cumsum": "rlxc.indexops",
    "topk": "rlxc.indexops", "one_hot": "rlxc.indexops",
    **{n: "rlxc.conv" for n in ("conv2d", "conv1d", "conv_transpose2d", "max_pool2d",
                                "avg_pool2d", "upsample_nearest2d")},
    "attention": "rlxc.attention_op",
    "einsum": "rlxc.einsum_op",
    "scan": "rlxc.control",
    "while_loop": "rlxc.control",
    "cond": "rlxc.control",
    "fori_loop": "rlxc.control",
    "from_onnx": "rlxc.onnx_import",
    "UnsupportedOnnxOp": "rlxc.onnx_import",
}


_SUBMODULES = ("distributed", "random", "nn")   # imported on first use: rlxc.distributed.init(...)


def __getattr__(name):
    if name in _SUBMODULES:
        try:
            value = importlib.import_module(f"rlxc.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"rlxc.{name}":
                raise
            raise AttributeError(f"module 'rlxc' has no attribute {name!r}") from None
        globals()[name] = value
        return value
    if name not in _LAZY:
        raise AttributeError(f"module 'rlxc' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


__all__ = ["Func", "default_device", "LrSchedule", "optim", "lowp", "GraphScope", "Tensor",
           "concat", "where", "scan", "while_loop", "cond", "fori_loop", "ShapeError",
           "NameLookupError", "RlxError", "ArtifactError", "__version__", "attention", "einsum",
           "from_onnx", "UnsupportedOnnxOp"]
