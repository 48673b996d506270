"""NumPy indexing of traced Tensors: `x[key]`, `x.take`, `x.flip`, as rlx ops.

    key: ints, slices (any step), None, ..., int arrays / lists / index Tensors,
         static bool masks (NumPy arrays)
      │ 1. normalise: expand `...`; a bool mask becomes its nonzero() int arrays
      │    (static only: a traced mask would give a data-dependent shape)
      │ 2. None: a size-1 axis inserted by one rlx.reshape (then a full slice of it)
      │ 3. slices: one rlx.slice for all of them; a negative step slices the same
      │    elements forwards and flips that axis (a gather with a constant
      │    reversed index); plain ints (no array in the key) are width-1 slices
      │    whose axes a reshape drops
      │ 4. arrays (and ints next to arrays, as NumPy treats them): broadcast
      │    together; negatives count from the end (constants wrapped here, runtime
      │    ones by where(i < 0, i + n, i)); the indexed axes are merged into one
      │    (moved to the front first when they are not adjacent) and ONE rlx.gather
      │    along it takes the elements (its VJP is scatter_add, which accumulates
      │    repeated indices)
      ▼
    NumPy's result shape: the broadcast index shape replaces the indexed axes
    where they were adjacent, and goes first otherwise.

Range checks: constant indices are checked here (IndexError, NumPy's wording);
runtime ones by the gather's check at run time. With several runtime index
arrays each is checked by its own gather from a constant stride table
(arange(n) * stride, labelled with its axis), whose sum is the flat index.
Every gather carries a label naming the user's indexing, which index errors
quote, also when they come from the backward's scatter_add.
"""
from __future__ import annotations

import numpy as np

from rlxc.dialect.shapes import INT_DTYPES, ShapeError, broadcast_shapes, numel


def _label(shape, axes) -> str:
    which = f"axis {axes[0]}" if len(axes) == 1 else f"axes {tuple(axes)}"
    return f"x[...] with x of shape {tuple(shape)}, index array on {which}"


def _mask_error():
    return TypeError(
        "x[mask]: a boolean mask Tensor gives a result whose shape depends on the mask's "
        "runtime values, which a compiled graph cannot have. Index with a static mask (a "
        "NumPy bool array), or keep the shape: where(mask, x, 0), (x * mask).sum()")


def _constant_value(t):
    """The array of a Tensor made by scope.constant (a static mask), else None."""
    for e in reversed(t.scope.trace.events):
        if getattr(e, "results", None) and e.results[0] is t.value:
            if e.op != "rlx.constant":
                return None
            shape, _, raw = e.data
            flat = np.frombuffer(raw, np.int8).astype(np.bool_)
            return np.broadcast_to(flat, shape) if flat.size == 1 else flat.reshape(shape)
    return None


def _normalize(x, key):
    """The key as a list of ("int", k) | ("slice", s) | ("none",) | ("arr", array or Tensor),
    one entry per dim of x (None entries extra), `...` expanded and masks made int arrays."""
    from rlxc.tensor import Tensor

    if not isinstance(key, tuple):
        key = (key,)
    items = []
    for k in key:
        if k is None or k is Ellipsis or isinstance(k, slice):
            items.append(("none",) if k is None else ("ell",) if k is Ellipsis else ("slice", k))
        elif isinstance(k, (bool, np.bool_)):
            raise TypeError("index: a Python bool is not a valid index (use a bool array mask)")
        elif isinstance(k, (int, np.integer)):
            items.append(("int", int(k)))
        elif isinstance(k, Tensor):
            if k.scope is not x.scope:
                raise ValueError("index: the index Tensor comes from another traced function")
            if k.dtype == "i1":
                m = _constant_value(k)
                if m is None:
                    raise _mask_error()
                items.append(("mask", m))
                continue
            if k.dtype not in INT_DTYPES:
                raise TypeError(f"index: index Tensors must be integer (i32/i64), got {k.dtype}")
            items.append(("arr", k))
        elif isinstance(k, (np.ndarray, list, tuple)):
            a = np.asarray(k)
            if a.dtype == np.bool_:
                items.append(("mask", a))
            elif a.size == 0 and a.dtype.kind == "f":
                items.append(("arr", a.astype(np.int64)))
            elif a.dtype.kind in "iu":
                items.append(("arr", a.astype(np.int64)))
            else:
                raise TypeError(f"index: arrays used as indices must be integer or bool, "
                                f"got {a.dtype}")
        else:
            raise TypeError(f"index: unsupported key {k!r} (ints, slices, None, ..., integer "
                            f"arrays or Tensors, bool NumPy masks)")
    if sum(1 for it in items if it[0] == "ell") > 1:
        raise IndexError("index: an index can only have a single ellipsis ('...')")
    used = sum(it[1].ndim if it[0] == "mask" else 0 if it[0] in ("none", "ell") else 1
               for it in items)
    if used > x.ndim:
        raise IndexError(f"index: too many indices for a tensor of shape {x.shape}: "
                         f"{used} were indexed")
    out, dim = [], 0
    for it in items:
        if it[0] == "ell":
            n = x.ndim - used
            out += [("slice", slice(None))] * n
            dim += n
        elif it[0] == "mask":
            m = it[1]
            if m.shape != x.shape[dim:dim + m.ndim]:
                raise IndexError(f"index: boolean mask of shape {m.shape} does not match the "
                                 f"indexed dims {x.shape[dim:dim + m.ndim]} of {x.shape}")
            out += [("arr", a.astype(np.int64)) for a in np.nonzero(m)] if m.ndim else \
                [("zmask", bool(m))]
            dim += m.ndim
        else:
            out.append(it)
            dim += it[0] != "none"
    return out


def getitem(x, key):
    """x[key] with NumPy's semantics (see the module docstring)."""
    items = _normalize(x, key)
    if any(it[0] == "zmask" for it in items):
        raise TypeError("index: a 0-d boolean mask is not supported")
    # 2. None -> a new size-1 axis
    if any(it[0] == "none" for it in items):
        shape, dim = [], 0
        for it in items:
            if it[0] == "none":
                shape.append(1)
            else:
                shape.append(x.shape[dim])
                dim += 1
        shape += list(x.shape[dim:])
        x = x.reshape(tuple(shape))
        items = [("slice", slice(None)) if it[0] == "none" else it for it in items]
    items += [("slice", slice(None))] * (x.ndim - len(items))
    advanced = any(it[0] == "arr" for it in items)
    if advanced:  # ints next to arrays are advanced indices too (NumPy)
        items = [("arr", np.asarray(it[1], np.int64)) if it[0] == "int" else it for it in items]
    for ax, (it, d) in enumerate(zip(items, x.shape)):
        if isinstance(d, str) and it[0] in ("int", "arr"):
            _dynamic_axis(ax, d)
    # 3. slices and basic ints
    starts, limits, strides, flips, drop = [], [], [], [], []
    for ax, (it, d) in enumerate(zip(items, x.shape)):
        if it[0] == "int":
            k = it[1]
            if not -d <= k < d:
                raise IndexError(f"index {k} is out of bounds for axis {ax} with size {d}")
            k %= d
            starts.append(k), limits.append(k + 1), strides.append(1)
            drop.append(ax)
        elif it[0] == "slice" and isinstance(d, str):   # a dynamic dim: whole slices only
            sl = it[1]
            if sl.start not in (None, 0) or sl.stop is not None or sl.step not in (None, 1):
                raise ShapeError(f"index {sl} on axis {ax}: dimension {d!r} is dynamic; "
                                 "it is only sliced whole ([:])")
            starts.append(0), limits.append(d), strides.append(1)
        elif it[0] == "slice":
            s, l, st = it[1].indices(d)
            n = len(range(s, l, st))
            if st > 0 or n == 0:
                st = abs(st)
                s = min(s, d) if n else 0
                starts.append(s), limits.append(s + (n - 1) * st + 1 if n else s)
                strides.append(st)
            else:  # the same elements forwards, then flipped
                lo = s + (n - 1) * st
                starts.append(lo), limits.append(s + 1), strides.append(-st)
                if n > 1:
                    flips.append(ax)
        else:
            starts.append(0), limits.append(d), strides.append(1)
    if (tuple(starts), tuple(limits), tuple(strides)) != ((0,) * x.ndim, x.shape,
                                                           (1,) * x.ndim):
        x = x.slice(starts, limits, strides)
    for ax in flips:
        x = flip(x, ax)
    if not advanced:
        return x.reshape(tuple(d for ax, d in enumerate(x.shape) if ax not in drop))
    return _advanced(x, items)


def _advanced(x, items):
    """Step 4: the arrays of `items` (one entry per dim of x) index x; slices are done."""
    from rlxc.tensor import Tensor, where

    shape0 = x.shape
    pos = [ax for ax, it in enumerate(items) if it[0] == "arr"]
    orig = list(pos)
    idx = [items[ax][1] for ax in pos]
    B = ()
    for a in idx:
        B = broadcast_shapes(B, a.shape, "index arrays")
    dims = [x.shape[ax] for ax in pos]
    if pos != list(range(pos[0], pos[0] + len(pos))):  # not adjacent: indexed axes first
        rest = [ax for ax in range(x.ndim) if ax not in pos]
        x = x.transpose(tuple(pos) + tuple(rest))
        pos = list(range(len(pos)))
    a0 = pos[0]
    total = numel(dims)
    runtime = [a for a in idx if isinstance(a, Tensor)]
    dt = "i64" if total >= 2 ** 31 or any(a.dtype == "i64" for a in runtime) else "i32"
    npdt = np.int64 if dt == "i64" else np.int32
    strides = [numel(dims[k + 1:]) for k in range(len(dims))]
    const = np.zeros((), np.int64)   # the constant arrays' part (static shapes; B may hold
    terms = []                       # a symbol when an index Tensor has one)
    for a, d, st, axis in zip(idx, dims, strides, orig):
        if not isinstance(a, Tensor):
            bad = (a < -d) | (a >= d)
            if bad.any():
                v = int(a[bad].reshape(-1)[0])
                raise IndexError(f"index {v} is out of bounds for axis {axis} with size {d}")
            const = const + np.where(a < 0, a + d, a) * st
            continue
        a = a.cast(dt)
        a = where(a < 0, a + d, a)  # negative indices count from the end
        if len(dims) > 1:  # checked by its own gather from a stride table
            table = x.scope.constant(np.arange(d, dtype=np.int64) * st, dt)
            a = table.gather_raw(a, 0, _label(shape0, [axis]))
        terms.append(a.broadcast_to(B))
    flat = None
    if terms:
        flat = terms[0]
        for t in terms[1:]:
            flat = flat + t
        if const.any():
            flat = flat + x.scope.constant(const.astype(npdt), dt)
    else:
        flat = x.scope.constant(np.broadcast_to(const, B).astype(npdt), dt)
    x = x.reshape(x.shape[:a0] + (total,) + x.shape[a0 + len(dims):])
    return x.gather_raw(flat, a0, _label(shape0, orig))


def take(x, indices, axis: int = 0):
    """np.take: slices along `axis` at integer `indices`; negative indices count from the
    end; out-of-range ones raise (IndexError, at trace time for constants)."""
    from rlxc.dialect.shapes import normalize_axes
    from rlxc.tensor import Tensor

    axis = normalize_axes(axis, x.ndim, "gather")[0]
    if isinstance(x.shape[axis], str):
        _dynamic_axis(axis, x.shape[axis])
    items = [("slice", slice(None))] * x.ndim
    if isinstance(indices, Tensor):
        if indices.scope is not x.scope:
            raise ValueError("gather: the indices come from another traced function")
        if indices.dtype not in INT_DTYPES:
            raise TypeError(f"gather: indices must be i32 or i64, got {indices.dtype}")
    else:
        a = np.asarray(indices)
        if a.dtype.kind not in "iu":
            raise TypeError(f"gather: indices must be integers, got {a.dtype}")
        indices = a.astype(np.int64)
    items[axis] = ("arr", indices)
    return _advanced(x, items)


def flip(x, axis=None):
    """np.flip: reverse the order of elements along `axis` (all axes when None); a gather
    with a constant reversed index per axis."""
    from rlxc.dialect.shapes import normalize_axes

    for ax in normalize_axes(axis, x.ndim, "flip"):
        n = x.shape[ax]
        if isinstance(n, str):
            _dynamic_axis(ax, n)
        if n > 1:
            dt = "i64" if n >= 2 ** 31 else "i32"
            rev = x.scope.constant(np.arange(n - 1, -1, -1, dtype=np.int64), dt)
            x = x.gather_raw(rev, ax, f"flip of a {x.shape} tensor on axis {ax}")
    return x


__all__ = ["getitem", "take", "flip", "ShapeError"]


def _dynamic_axis(ax: int, d: str):
    raise ShapeError(f"index on axis {ax}: dimension {d!r} is dynamic; integer and array "
                     "indices (which may count from the end) need a static axis; use "
                     f"gather() with indices in [0, {d})")
