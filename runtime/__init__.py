from .loader import load  # noqa: F401
