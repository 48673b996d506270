"""Random small rlx graphs for property tests (hypothesis strategies).

A graph is a recipe: a list of steps, each applying one op to earlier values.
All values keep the shape (3, 4) except where a step reduces and broadcasts
back, so any step can consume any earlier value. Domains are kept safe
(log/sqrt see positive arguments) so results are finite.
"""
import numpy as np
from hypothesis import strategies as st

import rlxc

SHAPE = (3, 4)

UNARY = ["neg", "exp_safe", "log_safe", "sqrt_safe", "tanh", "sigmoid", "relu", "gelu",
         "silu", "softplus", "abs", "sin", "cos", "erf"]
BINARY = ["add", "sub", "mul", "maximum", "minimum", "div_safe", "select_gt"]
OTHER = ["sum_bcast", "max_bcast", "mean_keep", "transpose_back", "matmul_sq", "scale",
         "slice_concat"]


def _apply(step, vals):
    kind, a, b = step
    x, y = vals[a % len(vals)], vals[b % len(vals)]
    if kind == "neg":
        return -x
    if kind == "exp_safe":
        return x.tanh().exp()
    if kind == "log_safe":
        return (x * x + 1.0).log()
    if kind == "sqrt_safe":
        return (x.abs() + 0.5).sqrt()
    if kind in UNARY:
        return getattr(x, kind)()
    if kind == "div_safe":
        return x / (y * y + 1.0)
    if kind == "select_gt":
        return x.gt(y).where(x, y * 0.5)
    if kind in ("maximum", "minimum"):
        return getattr(x, kind)(y)
    if kind in BINARY:
        return {"add": x + y, "sub": x - y, "mul": x * y}[kind]
    if kind == "sum_bcast":
        return x.sum(1, keepdims=True) * 0.25 + y
    if kind == "max_bcast":
        return x - x.max(0)
    if kind == "mean_keep":
        return x.mean(0, keepdims=True).broadcast_to(SHAPE)
    if kind == "transpose_back":
        return x.T.reshape(4, 3).T.reshape(3, 4) + y
    if kind == "matmul_sq":
        return (x @ y.T @ x) * 0.1
    if kind == "scale":
        return x * 0.5 + 1.0
    if kind == "slice_concat":
        return rlxc.concat([x[:, 2:], x[:, :2]], 1)
    raise AssertionError(kind)


steps = st.lists(st.tuples(st.sampled_from(UNARY + BINARY + OTHER),
                           st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=8)


def build_func(recipe, n_inputs=2):
    def build(s):
        vals = [s.input(f"x{i}", SHAPE) for i in range(n_inputs)]
        for step in recipe:
            vals.append(_apply(step, vals))
        return vals[-1], vals[len(vals) // 2].sum()

    return rlxc.Func("rand", build)


def inputs(seed, n_inputs=2):
    rng = np.random.default_rng(seed)
    return {f"x{i}": rng.uniform(-1.5, 1.5, SHAPE).astype(np.float32) for i in range(n_inputs)}
