"""`rlxc.nn` convolution block: a plain function of a scope that declares its params.

    y = conv2d(scope, "c1", x, out_ch=16, kernel=3, padding="same")
        declares params  c1_w (16, C/groups, 3, 3)  and  c1_b (16,)
        returns          x.conv2d(c1_w, c1_b, ...)

No module system: the params are ordinary `scope.param`s, named `<name>_w` and
`<name>_b`, so checkpoints, optimizers and `Func.params()` see them like any other.
`he_init(func)` binds every `*_w` param of such blocks with He-normal values
(std = sqrt(2 / fan_in), fan_in = C/groups * kH * kW) and every `*_b` to zeros.
"""
from __future__ import annotations

import numpy as np

from rlxc.dialect.shapes import ShapeError, as_int


def conv2d(scope, name: str, x, out_ch: int, kernel, stride=1, padding=0, dilation=1,
           groups: int = 1, bias: bool = True):
    """A conv2d layer on NCHW `x` with params `<name>_w` (and `<name>_b`)."""
    if x.ndim != 4:
        raise ShapeError(f"nn.conv2d {name!r}: input must be NCHW (rank 4), got {x.shape}")
    kh, kw = (kernel, kernel) if not isinstance(kernel, (tuple, list)) else tuple(kernel)
    groups = as_int(groups, f"nn.conv2d {name!r}", "groups")
    if x.shape[1] % groups:
        raise ShapeError(f"nn.conv2d {name!r}: {x.shape[1]} input channels do not split into "
                         f"groups={groups}")
    w = scope.param(f"{name}_w", (out_ch, x.shape[1] // groups, kh, kw))
    b = scope.param(f"{name}_b", (out_ch,)) if bias else None
    return x.conv2d(w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)


def he_init(func, seed: int = 0):
    """`func` with He-normal `*_w` of rank 2 or 4 (fan_in: dim 0 of a (in, out) linear
    weight, C/groups*kH*kW of a conv weight) and zero `*_b`; other params untouched."""
    rng = np.random.default_rng(seed)
    out = {}
    for n in func.param_names():
        shp = func.param_shape_of(n)
        if n.endswith("_b"):
            out[n] = np.zeros(shp, np.float32)
        elif n.endswith("_w") and len(shp) in (2, 4):
            fan_in = shp[0] if len(shp) == 2 else int(np.prod(shp[1:]))
            out[n] = (rng.standard_normal(shp) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return func.with_params(out)


__all__ = ["conv2d", "he_init"]
