"""examples/train_gpt.py end to end: it trains (the loss goes down), prints a sample,
and the model exported by `rlxc compile` generates the same text from C
(examples/embed_c/gen_gpt.c, greedy) as the Python generator does."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE = os.path.join(ROOT, "examples", "train_gpt.py")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                    reason="needs cc and make")
def test_train_gpt_then_generate_from_c(tmp_path):
    out = tmp_path / "train"
    p = subprocess.run([sys.executable, EXAMPLE, "--steps", "80", "--sample", "40",
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr           # 0: the last loss < the first
    assert "sample (greedy" in p.stdout
    text = p.stdout.split("sample (greedy, after ")[1]
    prompt_repr, body = text.split("):\n", 1)
    prompt = eval(prompt_repr)                               # the repr the script printed
    py_sample = body.split("\nparams and vocabulary")[0][len(prompt):]
    assert len(py_sample) == 40

    build = tmp_path / "c"
    rlxc_cmd = f"{sys.executable} -m rlxc.cli.main"
    m = subprocess.run(["make", "-C", os.path.join(ROOT, "examples", "embed_c"), "gpt",
                        f"BUILD={build}", f"GPT_DIR={out}", f"RLXC={rlxc_cmd}"],
                       capture_output=True, text=True, timeout=600)
    assert m.returncode == 0, m.stdout + m.stderr
    g = subprocess.run([str(build / "gen_gpt"), str(out / "vocab.txt"), "40", prompt],
                       capture_output=True, text=True, timeout=120)
    assert g.returncode == 0, g.stderr
    assert g.stdout[:-1] == py_sample


def test_bundled_text_is_ours_and_small():
    path = os.path.join(ROOT, "examples", "data", "compilers.txt")
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    assert 1000 < len(text) < 20000 and "compiler" in text
