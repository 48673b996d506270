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
