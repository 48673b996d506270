"""Shared by the digits examples (train_mlp.py, train_cnn.py): the data and the final check.

- `load_digits_split`: scikit-learn's digits (1797 8x8 images, shipped with scikit-learn,
  nothing downloaded), pixels scaled to [0, 1], a seeded 80/20 train/test split.
- `accuracy`: argmax of the logits against the labels.
- `evaluate_with_checkpoint`: test accuracy of the trained params in a separately traced
  eval function, then the checkpoint round trip (`save_params` -> `load_params`) must give
  the same accuracy.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np


def load_digits_split(seed: int = 0, test_fraction: float = 0.2):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int32)
    perm = np.random.default_rng(seed).permutation(len(y))
    n_test = int(len(y) * test_fraction)
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


def accuracy(f, x, y, device) -> float:
    logits = f.run_on(device, x=x)[0]
    return float(np.mean(np.argmax(logits, axis=1) == y))


def evaluate_with_checkpoint(trained, evaluator, x_te, y_te, device, out, name: str) -> float:
    """Test accuracy of `trained`'s params run through `evaluator`; saves them to
    OUT/NAME.safetensors (OUT: a new temp dir when None), reloads them into `evaluator`
    and asserts the accuracy is unchanged."""
    acc = accuracy(evaluator.with_params(trained.params()), x_te, y_te, device)
    print(f"test accuracy: {acc:.4f}")

    out = out or tempfile.mkdtemp(prefix=f"rlxc-{name.replace('_', '-')}-")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.safetensors")
    trained.save_params(path)
    reloaded = evaluator.load_params(path)
    acc2 = accuracy(reloaded, x_te, y_te, device)
    print(f"checkpoint {path}: reloaded test accuracy {acc2:.4f}")
    assert acc2 == acc, f"accuracy changed after reload: {acc} -> {acc2}"
    return acc
