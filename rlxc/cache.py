"""The disk cache of compiled programs, shared by every backend (CPU .so, GPU container).

    backend: key = entry_key(IR hash, device, options...)     (+ compiler fingerprint)
          │ load(key, kind, opener, check)  ──hit──> opener(payload path, meta)
          │   miss or bad entry (dropped, warned once)
          ▼
        store(key, kind, write, meta, suffix)
          write(tmp) fills a private temporary name in the cache folder; it is renamed to
          KEY-SHA16.SUFFIX (content-addressed), then KEY.json is written and renamed:
          the JSON is the commit step, so a reader sees no entry or a complete one

Entry: KEY.json is an object {format, kind, key, file, sha256, size, meta, checksum};
`checksum` is the sha256 of the canonical JSON of every other field, so a changed
bit anywhere in it (an output shape, a dtype, the entry symbol, the file name) is
seen before anything is loaded.  The payload's sha256 and size are checked before
it is opened, and `opener` (the backend's loader) cross-checks the metadata
against what the payload itself reports (the CPU loader: the entry and workspace
symbols, the workspace size and the signature the library exports), and `check`
against the caller's own description (the Func's signature and output types).
Any failure -- JSON that does not parse or is not an object, a checksum or
format mismatch, a path that is a directory, a missing or altered payload, a
loader or signature mismatch -- drops the entry (its JSON and its payload), warns
once (CacheWarning) and the caller rebuilds it.

Aliases: ALIAS_KEY.alias is a small checksummed JSON naming the entry an alias
resolved to, itself and a digest of that entry's signature (args and outputs), so
an alias that was altered, or copied from another alias, is dropped and rebuilt.

Full or read-only disk: when writing the cache folder fails (ENOSPC, EROFS, EACCES,
a linker that could not write), the half-written files are removed, a CacheWarning
says so once, and the program is written to a private temporary folder of this
process (/tmp/rlxc-cache-pPID-*) instead, which is removed at exit (with the
folders of processes that were killed before they could remove theirs).  Stale
temporary files of compiles that were killed (`.tmp-pPID-*` of a process that is
gone; a name without a pid: older than a day) are removed when an entry is written.

Fingerprint: every .py file under lowering/ (recursively) and dialect/ plus the
llvmlite version, hashed without importing them, so any compiler edit invalidates
old entries (no hand-kept list of files).  FORMAT is part of every key too.
"""
from __future__ import annotations

import atexit
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import uuid
import warnings

FORMAT = "rlxc-cache-2"
STATS = {"compiles": 0, "disk_hits": 0, "memory_hits": 0, "rejected": 0, "fallbacks": 0}
FINGERPRINT_PACKAGES = ("rlxc.lowering", "rlxc.dialect")  # the code that decides codegen
STALE_AGE = 24 * 3600.0  # a temporary file without a pid in its name is stale after this
DEAD_AGE = 60.0          # one of a process that is gone, after this

_fingerprint = None
_warned: set = set()
_private: list = []  # this process's fallback folder (created on first need)
_lock = threading.Lock()


class CacheWarning(RuntimeWarning):
    """The compile cache dropped a bad entry or could not write its folder."""


class BadEntry(ValueError):
    """A cache entry that must not be used (the message says why)."""


def cache_dir() -> str:
    return os.environ.get("RLXC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                            "rlxc")


def warn_once(what: str, msg: str) -> None:
    """One CacheWarning per `what` per process."""
    with _lock:
        if what in _warned:
            return
        _warned.add(what)
    warnings.warn(msg, CacheWarning, stacklevel=3)


# ------------------------------------------------------------------ keys

def _package_dir(name: str) -> str | None:
    from importlib.util import find_spec

    try:
        spec = find_spec(name)  # imports the parent package only, not `name` itself
    except (ImportError, ValueError):  # pragma: no cover
        return None
    locs = list(spec.submodule_search_locations or []) if spec else []
    return locs[0] if locs else None


def compiler_fingerprint() -> str:
    """Hash of every source file of the compiler (see FINGERPRINT_PACKAGES) and the LLVM
    binding version; computed once per process without importing either."""
    global _fingerprint
    if _fingerprint is None:
        h = hashlib.sha256()
        for pkg in FINGERPRINT_PACKAGES:
            root = _package_dir(pkg)
            h.update(pkg.encode() + b"\0" + (b"" if root else b"missing"))
            if not root:
                continue
            files = []
            for d, subdirs, names in os.walk(root):
                subdirs[:] = sorted(s for s in subdirs if s != "__pycache__")
                files += [os.path.join(d, n) for n in names if n.endswith(".py")]
            for p in sorted(files):
                rel = os.path.relpath(p, root).replace(os.sep, "/")
                try:
                    with open(p, "rb") as f:
                        h.update(rel.encode() + b"\0" + f.read() + b"\0")
                except OSError:
                    h.update(rel.encode() + b"\0unreadable\0")
        # llvmlite's version without importing it (a cache hit must not load LLVM) or
        # importlib.metadata (tens of ms): the bytes of its _version.py
        root = _package_dir("llvmlite")
        try:
            with open(os.path.join(root, "_version.py"), "rb") as f:
                h.update(f.read())
        except (OSError, TypeError):  # pragma: no cover
            h.update(b"llvmlite ?")
        _fingerprint = h.hexdigest()[:16]
    return _fingerprint


def entry_key(*parts) -> str:
    """The 40-hex key of an entry: `parts` (what decides the program), the compiler
    fingerprint and the cache format."""
    text = "|".join([*map(str, parts), compiler_fingerprint(), FORMAT])
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _is_key(s) -> bool:
    return isinstance(s, str) and len(s) == 40 and all(c in "0123456789abcdef" for c in s)


def _checksum(fields: dict) -> str:
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def signature_digest(meta: dict) -> str:
    """Digest of what a caller relies on: the arguments and the outputs."""
    return _checksum({"args": meta.get("args"), "outputs": meta.get("outputs")})


def _sha256(path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


# ------------------------------------------------------------------ reading

def _regular(path: str, what: str) -> None:
    """BadEntry unless `path` is a regular file (not a directory, FIFO, device...)."""
    mode = os.stat(path).st_mode
    if stat.S_ISDIR(mode):
        raise BadEntry(f"{what} is a directory")
    if not stat.S_ISREG(mode):
        raise BadEntry(f"{what} is not a regular file")


def _read_object(path: str) -> dict:
    """The JSON object at `path` (BadEntry when it is not a regular file holding one)."""
    _regular(path, "the entry path")
    with open(path, "rb") as f:
        data = f.read(1 << 24)
    try:
        info = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise BadEntry(f"unreadable JSON ({e})") from None
    if not isinstance(info, dict):
        raise BadEntry(f"the JSON is a {type(info).__name__}, not an object")
    return info


def _verified(d: str, key: str, kind: str) -> tuple[str, dict]:
    """(payload path, meta) of entry `key`, every field checked (BadEntry if not)."""
    info = _read_object(os.path.join(d, key + ".json"))
    fields = {k: v for k, v in info.items() if k != "checksum"}
    try:
        ok = info.get("checksum") == _checksum(fields)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise BadEntry("checksum mismatch (the JSON was altered)")
    if info.get("format") != FORMAT or info.get("kind") != kind or info.get("key") != key:
        raise BadEntry(f"foreign entry (format {info.get('format')!r}, kind "
                       f"{info.get('kind')!r})")
    name, meta = info.get("file"), info.get("meta")
    if not (isinstance(name, str) and name.startswith(key + "-") and
            os.path.basename(name) == name and isinstance(meta, dict)):
        raise BadEntry("malformed entry")
    path = os.path.join(d, name)
    _regular(path, "the payload path")
    sha, size = _sha256(path)
    if sha != info.get("sha256") or size != info.get("size"):
        raise BadEntry("payload checksum mismatch")
    return path, meta


def _drop(d: str, key: str, why: str) -> None:
    """Remove entry `key` (its JSON and payloads) and warn once."""
    STATS["rejected"] += 1
    jp = os.path.join(d, key + ".json")
    try:
        if os.path.isdir(jp) and not os.path.islink(jp):
            shutil.rmtree(jp, ignore_errors=True)
        elif os.path.lexists(jp):
            os.unlink(jp)
        for n in os.listdir(d):
            if n.startswith(key + "-"):
                p = os.path.join(d, n)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    os.unlink(p)
    except OSError:
        pass
    warn_once("drop:" + key, f"rlxc compile cache: dropped entry {key} in {d} ({why}); "
                             "rebuilding it")


def load(key: str, kind: str, opener, check=None, d: str | None = None):
    """`opener(payload_path, meta)` of a valid entry, or None (no entry, or a bad one,
    which is dropped).  `opener` and `check(meta)` raise (ValueError, OSError, or the
    runtime's ArtifactError) on a mismatch."""
    d = d or cache_dir()
    if not os.path.lexists(os.path.join(d, key + ".json")):
        return None
    try:
        path, meta = _verified(d, key, kind)
        if check is not None:
            check(meta)
        return opener(path, meta)
    except Exception as e:  # noqa: BLE001 - any failure means: do not trust the entry
        if isinstance(e, (KeyboardInterrupt, MemoryError)):  # pragma: no cover
            raise
        _drop(d, key, f"{type(e).__name__}: {e}")
        return None


# ------------------------------------------------------------------ writing

def _tmp_name(d: str, suffix: str) -> str:
    return os.path.join(d, f".tmp-p{os.getpid()}-{uuid.uuid4().hex[:12]}{suffix}")


def write_atomic(path: str, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename."""
    tmp = _tmp_name(os.path.dirname(path) or ".", ".part")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


_PID = re.compile(r"\.p(\d+)[.-]|-p(\d+)-")


def remove_stale(d: str, match) -> int:
    """Remove the entries of folder `d` whose name satisfies `match(name)` and that are
    stale: written more than DEAD_AGE ago by a process that is gone (its pid is in the
    name as `pPID`), or, for a name without a pid, older than STALE_AGE.  Returns how
    many were removed."""
    n = 0
    now = time.time()
    try:
        names = os.listdir(d)
    except OSError:
        return 0
    for name in names:
        if not match(name):
            continue
        p = os.path.join(d, name)
        try:
            age = now - os.lstat(p).st_mtime
            m = _PID.search(name)
            pid = int(m.group(1) or m.group(2)) if m else None
            if (age > STALE_AGE) if pid is None else \
                    (pid != os.getpid() and age > DEAD_AGE and not _alive(pid)):
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p)
                else:
                    os.unlink(p)
                n += 1
        except OSError:
            pass
    return n


_swept: list = []


def _sweep_tmp() -> None:
    """Once per process: remove the private folders of killed processes from the
    temporary folder (this module's rlxc-cache-pPID-*, compile_cpu's rlxc-pPID-*)."""
    if not _swept:
        _swept.append(True)
        remove_stale(tempfile.gettempdir(), lambda n: n.startswith(("rlxc-cache-p", "rlxc-p")))


def private_dir() -> str:
    """This process's private fallback folder (removed at exit)."""
    with _lock:
        if not _private:
            _sweep_tmp()
            _private.append(tempfile.mkdtemp(prefix=f"rlxc-cache-p{os.getpid()}-"))
            atexit.register(shutil.rmtree, _private[0], True)
        os.makedirs(_private[0], mode=0o700, exist_ok=True)  # (a tmp cleaner removed it)
        return _private[0]


def _writable(d: str) -> bool:
    try:
        os.makedirs(d, exist_ok=True)
    except OSError:
        return False
    return os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK)


class Entry:
    """A stored program: `path` of its payload and its `meta` (`cached`: in the cache
    folder, False when it went to the private fallback folder)."""

    __slots__ = ("key", "path", "meta", "cached")

    def __init__(self, key, path, meta, cached):
        self.key, self.path, self.meta, self.cached = key, path, meta, cached


def store(key: str, kind: str, write, meta: dict, suffix: str, d: str | None = None) -> Entry:
    """Write entry `key`: `write(path)` creates the payload at `path`; returns the Entry.

    Falls back to the private folder (warning once) when the cache folder cannot be
    written; a failure there raises, with every file it started removed."""
    d = d or cache_dir()
    meta = json.loads(json.dumps(meta))  # a plain JSON copy: what a reader will see
    _sweep_tmp()
    if _writable(d):
        remove_stale(d, lambda n: n.startswith(".tmp-"))
        try:
            return _store_in(d, key, kind, write, meta, suffix, commit=True)
        except (OSError, RuntimeError) as e:
            if not _disk_error(e):
                raise
            STATS["fallbacks"] += 1
            warn_once("write:" + d, f"rlxc compile cache: cannot write {d} ({e}); "
                                    "compiling into a private temporary directory instead")
    else:
        STATS["fallbacks"] += 1
        warn_once("write:" + d, f"rlxc compile cache: {d} is not a writable directory; "
                                "compiling into a private temporary directory instead")
    return _store_in(private_dir(), key, kind, write, meta, suffix, commit=False)


_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                errno.EISDIR, errno.ENOTDIR, errno.EIO, errno.EFBIG}


def _disk_error(e: BaseException) -> bool:
    """Whether a failure of writing into the cache folder is the folder's fault."""
    if isinstance(e, OSError):
        return e.errno in _DISK_ERRNOS or e.errno is None
    text = str(e)  # a linker that could not write its output (RuntimeError with its stderr)
    return any(s in text for s in ("No space left", "Read-only file system",
                                   "Permission denied", "Disk quota", "Is a directory",
                                   "File too large", "cannot open output file"))


def _store_in(d, key, kind, write, meta, suffix, commit) -> Entry:
    tmp = _tmp_name(d, suffix)
    path = None
    try:
        write(tmp)
        sha, size = _sha256(tmp)
        path = os.path.join(d, f"{key}-{sha[:16]}{suffix}")
        os.replace(tmp, path)
        if commit:
            fields = {"format": FORMAT, "kind": kind, "key": key, "file": os.path.basename(path),
                      "sha256": sha, "size": size, "meta": meta}
            jp = os.path.join(d, key + ".json")
            if os.path.isdir(jp) and not os.path.islink(jp):
                shutil.rmtree(jp)
            write_atomic(jp, json.dumps({**fields, "checksum": _checksum(fields)}, indent=1,
                                        sort_keys=True).encode())
        return Entry(key, path, meta, commit)
    except BaseException:
        for p in (tmp, path):
            try:
                if p and os.path.lexists(p):
                    os.unlink(p)  # never a half-written entry (a loaded copy stays mapped)
            except OSError:
                pass
        raise


# ------------------------------------------------------------------ aliases

def read_alias(akey: str, d: str | None = None) -> tuple[str, str] | None:
    """(entry key, signature digest) that alias `akey` names, or None.  A bad alias file
    is removed (and warned about once)."""
    d = d or cache_dir()
    ap = os.path.join(d, akey + ".alias")
    if not os.path.lexists(ap):
        return None
    try:
        info = _read_object(ap)
        fields = {k: v for k, v in info.items() if k != "checksum"}
        if info.get("checksum") != _checksum(fields) or info.get("alias") != akey or \
                info.get("format") != FORMAT or not _is_key(info.get("key")) or \
                not isinstance(info.get("signature"), str):
            raise BadEntry("altered or foreign alias")
        return info["key"], info["signature"]
    except (OSError, ValueError, TypeError) as e:
        drop_alias(akey, f"{type(e).__name__}: {e}", d)
        return None


def drop_alias(akey: str, why: str, d: str | None = None) -> None:
    d = d or cache_dir()
    ap = os.path.join(d, akey + ".alias")
    STATS["rejected"] += 1
    try:
        if os.path.isdir(ap) and not os.path.islink(ap):
            shutil.rmtree(ap, ignore_errors=True)
        elif os.path.lexists(ap):
            os.unlink(ap)
    except OSError:
        pass
    warn_once("alias:" + akey, f"rlxc compile cache: dropped alias {akey} in {d} ({why}); "
                               "rebuilding it")


def write_alias(akey: str, key: str, meta: dict, d: str | None = None) -> None:
    """Record that alias `akey` resolves to entry `key` (whose metadata is `meta`);
    a write that fails (full or read-only disk) leaves no file and is ignored."""
    d = d or cache_dir()
    fields = {"format": FORMAT, "alias": akey, "key": key,
              "signature": signature_digest(meta)}
    try:
        if _writable(d):
            write_atomic(os.path.join(d, akey + ".alias"),
                         json.dumps({**fields, "checksum": _checksum(fields)}).encode())
    except OSError:
        pass


__all__ = ["FORMAT", "STATS", "CacheWarning", "BadEntry", "Entry", "cache_dir",
           "compiler_fingerprint", "entry_key", "signature_digest", "load", "store",
           "read_alias", "write_alias", "drop_alias", "write_atomic", "remove_stale",
           "private_dir", "warn_once"]
