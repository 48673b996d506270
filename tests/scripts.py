"""Import a script of the repository (benchmarks/, examples/) by path: they are not
packages, and tests call their functions directly."""
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(relpath: str, name: str):
    """The module at ROOT/relpath, executed fresh and registered as sys.modules[name] (a
    dataclass of the script looks its module up there)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, relpath))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
