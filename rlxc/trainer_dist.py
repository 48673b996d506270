"""The distributed half of Trainer (rlxc/trainer.py): setup, build and step with a comm.

    setup:  batch weight n_local / n_total (allgather of the local batch sizes);
            opt.t from rank 0
    build:  params and slots broadcast from rank 0 (collective: at creation, and in
            load_state_dict / a rebuild, which every rank calls alike), then
            split_programs (rlxc/train_split.py) -> SplitEngine (rlxc/split_engine.py)
    step:   scalars, data (and the QAT forward weights) -> engine.run_grads()
            -> buf.reduce(): the flat buffer summed over ranks, ONE call
               (comm.grad_buffer, rlxc/reduce_buffer.py: an in-place Allreduce,
               or a shared-memory window when every rank is on one node)
            -> engine.run_apply()  -> the global mean loss (the flat buffer's last
            element, reduced with the grads)

Kept out of trainer.py so that the single-process path stays as it was.
"""
from __future__ import annotations

import numpy as np

from rlxc.runtime.signature import coerce

__all__ = ["setup", "build", "step"]


def _local_batch(f, batch_size) -> int:
    if batch_size is not None and not any(isinstance(d, str) for a in f.signature()
                                          for d in a.shape):
        n = int(batch_size)
        if n < 1:
            raise ValueError(f"trainer: batch_size must be >= 1, got {batch_size!r}")
        return n
    ins = [a for a in f.signature() if a.kind == "input"]
    dyn = [(a.name, d) for a in ins for d in a.shape if isinstance(d, str)]
    if dyn:
        raise ValueError(f"trainer(comm=...): input {dyn[0][0]!r} has the dynamic dimension "
                         f"{dyn[0][1]!r}; the distributed trainer runs a static batch for now: "
                         f"train {f.name}.specialize({dyn[0][1]}=SIZE) (one trainer per size)")
    if not ins or not ins[0].shape:
        raise ValueError(f"trainer(comm=...): cannot tell the batch size of {f.name} (its "
                         "first input has no leading axis); pass batch_size=")
    return int(ins[0].shape[0])


def setup(tr, params: dict, slots: dict, batch_size):
    """Check the comm, weigh this rank's batch, take rank 0's step count."""
    comm = tr.comm
    for attr in ("rank", "size", "barrier", "allreduce_sum_", "bcast_", "allgather"):
        if not hasattr(comm, attr):
            raise TypeError(f"trainer: comm must be an rlxc.distributed.Comm (from "
                            f"rlxc.distributed.init()), got {type(comm).__name__} without "
                            f".{attr}")
    if tr._backend.name not in ("cpu", "interp"):
        raise ValueError(f"trainer(comm=...): device {tr.device!r} is not supported yet "
                         "(cpu, interp); GPUs will use NCCL behind the same comm interface")
    n = _local_batch(tr._f, batch_size)
    sizes = comm.allgather(n)
    tr.batch_sizes = list(sizes)
    tr._grad_scale = float(np.float32(n / sum(sizes)))
    t = comm.allgather(tr.opt.t)[0]
    tr.opt._t = int(t)
    return params, slots


def _layout(tr, f, opt, aprog, params, dtypes) -> list:
    """What every rank's trainer must agree on before its collectives: the params (names,
    shapes, dtypes), the optimizer and its state slots, and the gradient's length."""
    return [("params", [(n, tuple(np.shape(params[n])), np.dtype(dtypes[n]).name)
                        for n in f.param_names()]),
            ("optimizer", type(opt).__name__),
            ("slots", [(p, s, tuple(opt.slot_shape(s, np.shape(params[p]))))
                       for p, s in aprog.slot_args]),
            ("wrt", list(aprog.wrt)),
            ("max_grad_norm", tr.max_grad_norm)]


def _same_layout(comm, mine: list) -> None:
    """Every rank gets every rank's layout (one allgather), so all of them raise alike
    when one differs, instead of mismatched broadcasts that truncate or go unnoticed."""
    every = comm.allgather(mine)
    for r, theirs in enumerate(every):
        if theirs != every[0]:
            for (what, a), (_, b) in zip(every[0], theirs):
                if a == b:
                    continue
                if isinstance(a, list) and isinstance(b, list):
                    pairs = [(x, y) for x, y in zip(a, b) if x != y]
                    a, b = pairs[0] if pairs else (f"{len(a)} entries", f"{len(b)} entries")
                raise ValueError(f"trainer(comm=...): rank {r} builds a different trainer "
                                 f"than rank 0: {what} {b!r} vs {a!r} (every rank must build "
                                 "the same Func, optimizer and options)")


def build(tr, params: dict, slots: dict) -> None:
    from .train import optimizer_structure
    from .split_engine import SplitEngine
    from .train_split import split_programs

    f, opt, comm = tr._f, tr.opt, tr.comm
    gprog, aprog = split_programs(f, opt, tr._wrt, tr.max_grad_norm, tr.quant,
                                  device=tr.device)
    tr._prog, tr._gprog = aprog, gprog
    tr._structure = optimizer_structure(opt)
    dtypes = tr._param_dtypes()
    _same_layout(comm, _layout(tr, f, opt, aprog, params, dtypes))
    # rank 0's params and slots (at creation and on every rebuild or load): ranks
    # start identical even if they were initialized differently
    params = {n: comm.bcast_(np.array(params[n], dtypes[n], copy=True))
              for n in f.param_names()}  # signature order: the same on every rank
    tr._frozen = {n: a for n, a in params.items() if n not in aprog.wrt}
    state = []
    for (p, s) in aprog.slot_args:
        shape = opt.slot_shape(s, params[p].shape)
        buf = slots.get(p, {}).get(s)
        if buf is None:
            buf = np.zeros(shape, np.float32)
        elif buf.shape != shape:
            raise ValueError(f"trainer: optimizer state {s!r} of {p!r} has shape "
                             f"{buf.shape}, expected {shape}")
        buf = np.array(buf, np.float32, copy=True)
        state.append(comm.bcast_(buf))  # rank 0's slots, like its params
    tr._scal = np.zeros(len(aprog.scalar_names), np.float32)
    make = getattr(comm, "grad_buffer", None)
    if make is None:  # a comm with allreduce_sum_ only
        from .reduce_buffer import AllreduceBuffer

        buf = AllreduceBuffer(comm, gprog.grad_numel + 1)
    else:
        buf = make(gprog.grad_numel + 1)
    tr._gbuf = buf
    eng = SplitEngine(tr.device, gprog, aprog, params, tr._frozen, state, tr._grad_scale,
                      flat=buf.local, reduced=buf.result)
    eng.set_scalars(tr._scal)
    tr._engine = eng
    tr._param_pos = {n: aprog.wrt.index(n) if n in aprog.wrt else -1 for n in f.param_names()}
    tr._fwd_pos = list(range(len(aprog.wrt))) if gprog.quant == "callable" else []
    if tr._fwd_pos:
        from .train import qat_hook

        tr._qf = qat_hook(tr.quant)


def step(tr, inputs) -> float:
    from .train import coerce_data, optimizer_structure

    opt = tr.opt
    if optimizer_structure(opt) != tr._structure:
        tr._rebuild()
    eng = tr._engine
    t = opt.t + 1
    if tr.schedule is not None:
        opt.set_lr(tr.schedule.lr_at(opt.t))
    tr._prog.scalar_vector(opt, t, opt.lr, out=tr._scal)
    for i, a in enumerate(coerce_data(tr._gprog, tr._f, inputs)):
        eng.set_data(i, a)
    if tr._fwd_pos:
        qf = tr._qf
        for j, n in enumerate(tr._prog.wrt):
            cur = eng.param_view(j)
            eng.set_fwd(j, coerce("input", f"quant({n})", qf(n, cur.copy()), cur.shape, "f32"))
    eng.run_grads()
    tr._gbuf.reduce()
    eng.run_apply()
    opt._t = t
    return float(eng.loss[0])
