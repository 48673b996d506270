"""Compile rlxc's own Python sources to bytecode ahead of time (`python -m rlxc.bytecode`).

Why: a cold compile imports ~60 rlxc modules (the dialect, the passes, the CPU
lowering) that a fresh process has not loaded.  A wheel install has their
`__pycache__/*.pyc` (pip compiles at install); an editable install (`pip install -e`,
what `make` does) has them only once some process has written them, and never where
PYTHONDONTWRITEBYTECODE is set.  Then every fresh process parses and compiles those
sources again: ~0.3 s of a 1 s cold compile of W4 (benchmarks/compare.py W7),
measured on a 2-core VM.  `make` and the W7 harness run this step, so an editable
checkout starts like an installed package.

Algorithm: `compileall` over each top-level package directory of the distribution
(rlxc, rlxc.dialect, rlxc.lowering, rlxc.runtime, rlxc.cli: their locations come from
the import system without importing them, so xDSL and llvmlite stay unloaded).  The
.pyc files are checked against their source's mtime and size on import (the default
"timestamp" mode), so an edited source is recompiled and a stale .pyc never runs.
"""
from __future__ import annotations

import compileall
import importlib.util
import os
import sys

PACKAGES = ("rlxc", "rlxc.dialect", "rlxc.lowering", "rlxc.runtime", "rlxc.cli")


def package_dirs() -> list[str]:
    """The source directories of PACKAGES (subpackages are found below them)."""
    out = []
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(f"rlxc.bytecode: package {name!r} not found")
        for d in spec.submodule_search_locations:
            d = os.path.abspath(d)
            if d not in out:
                out.append(d)
    return out


def compile_package(quiet: bool = True) -> bool:
    """Write the missing or stale .pyc files of every rlxc source; True when all compiled."""
    ok = True
    for d in package_dirs():
        ok &= bool(compileall.compile_dir(d, quiet=2 if quiet else 0, workers=1))
    return ok


if __name__ == "__main__":
    sys.exit(0 if compile_package(quiet="-v" not in sys.argv) else 1)
