"""Checkpoints: dicts of named arrays in safetensors files, strictly checked.

Purpose
-------
Model parameters (float32) and optimizer state (``Optimizer.state_dict()``,
which adds a few int64/float64/uint8 entries) are saved as one safetensors
file, the format the rest of the ecosystem reads.  Loading can check the
file against the names and shapes the caller expects, so a checkpoint from a
different model fails loudly instead of being half-applied.

Algorithm
---------
* save: validate names and arrays, serialize in memory with
  ``safetensors.numpy.save`` (arrays made C-contiguous first), write to a
  temporary file ``.NAME.pPID.*.tmp`` in the destination directory, fsync,
  then ``os.replace`` onto the destination, so readers see the old file or the
  new one, never a torn write.  Temporary files that killed saves left behind
  (their process is gone, or they are older than a day) are removed first.
* load: ``safetensors.numpy.load_file``; a missing file raises
  FileNotFoundError and an unreadable one CheckpointError, both naming the
  path; with ``expected`` (name -> shape) every missing tensor, wrongly
  shaped tensor and (in strict mode) unexpected tensor is reported in one
  CheckpointError.
* into a Func (``to_param_dtype``, used by load_params and Trainer.load_state_dict):
  a tensor whose dtype differs from its param's declared dtype is converted to
  it; if that changes any value (float64 -> float32 rounding, an integer above
  2**24, an overflow) a LossyConversionWarning names the tensor.  Saving never
  converts: every tensor keeps its dtype (float64, int32, ...).
"""
from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Mapping

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file
from safetensors.numpy import save as _serialize

__all__ = ["CheckpointError", "LossyConversionWarning", "save_tensors", "load_tensors",
           "read_metadata", "to_param_dtype"]


class CheckpointError(ValueError):
    """A checkpoint file is unreadable or does not match what was expected."""


class LossyConversionWarning(UserWarning):
    """A loaded tensor changed value when converted to its param's declared dtype."""


def to_param_dtype(where: str, name: str, arr, dtype) -> np.ndarray:
    """`arr` converted to `dtype` (a param's declared NumPy dtype); warns with
    LossyConversionWarning, naming `name`, when the conversion changes a value."""
    a = np.asarray(arr)
    dt = np.dtype(dtype)
    if a.dtype == dt:
        return a
    if a.dtype.kind not in "biuf":
        raise CheckpointError(f"{where}: tensor {name!r} has dtype {a.dtype}; param "
                              f"{name!r} is {dt}")
    with np.errstate(all="ignore"):
        out = a.astype(dt)
        back = out.astype(a.dtype)
    same = back == a
    if a.dtype.kind == "f":
        same |= np.isnan(a) & np.isnan(back)
    if not np.all(same):
        i = int(np.argmin(same.reshape(-1)))
        warnings.warn(f"{where}: tensor {name!r} converted from {a.dtype} to the param's "
                      f"{dt} changes values (e.g. {a.reshape(-1)[i].item()!r} -> "
                      f"{out.reshape(-1)[i].item()!r})", LossyConversionWarning, stacklevel=3)
    return out


def save_tensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray],
                 metadata: Mapping[str, str] | None = None) -> None:
    """Atomically write ``tensors`` (and optional string ``metadata``) to ``path``."""
    path = os.fspath(path)
    if not isinstance(tensors, Mapping):
        raise TypeError(f"save_tensors({path!r}): tensors must be a dict of "
                        f"name -> numpy array, got {type(tensors).__name__}")
    arrays: dict[str, np.ndarray] = {}
    for name, arr in tensors.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"save_tensors({path!r}): tensor names must be "
                            f"non-empty strings, got {name!r}")
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"save_tensors({path!r}): tensor {name!r} must be a "
                            f"numpy array, got {type(arr).__name__}")
        arrays[name] = np.ascontiguousarray(arr)
    meta = None
    if metadata is not None:
        meta = {}
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"save_tensors({path!r}): metadata must map str to "
                                f"str, got {k!r}: {v!r}")
            meta[k] = v
    try:
        data = _serialize(arrays, metadata=meta)
    except (SafetensorError, ValueError, TypeError) as exc:
        raise CheckpointError(f"cannot serialize checkpoint {path!r}: {exc}") from exc

    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    _remove_stale_temps(directory, base)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{base}.p{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _remove_stale_temps(directory: str, base: str) -> None:
    """Remove `.BASE.*.tmp` files that saves killed mid-write left behind (of a process
    that is gone, or older than a day: rlxc.cache.remove_stale)."""
    from rlxc.cache import remove_stale

    prefix = f".{base}."
    remove_stale(directory, lambda n: n.startswith(prefix) and n.endswith(".tmp"))


def load_tensors(path: str | os.PathLike,
                 expected: Mapping[str, tuple[int, ...]] | None = None,
                 strict: bool = True) -> dict[str, np.ndarray]:
    """Read every tensor of ``path``; optionally check names and shapes.

    With ``expected`` (name -> shape), a missing or wrongly shaped tensor is
    an error; a tensor not in ``expected`` is an error when ``strict`` and is
    left out of the result otherwise.
    """
    path = os.fspath(path)
    tensors = _read(path)
    if expected is None:
        return tensors
    want = {name: tuple(int(d) for d in shape) for name, shape in expected.items()}
    problems = []
    missing = [n for n in want if n not in tensors]
    if missing:
        problems.append(f"missing tensor(s) {missing}")
    for name, shape in want.items():
        if name in tensors and tensors[name].shape != shape:
            problems.append(f"tensor {name!r} expected shape {shape}, "
                            f"got {tensors[name].shape}")
    extra = sorted(n for n in tensors if n not in want)
    if extra and strict:
        problems.append(f"unexpected tensor(s) {extra} (pass strict=False to ignore)")
    if problems:
        raise CheckpointError(f"checkpoint {path!r} does not match: "
                              + "; ".join(problems))
    return {name: tensors[name] for name in want}


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The string metadata stored in the file header ({} if none)."""
    path = os.fspath(path)
    _check_exists(path)
    try:
        with safe_open(path, framework="np") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path!r}: {exc}") from exc


def _check_exists(path: str) -> None:
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint not found: {path!r}")


def _read(path: str) -> dict[str, np.ndarray]:
    _check_exists(path)
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path!r} (not a valid "
                              f"safetensors file?): {exc}") from exc
