"""The models the C examples embed (compiled by the Makefile with `rlxc compile`).

    rlxc compile model.py:mlp  -o build/mlp                       params baked in
    rlxc compile model.py:tiny -o build/tiny --train --optimizer adamw --lr 0.05

`mlp`: a two-layer classifier head, x (8, 16) -> logits (8, 4) and softmax
probabilities; its params come from `init_randn` and are baked into libmlp.so.
`tiny`: linear regression, loss = mean((x @ w + b - y)^2), trained from C by
tiny_train_step; it starts from zero params (baked), which training updates in
the context.
"""
import numpy as np

import rlxc


def mlp():
    def build(s):
        x = s.input("x", (8, 16))
        h = x.linear(s.param("w1", (16, 32)), s.param("b1", (32,))).relu()
        logits = h.linear(s.param("w2", (32, 4)), s.param("b2", (4,)))
        return logits, logits.softmax(-1)

    return rlxc.Func("mlp", build).init_randn(seed=7, stddev=0.3)


def tiny():
    def build(s):
        x = s.input("x", (32, 4))
        y = s.input("y", (32, 1))
        pred = x @ s.param("w", (4, 1)) + s.param("b", (1,))
        return pred.mse(y)

    return rlxc.Func("tiny", build).init_params(lambda name, dims: np.zeros(dims))


def example_input(shape) -> np.ndarray:
    """The input run_mlp.c builds: element i is ((i % 7) - 3) * 0.25 (exact in float32)."""
    n = int(np.prod(shape))
    return (((np.arange(n) % 7) - 3) * 0.25).astype(np.float32).reshape(shape)
