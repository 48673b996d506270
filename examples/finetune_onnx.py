"""Fine-tune a model exported from PyTorch to ONNX, then ship it as a native library.

    python examples/finetune_onnx.py [--epochs N] [--lr X] [--out DIR]

1. the model: exported by torch.onnx.export when torch is installed, else the copy
   committed in tests/fixtures/onnx/ (scripts/export_onnx_fixtures.py made it);
2. `rlxc.from_onnx` imports it (params under their ONNX/torch names), `with_loss`
   adds softmax cross-entropy against a `labels` input;
3. `f.trainer(AdamW)` fine-tunes it on scikit-learn's digits with compiled gradients;
4. `rlxc compile model.onnx --params finetuned.safetensors --loss cross_entropy
   --train` writes libNAME.so + NAME.h, which can keep training from C; the
   example loads it back and checks it gives the same test accuracy.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

import rlxc
from rlxc.onnx_import import with_loss
from rlxc.optim import AdamW

MODEL = "cnn"   # the exported digits CNN (conv-bn-relu-maxpool x2, avg pool, linear); or "mlp"
SHAPE = {"mlp": (64,), "cnn": (1, 8, 8)}[MODEL]
EPOCHS, LR = {"mlp": (15, 3e-3), "cnn": (30, 1e-2)}[MODEL]
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures", "onnx")


def digits(seed: int = 0, test_fraction: float = 0.2):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32).reshape((-1,) + SHAPE)
    y = d.target.astype(np.int32)
    perm = np.random.default_rng(seed).permutation(len(y))
    n = int(len(y) * test_fraction)
    return x[perm[n:]], y[perm[n:]], x[perm[:n]], y[perm[:n]]


def exported_model(out: str) -> str:
    """A .onnx of MODEL: exported now when torch is here, else the committed export."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return os.path.join(FIXTURES, f"{MODEL}.onnx")
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from onnx_torch_models import export

    return export(MODEL, os.path.join(out, f"{MODEL}.onnx"))


def accuracy(f, x, y, device: str) -> float:
    return float(np.mean(np.argmax(f.run_on(device, x=x)[0], axis=1) == y))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=LR)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="output directory (default: a temp dir)")
    args = ap.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="rlxc-finetune-")
    os.makedirs(out, exist_ok=True)

    path = exported_model(out)
    x_tr, y_tr, x_te, y_te = digits()
    model = rlxc.from_onnx(path, input_shapes={"x": (args.batch,) + SHAPE})
    evaluate = rlxc.from_onnx(path, input_shapes={"x": (len(y_te),) + SHAPE})
    print(f"{path}: params {', '.join(model.param_names())}")
    acc0 = accuracy(evaluate, x_te, y_te, args.device)

    trainer = with_loss(model, "cross_entropy").trainer(AdamW(args.lr), device=args.device)
    rng = np.random.default_rng(1)
    steps = len(y_tr) // args.batch
    for epoch in range(1, args.epochs + 1):
        order, total = rng.permutation(len(y_tr)), 0.0
        for i in range(steps):
            idx = order[i * args.batch:(i + 1) * args.batch]
            total += trainer.step({"x": x_tr[idx], "labels": y_tr[idx]})
        if epoch == 1 or epoch % 5 == 0 or epoch == args.epochs:
            print(f"  epoch {epoch:3d}  loss {total / steps:.4f}")
    tuned = evaluate.with_params(trainer.func.params())
    acc1 = accuracy(tuned, x_te, y_te, args.device)
    print(f"test accuracy: {acc0:.4f} as exported -> {acc1:.4f} fine-tuned")

    ckpt = os.path.join(out, "finetuned.safetensors")
    tuned.save_params(ckpt)
    from rlxc.cli.main import main as rlxc_cli

    lib = os.path.join(out, "lib")
    rlxc_cli(["compile", path, "--name", f"digits_{MODEL}", "--input-shape",
              "x=" + ",".join(str(d) for d in (len(y_te),) + SHAPE), "--params", ckpt,
              "--loss", "cross_entropy", "--train", "--optimizer", "adamw", "-o", lib],
             standalone_mode=False)
    from rlxc.runtime import load

    so = load(lib)
    loss, logits = so.run(x=x_te, labels=y_te)
    acc2 = float(np.mean(np.argmax(logits, axis=1) == y_te))
    print(f"{lib}: libdigits_{MODEL}.so test accuracy {acc2:.4f}, loss {float(loss):.4f}")
    assert abs(acc2 - acc1) < 1e-9, (acc1, acc2)
    assert acc1 > max(acc0, 0.9), f"fine-tuning did not help: {acc0} -> {acc1}"
    return 0


if __name__ == "__main__":
    sys.exit(main())
