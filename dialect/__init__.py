"""The rlx MLIR dialect (xDSL): ops, types, module helpers and passes."""
from .ops import OPS, RLX, op_class, make_op  # noqa: F401
from .types import ShapeError  # noqa: F401
