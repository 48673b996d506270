"""The compile cache trusts nothing it reads back (issue 13 item 12).

An entry whose JSON still parses but was altered (one flipped bit in an output
shape, a dtype, the output count, the entry symbol), JSON that is not an object,
an entry path that is a directory, or a Trainer alias that names another valid
entry: the next run drops it, warns once (CacheWarning), rebuilds and returns
correct results.  Every run that reads a damaged entry is a subprocess, so a
crash (SIGSEGV, SIGABRT) would fail the test instead of killing pytest.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rlxc.cache as C

SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    import rlxc.backends as B
    from rlxc import Func
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        f = Func("trust", lambda s: (s.input("x", (5,)) * 3.0).tanh()
                 + s.param("w", ())).with_param("w", 1.0)
        out = f.run(x=np.arange(5, dtype=np.float32))[0]
    print(json.dumps({"out": out.tolist(), "warnings": [str(w.message) for w in caught
                                                        if "compile cache" in str(w.message)],
                      **B.STATS}))
""")


def _want():
    return (np.tanh(np.arange(5, dtype=np.float32) * np.float32(3.0)) + 1.0).tolist()


def _run(cache, script=SCRIPT):
    env = {**os.environ, "RLXC_CACHE_DIR": str(cache)}
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, f"exit {p.returncode}: {p.stderr[-2000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def _entry(cache):
    (js,) = [p for p in cache.iterdir() if p.suffix == ".json"]
    return js


def _flip(js, anchor, old, new):
    """Flip the bits of one byte: the first `old` after `anchor` becomes `new`."""
    data = bytearray(js.read_bytes())
    i = data.index(old.encode(), data.index(anchor.encode()))
    assert bin(ord(old) ^ ord(new)).count("1") == 1, "a single bit"
    data[i] = ord(new)
    js.write_bytes(bytes(data))


def _forge(js, edit):
    """Change the metadata and recompute the checksum (a consistent but wrong entry)."""
    info = json.loads(js.read_text())
    edit(info["meta"])
    fields = {k: v for k, v in info.items() if k != "checksum"}
    info["checksum"] = C._checksum(fields)
    js.write_text(json.dumps(info))


def _drop_output(meta):
    meta["outputs"] = []


DAMAGE = {
    # one flipped bit anywhere: the checksum
    "bit_output_shape": lambda js: _flip(js, '"outputs"', "5", "7"),
    "bit_input_shape": lambda js: _flip(js, '"args"', "5", "4"),
    "bit_dtype": lambda js: _flip(js, '"outputs"', "f", "b"),
    "bit_entry_symbol": lambda js: _flip(js, '"entry"', "t", "u"),
    "bit_checksum": lambda js: _flip(js, '"checksum"', "\"", "#"),
    # forged: checksum recomputed, caught by the cross-checks
    "forged_output_shape": lambda js: _forge(js, lambda m: m["outputs"][0].update(shape=[500])),
    "forged_output_count": lambda js: _forge(js, _drop_output),
    "forged_dtype": lambda js: _forge(js, lambda m: m["outputs"][0].update(dtype="f64")),
    "forged_entry": lambda js: _forge(js, lambda m: m.update(entry="rlx_other")),
    "forged_workspace": lambda js: _forge(js, lambda m: m.update(workspace_size=1 << 40)),
    # not an entry at all
    "json_list": lambda js: js.write_text("[1, 2, 3]"),
    "json_string": lambda js: js.write_text('"rlxc"'),
    "json_dir": lambda js: (js.unlink(), js.mkdir(), (js / "x").write_text("{}")),
    "payload_dir": lambda js: [(p.unlink(), p.mkdir()) for p in js.parent.glob("*.so")],
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_altered_entry_is_dropped_rebuilt_and_warned(tmp_path, damage):
    cache = tmp_path / "cache"
    first = _run(cache)
    assert first["compiles"] == 1 and np.allclose(first["out"], _want())
    js = _entry(cache)
    DAMAGE[damage](js)
    second = _run(cache)
    assert np.allclose(second["out"], _want())
    assert second["compiles"] == 1 and second["rejected"] == 1
    assert len(second["warnings"]) == 1 and "dropped entry" in second["warnings"][0]
    third = _run(cache)  # the rebuilt entry is valid
    assert third["compiles"] == 0 and third["disk_hits"] == 1 and not third["warnings"]
    assert np.allclose(third["out"], _want())


def test_library_reports_its_signature(tmp_path):
    """The loader compares the metadata with the signature the library exports."""
    from rlxc.runtime.cpu import CpuLibrary
    from rlxc.runtime.errors import ArtifactError

    cache = tmp_path / "cache"
    _run(cache)
    info = json.loads(_entry(cache).read_text())
    so = str(cache / info["file"])
    meta = info["meta"]
    CpuLibrary(so, meta, require_signature=True)
    bad = json.loads(json.dumps(meta))
    bad["outputs"][0]["shape"] = [6]
    with pytest.raises(ArtifactError, match="signature"):
        CpuLibrary(so, bad)
    bad = json.loads(json.dumps(meta))
    bad["args"][0]["dtype"] = "f64"
    with pytest.raises(ArtifactError, match="signature"):
        CpuLibrary(so, bad)


TRAINER = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    import rlxc
    import rlxc.backends as B
    from rlxc.optim import SGD
    warnings.simplefilter("always")
    which = sys.argv[1]

    def build(s):
        n = 3 if which == "a" else 6
        x = s.input("x", (4, n))
        h = x.linear(s.param("w", (n, 5)), s.param("b", (5,))).relu()
        return h.linear(s.param("v", (5, 2))).cross_entropy(s.input("y", (4,), "i32"))

    with warnings.catch_warnings(record=True) as caught:
        f = rlxc.Func("tc_" + which, build).init_randn(1, 0.3)
        tr = f.trainer(SGD(0.1))
        n = 3 if which == "a" else 6
        x = np.linspace(-1, 1, 4 * n, dtype=np.float32).reshape(4, n)
        y = np.array([0, 1, 1, 0], np.int32)
        losses = [tr.step({"x": x, "y": y}) for _ in range(3)]
    print(json.dumps({"losses": losses, "built": tr._prog._func is not None,
                      "warnings": [str(w.message) for w in caught
                                   if "compile cache" in str(w.message)], **B.STATS}))
""")


def _trainer(cache, which):
    env = {**os.environ, "RLXC_CACHE_DIR": str(cache)}
    p = subprocess.run([sys.executable, "-c", TRAINER, which], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, f"exit {p.returncode}: {p.stderr[-2000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("damage", ["copied", "bit_target"])
def test_trainer_alias_naming_another_entry_is_dropped(tmp_path, damage):
    cache = tmp_path / "cache"
    a = _trainer(cache, "a")
    (alias_a,) = cache.glob("*.alias")
    b = _trainer(cache, "b")
    (alias_b,) = [p for p in cache.glob("*.alias") if p != alias_a]
    if damage == "copied":  # a's alias now names b's (valid) entry
        alias_a.write_bytes(alias_b.read_bytes())
    else:  # one bit of the target key
        info = json.loads(alias_a.read_text())
        target = info["key"]
        other = json.loads(alias_b.read_text())["key"]
        assert target != other
        text = alias_a.read_text()
        i = text.index(target)
        c = text[i]
        flipped = chr(ord(c) ^ 1) if chr(ord(c) ^ 1) in "0123456789abcdef" else chr(ord(c) ^ 4)
        alias_a.write_text(text[:i] + flipped + text[i + 1:])
    again = _trainer(cache, "a")
    assert again["losses"] == a["losses"] and again["built"]
    assert again["compiles"] == 0  # a's own entry is still valid: only the alias was bad
    assert len(again["warnings"]) == 1 and "dropped alias" in again["warnings"][0]
    assert _trainer(cache, "b")["losses"] == b["losses"]  # b's entry was not touched
    warm = _trainer(cache, "a")
    assert not warm["built"] and warm["losses"] == a["losses"] and not warm["warnings"]


def test_fifo_in_place_of_an_entry_does_not_hang(tmp_path):
    cache = tmp_path / "cache"
    _run(cache)
    js = _entry(cache)
    js.unlink()
    os.mkfifo(js)
    again = _run(cache)
    assert np.allclose(again["out"], _want()) and again["compiles"] == 1
    assert js.is_file()
