"""Worker of tests/test_distributed_mpi.py, run under `mpiexec -n N`.

    python ddp_worker.py MODE OPT GLOBAL_BATCH STEPS OUT_DIR [MODEL]

MODE "train": trains MODEL ("mlp", the default, or "cnn": conv + relu + max_pool +
linear) on this rank's shard of the global batch
(rlxc.distributed.shard), checks after every step that the params are bitwise
equal on all ranks (allgather of their bytes), and rank 0 saves the final
params with Trainer.save_params to OUT_DIR/params.safetensors and the losses
to OUT_DIR/losses.npy.  MODE "raise" / "kill": rank 1 raises / SIGKILLs
itself before step 3 (the others must not hang in Allreduce).
The models and data are importable (`MODELS`, `data`) for the 1-process reference.
"""
import os
import signal
import sys
import time

import numpy as np

import rlxc
from rlxc import optim


def mlp(batch: int, n_in: int = 12, hidden: int = 16, n_out: int = 4) -> rlxc.Func:
    def build(s):
        x = s.input("x", (batch, n_in))
        y = s.input("y", (batch, n_out))
        h = x.linear(s.param("w1", (n_in, hidden)), s.param("b1", (hidden,))).tanh()
        return h.linear(s.param("w2", (hidden, n_out)), s.param("b2", (n_out,))).mse(y)

    return rlxc.Func("ddp_mlp", build)


CNN_IN = (2, 6, 6)   # channels, height, width of the CNN's images


def cnn(batch: int, n_out: int = 4) -> rlxc.Func:
    """conv 3x3 (2 -> 4 channels, pad 1) + bias, relu, 2x2 max pool, linear, mse."""
    def build(s):
        x = s.input("x", (batch, *CNN_IN))
        y = s.input("y", (batch, n_out))
        h = x.conv2d(s.param("cw", (4, CNN_IN[0], 3, 3)), s.param("cb", (4,)),
                     padding=1).relu().max_pool2d(2)
        h = h.reshape(batch, 4 * (CNN_IN[1] // 2) * (CNN_IN[2] // 2))
        return h.linear(s.param("w", (h.shape[1], n_out)), s.param("b", (n_out,))).mse(y)

    return rlxc.Func("ddp_cnn", build)


MODELS = {"mlp": mlp, "cnn": cnn}


def data(global_batch: int, steps: int, seed: int = 3, model: str = "mlp"):
    rng = np.random.default_rng(seed)
    x_shape = (12,) if model == "mlp" else CNN_IN
    return [(rng.standard_normal((global_batch, *x_shape)).astype(np.float32),
             rng.standard_normal((global_batch, 4)).astype(np.float32)) for _ in range(steps)]


def make_opt(name: str):
    """(optimizer, max_grad_norm): "adamclip" clips at a norm the grads exceed."""
    return {"sgd": lambda: (optim.SGD(0.1), 0.0), "adam": lambda: (optim.Adam(0.01), 0.0),
            "adamclip": lambda: (optim.Adam(0.01), 0.05)}[name]()


def main(mode, opt_name, global_batch, steps, out, model="mlp"):
    from rlxc.distributed import init, shard, shard_bounds

    comm = init()
    lo, hi = shard_bounds(global_batch, comm.size, comm.rank)
    # every rank starts from different params: the broadcast from rank 0 must win
    f = MODELS[model](hi - lo).init_randn(seed=0 if comm.rank == 0 else 100 + comm.rank, stddev=0.3)
    if mode == "mismatch" and comm.rank == 1:   # another optimizer than rank 0's
        opt_name = "sgd" if opt_name != "sgd" else "adam"
    opt, clip = make_opt(opt_name)
    tr = f.trainer(opt, max_grad_norm=clip, comm=comm)
    losses = []
    for i, (x, y) in enumerate(data(global_batch, steps, model=model)):
        if mode in ("raise", "kill") and comm.rank == 1 and i == 3:
            print(f"FAIL_AT {time.time():.3f}", flush=True)
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("injected failure on rank 1 at step 3")
        losses.append(tr.step({"x": shard(x, comm), "y": shard(y, comm)}))
        blob = b"".join(np.ascontiguousarray(v).tobytes()
                        for _, v in sorted(tr.func.params().items()))
        if len(set(comm.allgather(blob))) != 1:
            raise AssertionError(f"params differ across ranks after step {i}")
    tr.save_params(os.path.join(out, "params.safetensors"))
    if comm.rank == 0:
        np.save(os.path.join(out, "losses.npy"), np.array(losses))
    print(f"rank {comm.rank}: done, loss {losses[-1]:.6f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5],
         *sys.argv[6:7])
