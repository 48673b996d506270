"""The runtime: load and call compiled code with NumPy, ctypes and the standard library.

`load` (runtime/loader.py) is imported on first use, so that importing
`rlxc.runtime.errors` (as `import rlxc` does) stays cheap."""


def __getattr__(name):
    if name == "load":
        from .loader import load

        globals()["load"] = load
        return load
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
