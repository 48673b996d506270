"""Randomness without state: draws are pure functions of a u32 key and a position.

    key: u32 tensor of shape (2,) (an input, so each call can pass a new one)
      │ k0 = key[0], k1 = key[1]  broadcast to the draw's shape (views, no copies)
      │ ctr = the element's row-major linear index (sum of iota * stride, i32; with a
      │       dynamic dim, Horner over rlx.iota, which specializes to the same constant)
      ▼
    rlx.philox(k0, k1, ctr) {word, stream}      Philox-4x32-10, counter (ctr, stream, 0, 0)
      │ uniform   word 0 -> (bits >> 8) * 2**-24, in [0, 1) (24 random bits)
      │ normal    Box-Muller on words 0 and 1: sqrt(-2 log(1 - u0)) * cos(2 pi u1)
      ▼ dropout   keep = uniform >= p; where(keep, x / (1 - p), 0)

The generator is Philox-4x32-10 (Salmon et al., SC'11; Random123's philox4x32_10):
the same key and shape give the same bits on the CPU, the GPU and the
interpreter (one NumPy rule, dialect/philox.py; one LLVM rule,
lowering/shared/philox.py).  Nothing is stateful: the same key gives the same
draw, so pass a new key per step (or a different `stream`, counter word 1, for
independent draws inside one function, e.g. one per dropout layer).  Under
vmap each key of a batch of keys gives exactly its unbatched draw.  The
gradient through dropout recomputes the same mask (it is a function of the key).
"""
from __future__ import annotations

import numpy as np

from rlxc.dialect.shapes import FLOAT_DTYPES, ShapeError, TType, as_int
from rlxc.dialect.symdims import describe, is_dynamic, user_dims

_TWO_PI = float(2 * np.pi)


def _key(key, scope=None):
    from rlxc.tensor import Tensor

    if not isinstance(key, Tensor):
        if scope is None:
            raise TypeError("rlxc.random: key must be a u32 Tensor of shape (2,) "
                            "(s.input('key', (2,), 'u32'))")
        a = np.asarray(key)
        if a.dtype.kind not in "iu" or a.shape != (2,) or a.min() < 0 or a.max() > 0xFFFFFFFF:
            raise TypeError(f"rlxc.random: key must be two u32 values, got {a!r}")
        key = scope.constant(a.astype(np.uint32), "u32")
    if key.dtype != "u32" or key.shape != (2,):
        raise TypeError(f"rlxc.random: key must be a u32 tensor of shape (2,), got "
                        f"{key.dtype} {key.shape}")
    return key


def _stream(stream) -> int:
    s = as_int(stream, "rlxc.random", "stream")
    if not 0 <= s < 2 ** 32:
        raise ValueError(f"rlxc.random: stream {s} not in [0, 2**32)")
    return s


def _draw_shape(shape, scope):
    """A draw's shape: ints and symbols (dynamic dims) of the function's inputs."""
    dims = user_dims(shape, "rlxc.random", new=lambda: None)
    if None in dims:
        raise ShapeError(f"rlxc.random: shape {tuple(shape)}: None is not a dimension of a "
                         "draw (use the symbol of an input's dynamic dimension)")
    known = {d for a in scope.trace.args for d in a.shape if isinstance(d, str)}
    for d in dims:
        if isinstance(d, str) and d not in known:
            raise ShapeError(f"rlxc.random: shape {dims}: {describe(d)} is not a dimension of "
                             "any input, so no call gives its size")
        if not isinstance(d, str) and d < 0:
            raise ShapeError(f"rlxc.random: shape {dims} has a negative dimension")
    return dims


def iota(scope, dim):
    """A traced (dim,) i32 Tensor 0..dim-1: a constant for a static dim, rlx.iota
    (dialect/iota.py) for a symbol."""
    from rlxc.tensor import Tensor

    if not isinstance(dim, str):
        return scope.constant(np.arange(int(dim)), "i32")
    (v,) = scope.trace.add("rlx.iota", [], {"size": dim}, [TType((dim,), "i32")])
    return Tensor(scope, v)


def _dynamic_counter(scope, shape):
    """The row-major linear index when some dims are symbols: Horner over the axes,
    ctr = ctr * dim + iota(dim) laid along its axis; a symbolic dim's iota is rlx.iota
    (dialect/iota.py) and its size as a tensor is that iota's max + 1 (sizes are >= 1)."""
    ctr = None
    for ax, d in enumerate(shape):
        view = [1] * len(shape)
        view[ax] = d
        io = iota(scope, d)
        t = io.reshape(tuple(view)).broadcast_to(shape)
        if ctr is None:
            ctr = t
        else:
            size = io.max() + 1 if isinstance(d, str) else d
            ctr = ctr * size + t
    return ctr


def _counter(scope, shape):
    """The row-major linear index of every element (i32), from small broadcast iotas."""
    if is_dynamic(shape):
        return _dynamic_counter(scope, shape)
    n = 1
    for d in shape:
        n *= d
    if n >= 2 ** 31:
        raise ShapeError(f"rlxc.random: a draw of shape {shape} has {n} elements; at most "
                         "2**31 - 1 per draw (split it and use `stream`)")
    ctr, stride = None, 1
    for ax in reversed(range(len(shape))):
        view = [1] * len(shape)
        view[ax] = shape[ax]
        t = scope.constant((np.arange(shape[ax]) * stride).reshape(view), "i32").broadcast_to(shape)
        ctr = t if ctr is None else ctr + t
        stride *= shape[ax]
    return ctr if ctr is not None else scope.constant(np.int32(0), "i32")


def _unit(key, shape, word: int, stream: int, scope=None):
    key = _key(key, scope)
    s = key.scope
    shape = _draw_shape(shape, s)
    k0 = key.slice([0], [1]).reshape(()).broadcast_to(shape)
    k1 = key.slice([1], [2]).reshape(()).broadcast_to(shape)
    return s.emit("rlx.philox", [k0, k1, _counter(s, shape)], word=word, stream=stream)


def _float(dtype: str) -> str:
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"rlxc.random: dtype must be f32 or f64, got {dtype!r}")
    return dtype


def uniform(key, shape=(), dtype: str = "f32", minval=0.0, maxval=1.0, stream: int = 0):
    """Uniform draws in [minval, maxval) of `shape` (jax.random.uniform's arguments)."""
    u = _unit(key, shape, 0, _stream(stream)).cast(_float(dtype))
    if (minval, maxval) != (0.0, 1.0):
        lo, hi = float(minval), float(maxval)
        u = u * (hi - lo) + lo
        npdt = np.float32 if _float(dtype) == "f32" else np.float64
        if npdt(hi) > npdt(lo):   # u * (hi - lo) + lo can round up to hi: [lo, hi)
            u = u.minimum(float(np.nextafter(npdt(hi), npdt(lo))))
    return u


def normal(key, shape=(), dtype: str = "f32", stream: int = 0):
    """Standard normal draws of `shape` (Box-Muller on two uniforms of one block)."""
    st = _stream(stream)
    u0 = _unit(key, shape, 0, st)
    u1 = _unit(key, shape, 1, st)
    z = ((1.0 - u0).log() * -2.0).sqrt() * (u1 * _TWO_PI).cos()
    return z.cast(_float(dtype))


def bernoulli(key, p: float, shape=(), stream: int = 0):
    """i1 draws that are True with probability p."""
    return _unit(key, shape, 0, _stream(stream)) < float(p)


def dropout(x, p: float, key, stream: int = 0):
    """Zero each element with probability p, scale the rest by 1/(1-p) (inverted dropout,
    torch.nn.functional.dropout in training); p = 1 gives zeros."""
    from rlxc.tensor import where

    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"dropout: expects a float tensor, got {x.dtype}")
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: probability p = {p} not in [0, 1]")
    if p == 0.0:
        return x
    keep = _unit(key, x.shape, 0, _stream(stream), x.scope) >= p
    scale = 1.0 / (1.0 - p) if p < 1.0 else 0.0
    return where(keep, x * scale, 0.0)


__all__ = ["uniform", "normal", "bernoulli", "dropout"]
