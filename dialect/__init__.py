"""The rlx dialect (xDSL): ops, types, module helpers and passes.

Submodules load on first use: tracing needs only `shapes` and `trace` (no
xDSL); `ops`, `module`, `types` and the passes import xDSL.
"""
import importlib

_FROM_OPS = ("OPS", "RLX", "op_class", "make_op")


def __getattr__(name):
    if name in _FROM_OPS:
        value = getattr(importlib.import_module(".ops", __name__), name)
    elif name == "ShapeError":
        from rlxc.runtime.errors import ShapeError as value
    elif not name.startswith("__"):
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
