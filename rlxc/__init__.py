"""rlxc: an ahead-of-time ML compiler with JAX-style transforms.

Trace a pure function of named inputs and params into the `rlx` MLIR dialect,
transform it (grad, value_and_grad, vmap, jvp, hvp), and compile it to native
CPU or NVIDIA GPU code loaded by a small ctypes runtime.
"""
__version__ = "0.1.0"

from rlxc.runtime.errors import ArtifactError, NameLookupError, RlxError, ShapeError  # noqa: E402

from . import lowp, optim  # noqa: E402
from .func import Func, default_device  # noqa: E402
from .schedules import LrSchedule  # noqa: E402
from .tensor import GraphScope, Tensor, concat, where  # noqa: E402

__all__ = ["Func", "default_device", "LrSchedule", "optim", "lowp", "GraphScope", "Tensor", "concat", "where", "ShapeError", "NameLookupError",
           "RlxError", "ArtifactError", "__version__"]
