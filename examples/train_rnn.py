"""Train a GRU written with rlxc.scan to compute the parity of a bit string.

    python examples/train_rnn.py [--device cpu|interp] [--length 12] [--steps 600]

What it shows: a recurrent network as one `rlxc.scan` (the IR holds the GRU
cell once, whatever the sequence length: a native loop in the compiled
library, not an unrolled graph), trained with the fused `Trainer` (forward,
the reverse scan of the backward, and the Adam update as one compiled call).
The task: for random bit strings, predict after every bit the parity of the
bits so far (the running sum mod 2); the reported accuracy is on the parity
of the whole string, on fresh test strings.  A model that does not carry
state through the loop stays at 50%.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import rlxc
from rlxc import Func
from rlxc.func import default_device
from rlxc.optim import Adam


def gru(length: int, batch: int, hidden: int, name: str, with_loss: bool) -> Func:
    """GRU over bits x (length, batch); logits (length, batch, 2) or the mean cross-entropy
    against the running parity y (length, batch)."""
    H = hidden

    def build(s):
        x = s.input("x", (length, batch))
        wx, bx = s.param("wx", (1, 3 * H)), s.param("bx", (3 * H,))
        wh = s.param("wh", (H, 3 * H))
        wo, bo = s.param("wo", (H, 2)), s.param("bo", (2,))

        def cell(h, xt):
            gx = xt.reshape(batch, 1) @ wx + bx
            gh = h @ wh
            z = (gx[:, :H] + gh[:, :H]).sigmoid()
            r = (gx[:, H:2 * H] + gh[:, H:2 * H]).sigmoid()
            n = (gx[:, 2 * H:] + r * gh[:, 2 * H:]).tanh()
            h2 = (1.0 - z) * n + z * h
            return h2, h2.linear(wo, bo)
        h0 = s.constant(np.zeros((batch, H), np.float32))
        _, logits = rlxc.scan(cell, h0, x)
        if not with_loss:
            return logits
        return logits.cross_entropy(s.input("y", (length, batch), "i32"))
    return Func(name, build)


def data(rng, length: int, batch: int):
    bits = rng.integers(0, 2, (length, batch))
    return bits.astype(np.float32), (np.cumsum(bits, axis=0) % 2).astype(np.int32)


def main(argv=None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cpu, interp, cuda (default: the best)")
    ap.add_argument("--length", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    device = args.device or default_device()
    rng = np.random.default_rng(args.seed)

    train = gru(args.length, args.batch, args.hidden, "gru_parity", True)
    train = train.init_randn(seed=args.seed, stddev=0.3)
    t0 = time.perf_counter()
    tr = train.trainer(Adam(args.lr), max_grad_norm=1.0, device=device)
    loss = 0.0
    for step in range(args.steps):
        x, y = data(rng, args.length, args.batch)
        loss = tr.step({"x": x, "y": y})
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {loss:.4f}", flush=True)
    secs = time.perf_counter() - t0

    n_test = 512
    ev = gru(args.length, n_test, args.hidden, "gru_parity_eval", False)
    ev = ev.with_params(tr.func.params())
    x, y = data(np.random.default_rng(args.seed + 1), args.length, n_test)
    logits = ev.run_on(device, x=x)[0]
    acc = float(np.mean(np.argmax(logits[-1], axis=-1) == y[-1]))
    print(f"trained {args.steps} steps in {secs:.1f} s on {device}; parity of "
          f"{args.length} bits: test accuracy {acc:.3f} (chance 0.5)")
    return acc


if __name__ == "__main__":
    sys.exit(0 if main() > 0.9 else 1)
