"""Write tests/fixtures/onnx/: the models of tests/onnx_torch_models.py exported by
torch.onnx.export, and PyTorch's outputs and gradients for them, so that the ONNX
import tests check real exported models where torch is not installed.

    python scripts/export_onnx_fixtures.py      (needs torch and onnx)

Writes NAME.onnx and NAME_ref.npz (batch 2 and 5: x, y, and for mlp/cnn labels,
loss, grad:<torch param name>) for NAME in mlp, cnn, encoder.
"""
from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from onnx_torch_models import NAMES, export, reference  # noqa: E402

OUT = os.path.join(HERE, "..", "tests", "fixtures", "onnx")


def main() -> int:
    os.makedirs(OUT, exist_ok=True)
    for name in NAMES:
        path = export(name, os.path.join(OUT, f"{name}.onnx"))
        refs = {}
        for batch in (2, 5):
            for k, v in reference(name, batch, seed=batch).items():
                refs[f"b{batch}/{k}"] = v
        np.savez_compressed(os.path.join(OUT, f"{name}_ref.npz"), **refs)
        print(f"wrote {path} ({os.path.getsize(path)} bytes) and {name}_ref.npz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
