import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Compiled artifacts go to a per-session temp cache, never the user's home."""
    if "RLXC_CACHE_DIR" not in os.environ or os.environ.get("RLXC_TEST_OWN_CACHE"):
        d = tmp_path_factory.getbasetemp() / "rlxc-cache"
        monkeypatch.setenv("RLXC_CACHE_DIR", str(d))


@pytest.fixture(autouse=True)
def _test_device(monkeypatch):
    """`run()`/`jit()`/`trainer()` without a device use the CPU in tests, even where a GPU
    makes cuda the automatic choice (rlxc.registry.default_device): the tests state CPU
    semantics (e.g. gather's IndexError).  RLXC_DEVICE=cuda runs them on the GPU."""
    if "RLXC_DEVICE" not in os.environ:
        monkeypatch.setenv("RLXC_DEVICE", "cpu")
