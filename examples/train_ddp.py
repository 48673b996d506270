"""Data-parallel training of the digits MLP on N MPI ranks with rlxc.distributed.

    mpiexec -n 2 python examples/train_ddp.py [--epochs 20] [--batch 64] [--out DIR]
    python examples/train_ddp.py            (one rank: the same code, no mpiexec needed)

What it shows: `rlxc.distributed.init()` (MPI.COMM_WORLD), `shard()` to give
each rank its contiguous slice of every global batch (uneven slices are fine:
the gradient average is weighted by the slice sizes), `f.trainer(opt,
comm=comm)` (per step: compiled grads on the local slice, ONE in-place
Allreduce of a flat float32 buffer, the same compiled update on every rank;
params broadcast from rank 0 at creation), the global mean loss printed by
rank 0, and `trainer.save_params` writing the checkpoint once (rank 0).  The
model is the one of examples/train_mlp.py (64 -> 128 -> 10, AdamW, warmup +
cosine); with N ranks the trained params are those of one process on the
same global batches, up to float rounding.  An exception on any rank aborts
the whole job (no rank waits forever in Allreduce).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_mlp import accuracy, load_digits_split, mlp  # noqa: E402

from rlxc import LrSchedule  # noqa: E402
from rlxc.distributed import init, shard, shard_bounds  # noqa: E402
from rlxc.optim import AdamW  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64, help="global batch (all ranks together)")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--out", default=None, help="checkpoint directory (default: a temp dir)")
    args = ap.parse_args(argv)

    comm = init()
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    x_tr, y_tr, x_te, y_te = load_digits_split()
    lo, hi = shard_bounds(args.batch, comm.size, comm.rank)
    steps_per_epoch = len(y_tr) // args.batch
    total = steps_per_epoch * args.epochs
    say(f"digits on {comm.size} rank(s): global batch {args.batch}, "
        f"rank 0 takes {hi - lo} rows, {total} steps")

    model = mlp(hi - lo, "digits_mlp", with_loss=True).init_randn(1234, 0.1)
    sched = LrSchedule.warmup_cosine(args.lr, args.lr * 0.05, warmup=steps_per_epoch,
                                     total=total)
    trainer = model.trainer(AdamW(args.lr, weight_decay=1e-4), schedule=sched, device="cpu",
                            comm=comm)
    rng = np.random.default_rng(1)  # the same permutation on every rank
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(y_tr))
        for i in range(steps_per_epoch):
            idx = order[i * args.batch:(i + 1) * args.batch]
            loss = trainer.step({"x": shard(x_tr[idx], comm), "y": shard(y_tr[idx], comm)})
        say(f"  epoch {epoch:3d}  loss {loss:.4f}")
    secs = time.perf_counter() - t0
    say(f"{total} steps in {secs:.2f} s ({1e3 * secs / total:.2f} ms/step); allreduce "
        f"{1e3 * comm.allreduce_seconds / max(comm.allreduce_calls, 1):.3f} ms/step")

    out = args.out or (tempfile.mkdtemp(prefix="rlxc-ddp-") if comm.rank == 0 else None)
    out = comm.allgather(out)[0]
    path = os.path.join(out, "digits_ddp.safetensors")
    trainer.save_params(path)  # rank 0 writes; every rank returns once the file exists
    acc = accuracy(mlp(len(y_te), "digits_eval", False).load_params(path), x_te, y_te, "cpu")
    say(f"test accuracy {acc:.4f} (checkpoint {path})")
    if acc <= 0.9:
        raise SystemExit(f"test accuracy {acc:.3f} is too low")
    return 0


if __name__ == "__main__":
    sys.exit(main())
