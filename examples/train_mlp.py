"""Train an MLP classifier on scikit-learn's digits with rlxc's fused Trainer.

    python examples/train_mlp.py [--device cpu|interp] [--epochs 30] [--out DIR]

What it shows: a model written with GraphScope (64 -> 128 -> 10, ReLU,
softmax cross-entropy on integer labels), params from `init_randn`, AdamW
with a warmup + cosine schedule, `f.trainer(...)` (forward, backward and the
update as one compiled call per step, params kept resident), a progress bar
with the running loss, test accuracy, and a checkpoint round trip:
`save_params` -> `load_params` into a separately traced eval function must
give the same accuracy.  The digits data (1797 8x8 images) ships inside
scikit-learn, so nothing is downloaded.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from rlxc import Func, LrSchedule
from rlxc.func import default_device
from rlxc.optim import AdamW

HIDDEN, CLASSES, FEATURES = 128, 10, 64
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the data split, accuracy and checkpoint check shared with train_cnn.py (examples/digits.py)
from digits import accuracy, evaluate_with_checkpoint, load_digits_split  # noqa: E402,F401


def mlp(batch: int, name: str, with_loss: bool) -> Func:
    """The classifier; `with_loss` returns the mean cross-entropy, else the logits."""
    def build(s):
        x = s.input("x", (batch, FEATURES))
        h = x.linear(s.param("w1", (FEATURES, HIDDEN)), s.param("b1", (HIDDEN,))).relu()
        logits = h.linear(s.param("w2", (HIDDEN, CLASSES)), s.param("b2", (CLASSES,)))
        return logits.cross_entropy(s.input("y", (batch,), "i32")) if with_loss else logits
    return Func(name, build)


def bar(done: int, total: int, loss: float, epoch: int, epochs: int, width: int = 40) -> None:
    """A carriage-return progress bar on stdout (no dependency)."""
    k = width * done // total
    sys.stdout.write(f"\r  [{'#' * k}{'.' * (width - k)}] {100 * done // total:3d}% "
                     f"epoch {epoch}/{epochs} loss {loss:.4f}")
    sys.stdout.flush()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None,
                    help="cpu (native) or interp; default: the best available")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--out", default=None,
                    help="directory for the checkpoint (default: a new temp dir)")
    args = ap.parse_args(argv)
    device = args.device or default_device()

    x_tr, y_tr, x_te, y_te = load_digits_split()
    steps_per_epoch = len(y_tr) // args.batch  # fixed batch shape: drop the ragged tail
    total = steps_per_epoch * args.epochs
    print(f"digits: {len(y_tr)} train / {len(y_te)} test, MLP {FEATURES}-{HIDDEN}-{CLASSES}, "
          f"device {device}, {total} steps")

    model = mlp(args.batch, "digits_mlp", with_loss=True).init_randn(1234, 0.1)
    sched = LrSchedule.warmup_cosine(args.lr, args.lr * 0.05, warmup=steps_per_epoch,
                                     total=total)
    t0 = time.perf_counter()
    trainer = model.trainer(AdamW(args.lr, weight_decay=1e-4), schedule=sched, device=device)
    t_compile = time.perf_counter() - t0

    rng = np.random.default_rng(1)
    t0 = time.perf_counter()
    smooth = None
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(y_tr))
        for i in range(steps_per_epoch):
            idx = order[i * args.batch:(i + 1) * args.batch]
            loss = trainer.step({"x": x_tr[idx], "y": y_tr[idx]})
            smooth = loss if smooth is None else 0.9 * smooth + 0.1 * loss
            step = (epoch - 1) * steps_per_epoch + i + 1
            if step % 8 == 0 or step == total:
                bar(step, total, smooth, epoch, args.epochs)
    t_train = time.perf_counter() - t0
    print(f"\n  {total} steps in {t_train:.2f} s ({1e3 * t_train / total:.2f} ms/step), "
          f"step compiled in {t_compile:.2f} s")

    evaluator = mlp(len(y_te), "digits_eval", with_loss=False)
    acc = evaluate_with_checkpoint(trainer.func, evaluator, x_te, y_te, device, args.out,
                                   "digits_mlp")
    assert acc > 0.9, f"test accuracy {acc:.3f} is too low"
    return 0


if __name__ == "__main__":
    sys.exit(main())
