"""Train a tiny character-level GPT on examples/data/compilers.txt, print a sample.

    python examples/train_gpt.py [--steps 600] [--device cpu|interp] [--out DIR]
    rlxc compile examples/train_gpt.py:gpt_next --params DIR/gpt.safetensors -o DIR/gpt
    make -C examples/embed_c gen_gpt ...    (examples/embed_c/gen_gpt.c generates from C)

What it shows: a transformer written with rlxc.nn (token + position
embeddings, 2 pre-LN blocks of causal multi-head rlxc.attention and a 4x GELU
MLP, a final layer norm and a linear head), trained with AdamW through the
fused Trainer on random windows of a text this repository ships (written
for it: examples/data/compilers.txt).  Dropout (p = 0.1, after attention and
MLP) is used when the Tensor has `dropout` (counter-based RNG: one u32 (2,)
key input per dropout site, a fresh key per step); otherwise the model trains
without it.  After training it saves the params, and greedy generation from
the first CONTEXT characters of the text prints a sample.  `gpt_next` is the
inference model (one window in, next-character probabilities out) that
`rlxc compile` exports as a C library.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

import rlxc
from rlxc import Func, nn
from rlxc.func import default_device
from rlxc.optim import AdamW
from rlxc.tensor import Tensor

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT_PATH = os.path.join(HERE, "data", "compilers.txt")
CONTEXT, WIDTH, HEADS, LAYERS = 32, 64, 4, 2
DROPOUT = 0.1


def load_text():
    """(text, vocabulary string): every distinct character of the text, sorted."""
    with open(TEXT_PATH, encoding="utf-8") as fh:
        text = fh.read()
    return text, "".join(sorted(set(text)))


def gpt(batch: int, vocab: int, with_loss: bool, dropout: bool = False, name: str = "gpt"):
    """The model: ids (batch, CONTEXT) i32 -> mean next-char cross-entropy against
    `targets` (with_loss) or next-char probabilities at the last position (batch, vocab)."""
    use_dropout = dropout and hasattr(Tensor, "dropout")

    def build(s):
        ids = s.input("ids", (batch, CONTEXT), "i32")
        keys = []

        def drop(h):   # one key input per dropout site (fresh per step, from the host)
            k = s.input(f"dropout_key{len(keys)}", (2,), "u32")
            keys.append(k)
            return h.dropout(DROPOUT, k)
        h = nn.embedding(s, "tok", ids, vocab, WIDTH) + s.param("pos.table", (CONTEXT, WIDTH))
        for layer in range(LAYERS):
            h = nn.transformer_block(s, f"blk{layer}", h, HEADS, mask="causal",
                                     dropout=drop if use_dropout else None)
        logits = nn.linear(s, "head", nn.layer_norm(s, "ln_f", h), vocab)
        if with_loss:
            targets = s.input("targets", (batch, CONTEXT), "i32")
            return logits.reshape(batch * CONTEXT, vocab).cross_entropy(
                targets.reshape(batch * CONTEXT))
        return logits[:, CONTEXT - 1].softmax(-1)
    return Func(name, build)


def gpt_next() -> Func:
    """The exported inference model (rlxc compile ...:gpt_next): one window, batch 1."""
    return gpt(1, len(load_text()[1]), with_loss=False, name="gpt")


def batches(text_ids: np.ndarray, batch: int, rng):
    """Random windows: ids and the same windows shifted by one (targets)."""
    starts = rng.integers(0, len(text_ids) - CONTEXT - 1, size=batch)
    ids = np.stack([text_ids[s:s + CONTEXT] for s in starts])
    return ids, np.stack([text_ids[s + 1:s + CONTEXT + 1] for s in starts])


def generate(jitted, vocab: str, prompt: str, n: int) -> str:
    """Greedy decoding: the most likely next character, window after window."""
    stoi = {c: i for i, c in enumerate(vocab)}
    window = [stoi[c] for c in prompt[-CONTEXT:]]
    out = []
    for _ in range(n):
        probs = jitted.run(np.array([window], np.int32))[0][0]
        nxt = int(np.argmax(probs))
        out.append(vocab[nxt])
        window = window[1:] + [nxt]
    return "".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--sample", type=int, default=120, help="characters to generate")
    ap.add_argument("--device", default=None, help="cpu or interp; default: the best available")
    ap.add_argument("--out", default=None, help="directory for gpt.safetensors and vocab.txt")
    args = ap.parse_args(argv)
    device = args.device or default_device()
    text, vocab = load_text()
    text_ids = np.array([vocab.index(c) for c in text], np.int32)
    print(f"text: {len(text)} characters, vocabulary {len(vocab)}; model: {LAYERS} layers, "
          f"width {WIDTH}, {HEADS} heads, context {CONTEXT}; dropout: "
          f"{'p=%g' % DROPOUT if hasattr(Tensor, 'dropout') else 'not available'}")

    f = nn.init(gpt(args.batch, len(vocab), with_loss=True, dropout=True), seed=0)
    trainer = f.trainer(AdamW(args.lr), device=device)
    key_names = [n for n in f.input_names() if n.startswith("dropout_key")]
    rng = np.random.default_rng(0)
    t0 = time.time()
    first = last = None
    for step in range(args.steps):
        ids, targets = batches(text_ids, args.batch, rng)
        data = {"ids": ids, "targets": targets}
        for k in key_names:
            data[k] = rng.integers(0, 2 ** 32, size=2, dtype=np.uint32)
        loss = float(trainer.step(data))
        first = loss if first is None else first
        last = loss
        if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
            print(f"  step {step:4d}  loss {loss:.4f}")
    print(f"trained {args.steps} steps in {time.time() - t0:.1f} s: loss {first:.3f} -> "
          f"{last:.3f}")

    out = args.out or tempfile.mkdtemp(prefix="rlxc_gpt_")
    os.makedirs(out, exist_ok=True)
    params = trainer.func.params()
    nxt = gpt_next().with_params(params)
    nxt.save_params(os.path.join(out, "gpt.safetensors"))
    with open(os.path.join(out, "vocab.txt"), "w", encoding="utf-8", newline="") as fh:
        fh.write(vocab)
    prompt = text[:CONTEXT]
    sample = generate(_Interp(nxt) if device == "interp" else nxt.jit_on(device), vocab, prompt,
                      args.sample)
    print(f"sample (greedy, after {prompt!r}):\n{prompt}{sample}")
    print(f"params and vocabulary in {out}")
    return 0 if last < first else 1


class _Interp:
    """`run` on the interpreter (the --device interp path)."""

    def __init__(self, f):
        self.f = f

    def run(self, ids):
        return self.f.run_on("interp", ids=ids)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["gpt", "gpt_next", "generate", "load_text", "CONTEXT", "rlxc"]
