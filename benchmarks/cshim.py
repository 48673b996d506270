"""Build a benchmark's small C shim (isacap.c, corestate.c) once per source, privately.

    build_shared(source, stem, error)  ->  path of the .so
        the C file's sha256 names the output: <cache>/<stem>-<hash16>.so, built with
        $CC (default cc) -O2 -fPIC -shared into a temporary file and renamed (atomic: a
        concurrent build cannot leave half a file); <cache> is $XDG_CACHE_HOME/rlxc-<stem>
        or <tmp>/rlxc-<stem>-<uid>, created 0700, and refused (error) unless it is owned
        by this user and not writable by others: the shim is loaded into the process.
Stdlib only (the benchmarks import it before any peer library)."""
from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile

__all__ = ["cache_dir", "build_shared"]


def cache_dir(stem: str) -> str:
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return os.path.join(xdg, f"rlxc-{stem}")
    return os.path.join(tempfile.gettempdir(), f"rlxc-{stem}-{os.getuid()}")


def build_shared(source: str, stem: str, error: type[Exception]) -> str:
    """The path of `source` built as a shared library (see the module doc); `error` is
    raised with the reason when the directory is not private or the build fails."""
    with open(source, "rb") as f:
        src = f.read()
    out_dir = cache_dir(stem)
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    st = os.stat(out_dir)
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise error(f"{out_dir} is not a private directory of this user (owner uid "
                    f"{st.st_uid}, mode {st.st_mode & 0o777:o}): will not load code from it")
    path = os.path.join(out_dir, f"{stem}-{hashlib.sha256(src).hexdigest()[:16]}.so")
    if os.path.exists(path):
        return path
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    cc = os.environ.get("CC", "cc")
    r = subprocess.run([cc, "-O2", "-fPIC", "-shared", "-o", tmp, source],
                       capture_output=True, text=True)
    if r.returncode != 0:
        os.unlink(tmp)
        raise error(f"{cc} could not build {source}:\n{r.stderr.strip()}")
    os.replace(tmp, path)
    return path
