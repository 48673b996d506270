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


DDP_BATCH = 32  # rows per process: train_mpi.c's global batch is DDP_BATCH * ranks


def ddp(batch: int = DDP_BATCH):
    """A small MLP regressor, trained data-parallel from C by train_mpi.c (ddp_train_grads,
    MPI_Allreduce, ddp_train_apply); params from init_randn(seed=0), baked."""
    def build(s):
        x = s.input("x", (batch, 12))
        y = s.input("y", (batch, 4))
        h = x.linear(s.param("w1", (12, 16)), s.param("b1", (16,))).tanh()
        return h.linear(s.param("w2", (16, 4)), s.param("b2", (4,))).mse(y)

    return rlxc.Func("ddp", build).init_randn(seed=0, stddev=0.3)


def ddp_data(step: int, rows, cols: int, which: str) -> np.ndarray:
    """The data train_mpi.c generates for global `rows` at `step` (exact in float32):
    x = (((r*12+k)*31 + s*17) % 23 - 11) / 11,  y = (((r*4+k)*13 + s*7) % 19 - 9) / 9."""
    r = np.asarray(rows, np.int64)[:, None]
    k = np.arange(cols, dtype=np.int64)[None, :]
    if which == "x":
        v = ((r * cols + k) * 31 + step * 17) % 23 - 11
        return v.astype(np.float32) / np.float32(11)
    v = ((r * cols + k) * 13 + step * 7) % 19 - 9
    return v.astype(np.float32) / np.float32(9)


def mlp_dyn():
    """`mlp` with a dynamic batch ("B", 16): ONE library serves every batch size
    (run_dyn.c runs it at 1, 7 and 64 after mlpd_set_dims); params baked."""
    def build(s):
        x = s.input("x", ("B", 16))
        h = x.linear(s.param("w1", (16, 32)), s.param("b1", (32,))).relu()
        logits = h.linear(s.param("w2", (32, 4)), s.param("b2", (4,)))
        return logits, logits.softmax(-1)

    return rlxc.Func("mlpd", build).init_randn(seed=7, stddev=0.3)
