"""The AArch64 CPU target: `rlxc compile --target aarch64-linux-gnu` cross-compiles a
library, the C examples are cross-built against it and run under qemu-aarch64, and
their numbers match the host build of the same programs.

Needs Debian's `gcc-aarch64-linux-gnu` (cross compiler + sysroot) and `qemu-user`;
skipped with the reason when they are absent.  The target description itself (one
TARGETS entry) and the CLI checks are tested without them."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "embed_c")
RLXC = [sys.executable, "-m", "rlxc.cli.main"]
SYSROOT = "/usr/aarch64-linux-gnu"

have_cross = shutil.which("aarch64-linux-gnu-gcc") is not None
have_qemu = shutil.which("qemu-aarch64") is not None and os.path.isdir(SYSROOT)
needs_cross = pytest.mark.skipif(
    not have_cross, reason="aarch64-linux-gnu-gcc not found (apt-get install gcc-aarch64-linux-gnu)")
needs_qemu = pytest.mark.skipif(
    not (have_cross and have_qemu),
    reason="needs aarch64-linux-gnu-gcc and qemu-aarch64 with the sysroot "
           f"{SYSROOT} (apt-get install gcc-aarch64-linux-gnu qemu-user)")


def _rlxc_cmd(tmp_path):
    """A `rlxc` executable for the example Makefile (this interpreter, this checkout)."""
    exe = tmp_path / "rlxc"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -m rlxc.cli.main \"$@\"\n")
    exe.chmod(0o755)
    return str(exe)


def test_target_table_resolves_cpu_strings():
    from rlxc.lowering.cpu.target import TARGETS, resolve_target

    t, name, feats = resolve_target("aarch64-linux-gnu")
    assert t is TARGETS["aarch64-linux-gnu"] and t.arch == "aarch64" and name == "generic"
    t, name, _ = resolve_target("aarch64-linux-gnu:neoverse-n1")
    assert t.triple.startswith("aarch64") and name == "neoverse-n1"
    with pytest.raises(ValueError, match="unknown CPU target 'riscv9'"):
        resolve_target("riscv9:foo")


def test_sgemm_blocking_follows_the_target():
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_config

    cfg = sgemm_config("aarch64-linux-gnu")
    assert cfg.isa == "neon" and cfg.vl == 4 and cfg.nr % cfg.vl == 0


def test_cli_rejects_an_unknown_target_and_cpu(tmp_path):
    p = subprocess.run(RLXC + ["compile", f"{EXAMPLE}/model.py:mlp", "-o", str(tmp_path / "o"),
                               "--target", "sparc-sun-solaris"], capture_output=True, text=True)
    assert p.returncode != 0 and "'sparc-sun-solaris' is not one of" in p.stderr
    assert "aarch64-linux-gnu" in p.stderr
    p = subprocess.run(RLXC + ["compile", f"{EXAMPLE}/model.py:mlp", "-o", str(tmp_path / "o"),
                               "--target", "aarch64-linux-gnu", "--cpu", "skylake"],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "unknown CPU 'skylake' for --target aarch64-linux-gnu" in p.stderr


@needs_cross
def test_emit_asm_is_neon():
    p = subprocess.run(RLXC + ["compile", f"{EXAMPLE}/model.py:mlp", "--emit", "asm",
                               "--target", "aarch64-linux-gnu"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "fmla\tv" in p.stdout or "fmla v" in p.stdout      # NEON fused multiply-add
    assert "%xmm" not in p.stdout and "%ymm" not in p.stdout


@needs_cross
def test_cross_library_refuses_to_load_on_this_host(tmp_path):
    from rlxc.runtime import load
    from rlxc.runtime.errors import ArtifactError

    if os.uname().machine == "aarch64":
        pytest.skip("this host is aarch64")
    out = tmp_path / "mlp"
    p = subprocess.run(RLXC + ["compile", f"{EXAMPLE}/model.py:mlp", "-o", str(out),
                               "--target", "aarch64-linux-gnu"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    with open(out / "libmlp.so", "rb") as f:
        head = f.read(20)
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183  # EM_AARCH64
    with pytest.raises(ArtifactError, match="builds code for aarch64"):
        load(str(out))


def _numbers(text):
    vals = []
    for line in text.splitlines():
        for tok in line.replace(",", " ").split():
            try:
                vals.append(float(tok))
            except ValueError:
                pass
    return np.array(vals)


@pytest.mark.slow
@needs_qemu
def test_c_examples_under_qemu_match_the_host(tmp_path):
    rlxc = _rlxc_cmd(tmp_path)
    env = dict(os.environ)
    host, cross = tmp_path / "host", tmp_path / "a64"
    for build, extra in ((host, []), (cross, ["RLXC_FLAGS=--target aarch64-linux-gnu",
                                               "CC=aarch64-linux-gnu-gcc"])):
        p = subprocess.run(["make", "-s", "-C", EXAMPLE, f"BUILD={build}", f"RLXC={rlxc}",
                            *extra], capture_output=True, text=True, env=env, timeout=600)
        assert p.returncode == 0, p.stdout + p.stderr
    for prog in ("run_mlp", "train_tiny", "threads", "run_dyn"):
        want = subprocess.run([str(host / prog)], capture_output=True, text=True, timeout=120)
        got = subprocess.run(["qemu-aarch64", "-L", SYSROOT, str(cross / prog)],
                             capture_output=True, text=True, timeout=300)
        assert want.returncode == 0, want.stderr
        assert got.returncode == 0, f"{prog} under qemu: {got.stderr}"
        a, b = _numbers(got.stdout), _numbers(want.stdout)
        assert a.size == b.size and a.size > 0, (got.stdout, want.stdout)
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6, err_msg=prog)
