"""Low-precision float formats: names, exact round-to-nearest-even, scaling.

Purpose
-------
Mixed-precision training and quantized inference round float32 values onto
the grid of a narrower float format (f16, bf16, fp8, fp6, fp4) and keep the
result in float32 ("fake quantization").  This module is the NumPy reference
for that rounding; compiled code must produce the same bits.

A format is described by a triple ``(exp_bits, man_bits, max_normal)``:

* ``exp_bits`` (E >= 1): exponent field width; bias = 2**(E-1) - 1, so the
  smallest normal exponent is ``emin = 1 - bias``.
* ``man_bits`` (M >= 0): stored mantissa bits; a normal number has M+1
  significant bits, and subnormals below 2**emin have spacing 2**(emin - M).
* ``max_normal``: the largest finite value.  It is given explicitly because
  it depends on how the format spends its top exponent code.

Named formats (OCP 8-bit floats, OCP MX element formats, IEEE half, bfloat16)
match ``ml_dtypes`` bit for bit on every float32 input inside the range:

  =========  ==========================================  ==========  ==============
  format     names                                       max         ml_dtypes type
  =========  ==========================================  ==========  ==============
  f16        f16 fp16 float16 half                       65504       float16
  bf16       bf16 bfloat16                               3.3895e38   bfloat16
  e4m3fn     f8e4m3 e4m3 e4m3fn fp8 f8 fp8_e4m3          448         float8_e4m3fn
  e5m2       f8e5m2 e5m2 bf8 fp8_e5m2                    57344       float8_e5m2
  e3m2fn     f6e3m2 e3m2 e3m2fn fp6_e3m2                 28          float6_e3m2fn
  e2m3fn     f6e2m3 e2m3 e2m3fn fp6_e2m3                 7.5         float6_e2m3fn
  e2m1fn     f4e2m1 e2m1 e2m1fn fp4 f4 nvf4 mxfp4        6           float4_e2m1fn
  =========  ==========================================  ==========  ==============

  (``fn`` = finite: no inf.)  f16, bf16 and e5m2 are IEEE-like: the top
  exponent is inf/NaN, so ``max_normal = (2 - 2**-M) * 2**bias``.  The "fn"
  formats use the top exponent for numbers: E4M3FN keeps only the all-ones
  code as NaN (max 1.75 * 2**8 = 448; the IEEE rule would give 240), and the
  MX element formats E3M2, E2M3 and E2M1 have no inf/NaN at all (all 64 or
  16 codes finite: max 28, 7.5 and 6, where the IEEE rule gives 14, 3.75 and
  3).  ``mxfp4`` names the MX element format only: the shared E8M0 block
  scale of MX is not applied (``quantize_scaled`` scales per tensor).

  Out of range, every format here *saturates*: a magnitude at or above
  max_normal, and +-inf, become +-max_normal (OCP's saturating conversion).
  That is where they differ from ml_dtypes: its float16 / bfloat16 /
  float8_e5m2 casts round values past the last midpoint (65520, ~3.4e38,
  61440) and inf to inf, and its fn types map NaN to their NaN (or, with no
  NaN code, to -0); here NaN passes through as NaN.

Generic names keep RLX's IEEE-like rule: ``fXeZmY`` or ``fXmYeZ`` (X total
bits, Z exponent, Y mantissa, ``1 + Z + Y == X``) get the IEEE-like
``max_normal`` above.  A named format wins over the generic rule, so
``f8e4m3`` is OCP E4M3FN (448) while the generic ``f8m3e4`` is IEEE-like
(240, like ``ml_dtypes.float8_e4m3``); likewise ``f6e2m3`` is 7.5 but
``f6m3e2`` is 3.75.

Algorithm (``quantize``)
------------------------
Exact, vectorized, in float64 (every float32 input and every grid point of a
format with E <= 8, M <= 23 is exactly representable there):

1. ``k = frexp(x).exponent`` so that 2**(k-1) <= |x| < 2**k; the unit exponent
   is ``ex = max(k - 1, emin)`` (clamping gives the subnormal spacing).
2. ``r = ldexp(rint(ldexp(x, M - ex)), ex - M)``: scaling by a power of two is
   exact, and ``rint`` rounds half to even, so this is a single correct
   round-to-nearest-even onto the grid (a carry into the next binade, e.g.
   1.96 -> 2.0, is naturally right).
3. Saturate: clip to ``[-max_normal, max_normal]`` (this also maps +-inf to
   +-max_normal).  NaN passes through; zero keeps its sign, and values that
   round to zero keep the sign of the input (as hardware casts do).
4. Cast to float32 (exact).
"""
from __future__ import annotations

import re
from typing import Callable

import numpy as np

__all__ = [
    "BUILTIN_FORMATS",
    "parse_format",
    "quantize",
    "quantize_scaled",
    "quantize_named",
]

Format = tuple[int, int, float]

# name -> (exp_bits, man_bits, max_normal).  Aliases share one entry each.
_F16: Format = (5, 10, 65504.0)
_BF16: Format = (8, 7, 3.3895314e38)
_E4M3FN: Format = (4, 3, 448.0)
_E5M2: Format = (5, 2, 57344.0)
_E3M2FN: Format = (3, 2, 28.0)
_E2M3FN: Format = (2, 3, 7.5)
_E2M1FN: Format = (2, 1, 6.0)

BUILTIN_FORMATS: dict[str, Format] = {
    "f16": _F16, "fp16": _F16, "float16": _F16, "half": _F16,
    "bf16": _BF16, "bfloat16": _BF16,
    "f8e4m3": _E4M3FN, "e4m3": _E4M3FN, "e4m3fn": _E4M3FN, "fp8": _E4M3FN, "f8": _E4M3FN,
    "fp8_e4m3": _E4M3FN,
    "f8e5m2": _E5M2, "e5m2": _E5M2, "bf8": _E5M2, "fp8_e5m2": _E5M2,
    "f6e3m2": _E3M2FN, "e3m2": _E3M2FN, "e3m2fn": _E3M2FN, "fp6_e3m2": _E3M2FN,
    "f6e2m3": _E2M3FN, "e2m3": _E2M3FN, "e2m3fn": _E2M3FN, "fp6_e2m3": _E2M3FN,
    "f4e2m1": _E2M1FN, "e2m1": _E2M1FN, "e2m1fn": _E2M1FN, "fp4": _E2M1FN, "f4": _E2M1FN,
    "nvf4": _E2M1FN, "mxfp4": _E2M1FN,
}

# Generic names: total bits, then exponent and mantissa widths in either order.
_GENERIC_EM = re.compile(r"f(\d+)e(\d+)m(\d+)")
_GENERIC_ME = re.compile(r"f(\d+)m(\d+)e(\d+)")

# quantize works on float64 and returns float32, so a format must fit in f32.
_MAX_EXP_BITS = 8
_MAX_MAN_BITS = 23
_F32_MAX = float(np.finfo(np.float32).max)


def ieee_max_normal(exp_bits: int, man_bits: int) -> float:
    """Largest finite value of an IEEE-like format (top exponent = inf/NaN)."""
    bias = 2 ** (exp_bits - 1) - 1
    return float((2.0 - 2.0 ** -man_bits) * 2.0 ** bias)


def parse_format(spec: str) -> Format | None:
    """Return ``(exp_bits, man_bits, max_normal)`` for a format name, or None.

    The name is trimmed and lowercased.  Builtin names are looked up first
    (see ``BUILTIN_FORMATS`` and the module docstring: OCP/MX formats, f16,
    bf16); otherwise a generic ``fXeZmY`` or ``fXmYeZ``
    name (X total bits, Z exponent bits, Y mantissa bits) is accepted when
    ``1 + Y + Z == X``, ``1 <= Z <= 8`` and ``Y <= 23``, with the IEEE-like
    maximum ``(2 - 2**-Y) * 2**(2**(Z-1) - 1)``.  Anything else is None.
    """
    if not isinstance(spec, str):
        return None
    name = spec.strip().lower()
    if name in BUILTIN_FORMATS:
        return BUILTIN_FORMATS[name]
    match = _GENERIC_EM.fullmatch(name)
    if match:
        total, exp_bits, man_bits = (int(g) for g in match.groups())
    else:
        match = _GENERIC_ME.fullmatch(name)
        if not match:
            return None
        total, man_bits, exp_bits = (int(g) for g in match.groups())
    if total != 1 + exp_bits + man_bits:
        return None
    if not (1 <= exp_bits <= _MAX_EXP_BITS and man_bits <= _MAX_MAN_BITS):
        return None
    return (exp_bits, man_bits, ieee_max_normal(exp_bits, man_bits))


def _check_format(exp_bits: int, man_bits: int, max_normal: float) -> None:
    if not (isinstance(exp_bits, (int, np.integer))
            and 1 <= exp_bits <= _MAX_EXP_BITS):
        raise ValueError(
            f"exp_bits must be an integer in [1, {_MAX_EXP_BITS}], got {exp_bits!r}")
    if not (isinstance(man_bits, (int, np.integer))
            and 0 <= man_bits <= _MAX_MAN_BITS):
        raise ValueError(
            f"man_bits must be an integer in [0, {_MAX_MAN_BITS}], got {man_bits!r}")
    if not (0 < max_normal <= _F32_MAX):
        raise ValueError(
            f"max_normal must be in (0, float32 max], got {max_normal!r}")


def quantize(array, exp_bits: int, man_bits: int, max_normal: float) -> np.ndarray:
    """Round ``array`` to the nearest value of the format, ties to even.

    Subnormals are produced below 2**(1 - bias); values whose magnitude is at
    least ``max_normal`` (including inf) saturate to +-max_normal; NaN and
    signed zeros pass through.  Returns a new float32 array of the same shape.
    """
    _check_format(exp_bits, man_bits, max_normal)
    x = np.asarray(array, dtype=np.float64)
    emin = 2 - 2 ** (exp_bits - 1)          # 1 - bias
    # Saturate at max_normal as float32 (exact for every builtin; it snaps a
    # decimal constant such as bf16's 3.3895314e38 onto its grid point).
    limit = float(np.float32(max_normal))
    with np.errstate(invalid="ignore", over="ignore"):
        _, k = np.frexp(x)
        ex = np.maximum(k - 1, emin)
        shift = man_bits - ex
        r = np.ldexp(np.rint(np.ldexp(x, shift)), -shift)
        r = np.clip(r, -limit, limit)
        r = np.where(np.isnan(x), x, r)
    return r.astype(np.float32)


def quantize_scaled(array, exp_bits: int, man_bits: int,
                    max_normal: float) -> np.ndarray:
    """Per-tensor scaled quantization; returns the dequantized float32 array.

    ``scale = absmax / max_normal`` (absmax over the finite entries), then
    ``quantize(x / scale) * scale``, all in float64 with one final rounding to
    float32.  The largest magnitude thus maps onto max_normal and the format's
    dynamic range is used fully.  If absmax is 0 (or there is no finite
    entry) the input is returned unchanged as float32.  +-inf saturates to
    +-absmax; NaN passes through.
    """
    _check_format(exp_bits, man_bits, max_normal)
    x = np.asarray(array, dtype=np.float64)
    finite = np.abs(x[np.isfinite(x)])
    absmax = float(finite.max()) if finite.size else 0.0
    if absmax == 0.0:
        return x.astype(np.float32)
    scale = absmax / max_normal
    q = quantize(x / scale, exp_bits, man_bits, max_normal).astype(np.float64)
    return (q * scale).astype(np.float32)


QuantFn = Callable[[str, np.ndarray], np.ndarray]


def quantize_named(spec_or_callable: str | QuantFn, *,
                   scaled: bool = False) -> QuantFn:
    """Turn a format name or a callable into a ``(name, array) -> array`` hook.

    A string is parsed with ``parse_format`` (unknown names raise ValueError
    listing the builtins) and the hook applies ``quantize`` (or
    ``quantize_scaled`` when ``scaled=True``) to every array, ignoring the
    name.  A callable is wrapped so that its result is checked: it must have
    the input's shape, and it is returned as float32; the error names the
    tensor.
    """
    if isinstance(spec_or_callable, str):
        fmt = parse_format(spec_or_callable)
        if fmt is None:
            raise ValueError(
                f"unknown low-precision format {spec_or_callable!r}; builtins: "
                f"{', '.join(BUILTIN_FORMATS)}; or a generic fXeZmY / fXmYeZ "
                f"with X == 1 + Z + Y, 1 <= Z <= {_MAX_EXP_BITS}, Y <= {_MAX_MAN_BITS}")
        fn = quantize_scaled if scaled else quantize

        def hook(name: str, array: np.ndarray) -> np.ndarray:
            return fn(array, *fmt)

        hook.__doc__ = f"{fn.__name__} onto {spec_or_callable.strip().lower()} {fmt}"
        return hook

    if not callable(spec_or_callable):
        raise TypeError(
            f"expected a format name or a callable (name, array) -> array, "
            f"got {type(spec_or_callable).__name__}")
    user_fn = spec_or_callable

    def checked(name: str, array: np.ndarray) -> np.ndarray:
        out = np.asarray(user_fn(name, array), dtype=np.float32)
        if out.shape != np.shape(array):
            raise ValueError(
                f"quantizer for {name!r} returned shape {out.shape}, "
                f"expected {np.shape(array)}")
        return out

    return checked
