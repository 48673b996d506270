"""PyTorch models exported to ONNX for rlxc's import tests, examples and benchmarks.

    build(name) -> (torch module in eval mode, example input)
    export(name, path, batch) -> path: torch.onnx.export (TorchScript exporter) with a
        dynamic batch axis "batch" on input "x" and output "y"
    reference(name, batch, seed) -> dict: inputs, labels, outputs, the cross-entropy
        loss and its gradient for every torch parameter (autograd), by torch name

Models (seeded, small): "mlp" digits 64-32-10; "cnn" digits 1x8x8 conv-bn-relu-pool x2,
global average pool, linear; "encoder" a post-norm transformer encoder layer
(d=32, 4 heads, ff 64, GELU), (batch, 6, 32). scripts/export_onnx_fixtures.py writes the
committed copies in tests/fixtures/onnx/ (so tests without torch still check them).
torch is imported only inside the functions.
"""
from __future__ import annotations

import numpy as np

NAMES = ("mlp", "cnn", "encoder")
# Exported without constant folding so BatchNormalization stays its own node (and
# params keep their torch names) instead of being folded into the conv weights.
SEQ = 6


def build(name: str):
    import torch
    from torch import nn

    torch.manual_seed({"mlp": 1, "cnn": 2, "encoder": 3}[name])
    if name == "mlp":
        m = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        x = torch.randn(2, 64)
    elif name == "cnn":
        m = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
        with torch.no_grad():   # non-trivial running statistics
            for bn in (m[1], m[5]):
                bn.running_mean.uniform_(-0.2, 0.2)
                bn.running_var.uniform_(0.5, 1.5)
        x = torch.randn(2, 1, 8, 8)
    elif name == "encoder":
        m = _encoder_layer(32, 4, 64)
        x = torch.randn(2, SEQ, 32)
    else:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(NAMES)}")
    return m.eval(), x


def _encoder_layer(d: int, heads: int, ff: int):
    """A post-norm transformer encoder layer (nn.TransformerEncoderLayer's structure, GELU,
    no dropout), written out: torch's own layer does not trace for the ONNX exporter."""
    import torch
    from torch import nn

    class EncoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).reshape(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            att = torch.softmax(q @ k.transpose(-2, -1) / (d // heads) ** 0.5, dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, d)
            x = self.norm1(x + self.proj(y))
            return self.norm2(x + self.ff2(nn.functional.gelu(self.ff1(x))))

    return EncoderLayer()


def export(name: str, path) -> str:
    import torch

    m, x = build(name)
    torch.onnx.export(m, (x,), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=17,
                      do_constant_folding=False, dynamo=False)
    return str(path)


def input_shape(name: str, batch: int) -> tuple:
    return {"mlp": (batch, 64), "cnn": (batch, 1, 8, 8), "encoder": (batch, SEQ, 32)}[name]


def reference(name: str, batch: int, seed: int = 0) -> dict:
    """Inputs, labels, outputs, loss and per-parameter gradients computed by PyTorch."""
    import torch

    m, _ = build(name)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=input_shape(name, batch)).astype(np.float32)
    out = m(torch.from_numpy(x))
    ref = {"x": x, "y": out.detach().numpy()}
    if name in ("mlp", "cnn"):
        labels = (np.arange(batch) % 10).astype(np.int32)
        loss = torch.nn.functional.cross_entropy(out, torch.from_numpy(labels).long())
        m.zero_grad()
        loss.backward()
        ref["labels"] = labels
        ref["loss"] = np.float32(loss.item())
        for k, p in m.named_parameters():
            ref["grad:" + k] = p.grad.numpy().copy()
    return ref
