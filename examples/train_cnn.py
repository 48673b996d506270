"""Train a small CNN on scikit-learn's digits (8x8 images) with rlxc's fused Trainer.

    python examples/train_cnn.py [--device cpu|interp] [--epochs 15] [--out DIR]

The model (rlxc.nn_conv.conv2d blocks, NCHW):
    (B, 1, 8, 8) -> conv 3x3 (16, same) + relu -> conv 3x3 (32, same) + relu
    -> max_pool 2 -> (B, 32, 4, 4) -> linear 512-64 + relu -> linear 64-10
trained with AdamW and a warmup + cosine schedule on softmax cross-entropy.  It beats the
MLP example (examples/train_mlp.py) on the same 80/20 split, and the checkpoint round trip
(`save_params` -> `load_params` into a separately traced eval function) gives the same
accuracy.  The digits data ships inside scikit-learn, so nothing is downloaded.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from rlxc import Func, LrSchedule
from rlxc.func import default_device
from rlxc.nn_conv import conv2d, he_init
from rlxc.optim import AdamW

CLASSES = 10
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the same data split, accuracy and checkpoint check as the MLP example (examples/digits.py)
from digits import evaluate_with_checkpoint, load_digits_split  # noqa: E402


def cnn(batch: int, name: str, with_loss: bool, width: int = 16) -> Func:
    """The classifier; `with_loss` returns the mean cross-entropy, else the logits."""
    def build(s):
        x = s.input("x", (batch, 64)).reshape(batch, 1, 8, 8)
        h = conv2d(s, "c1", x, width, 3, padding="same").relu()
        h = conv2d(s, "c2", h, 2 * width, 3, padding="same").relu().max_pool2d(2)
        h = h.reshape(batch, 2 * width * 16)
        h = h.linear(s.param("f1_w", (2 * width * 16, 64)), s.param("f1_b", (64,))).relu()
        logits = h.linear(s.param("f2_w", (64, CLASSES)), s.param("f2_b", (CLASSES,)))
        return logits.cross_entropy(s.input("y", (batch,), "i32")) if with_loss else logits
    return Func(name, build)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None,
                    help="cpu (native) or interp; default: the best available")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--width", type=int, default=16, help="channels of the first conv")
    ap.add_argument("--min-acc", type=float, default=0.983,
                    help="fail below this test accuracy (the MLP example's)")
    ap.add_argument("--out", default=None,
                    help="directory for the checkpoint (default: a new temp dir)")
    args = ap.parse_args(argv)
    device = args.device or default_device()

    x_tr, y_tr, x_te, y_te = load_digits_split()
    steps_per_epoch = len(y_tr) // args.batch
    total = steps_per_epoch * args.epochs
    print(f"digits: {len(y_tr)} train / {len(y_te)} test, CNN width {args.width}, "
          f"device {device}, {total} steps")

    model = he_init(cnn(args.batch, "digits_cnn", True, args.width), seed=1234)
    sched = LrSchedule.warmup_cosine(args.lr, args.lr * 0.05, warmup=steps_per_epoch,
                                     total=total)
    t0 = time.perf_counter()
    trainer = model.trainer(AdamW(args.lr, weight_decay=1e-4), schedule=sched, device=device)
    t_compile = time.perf_counter() - t0

    rng = np.random.default_rng(1)
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(y_tr))
        for i in range(steps_per_epoch):
            idx = order[i * args.batch:(i + 1) * args.batch]
            loss = trainer.step({"x": x_tr[idx], "y": y_tr[idx]})
        print(f"  epoch {epoch}/{args.epochs} loss {loss:.4f}")
    t_train = time.perf_counter() - t0
    print(f"  {total} steps in {t_train:.2f} s ({1e3 * t_train / total:.2f} ms/step), "
          f"step compiled in {t_compile:.2f} s")

    evaluator = cnn(len(y_te), "digits_cnn_eval", False, args.width)
    acc = evaluate_with_checkpoint(trainer.func, evaluator, x_te, y_te, device, args.out,
                                   "digits_cnn")
    assert acc >= args.min_acc, f"test accuracy {acc:.4f} is below {args.min_acc}"
    return 0


if __name__ == "__main__":
    sys.exit(main())
