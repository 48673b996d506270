"""The backend registry (rlxc/registry.py, runtime/targets.py) and the one native call
path (runtime/call.py): devices, the automatic choice, a third target as one entry,
the loader's refusal of foreign code, and the module-boundary rules."""
import ast
import hashlib
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from rlxc import Func, registry
from rlxc.optim import SGD
from rlxc.registry import CpuBackend, InterpBackend
from rlxc.runtime import targets
from rlxc.runtime.errors import ArtifactError
from rlxc.runtime.targets import Target, TargetUnavailable

ROOT = pathlib.Path(__file__).resolve().parents[1]
F32 = np.float32


def addone():
    return Func("addone", lambda s: s.input("x", (3,)) + 1.0)


@pytest.fixture
def scratch(monkeypatch):
    """Backends registered by a test are removed after it; the originals come back."""
    before = {n: registry.backend(n) for n in registry.devices()}
    monkeypatch.delenv("RLXC_DEVICE", raising=False)
    yield
    for n in registry.devices():
        if n not in before:
            registry.unregister(n)
    for b in before.values():
        registry.register(b)


class Recording(InterpBackend):
    """The interpreter under another name, counting its executor calls."""

    def __init__(self, name, priority):
        super().__init__(name, None, priority)
        self.calls = 0

    def executor(self, func, **options):
        self.calls += 1
        return super().executor(func, **options)


def test_devices_come_from_the_registry(scratch):
    cross = ["aarch64-linux-gnu", "x86_64-linux-gnu"]   # CPU cross targets, run by name only
    assert registry.devices() == ["cpu", "cuda", "interp"] + cross
    assert registry.native_devices() == ["cpu", "cuda"] + cross
    with pytest.raises(ValueError, match=r"unknown device 'toy'; valid: \['cpu', 'cuda', "):
        addone().run_on("toy", x=[1, 2, 3])
    rec = registry.register(Recording("toy", priority=-1))
    out = addone().run_on("toy", x=[1, 2, 3])
    np.testing.assert_array_equal(out[0], [2, 3, 4])
    assert rec.calls == 1 and "toy" in registry.devices()
    with pytest.raises(ValueError, match="'toy' is not a native backend"):
        addone().jit_on("toy")


def test_run_without_device_picks_the_best_available_backend(scratch, monkeypatch):
    """run() uses the available backend of highest priority; RLXC_DEVICE overrides."""
    assert registry.default_device() == ("cuda" if registry.backend("cuda").available()
                                         else "cpu")
    rec = registry.register(Recording("best", priority=100))
    assert registry.default_device() == "best"
    np.testing.assert_array_equal(addone().run(x=[0, 1, 2])[0], [1, 2, 3])
    assert rec.calls == 1
    monkeypatch.setenv("RLXC_DEVICE", "cpu")
    assert registry.default_device() == "cpu"
    addone().run(x=[0, 1, 2])
    assert rec.calls == 1
    monkeypatch.setenv("RLXC_DEVICE", "tpu")
    with pytest.raises(ValueError, match=r"RLXC_DEVICE='tpu'; valid: \['cpu', 'cuda'"):
        addone().run(x=[0, 1, 2])


def test_a_usable_gpu_wins_over_the_cpu(scratch, monkeypatch):
    cuda = registry.backend("cuda")
    monkeypatch.setattr(type(cuda), "unavailable_reason", lambda self: None)
    registry.register(cuda)  # forget the choice made before
    assert registry.default_device() == "cuda"
    monkeypatch.setattr(type(cuda), "unavailable_reason", lambda self: "no GPU")
    registry.register(cuda)
    assert registry.default_device() == "cpu"


def _toyarm():
    return CpuBackend(Target("toyarm", "cpu", triple="aarch64-unknown-linux-gnu",
                             machines=("toyarm64",)), default_cpu="generic")


def test_a_third_target_is_one_registry_entry(scratch, tmp_path):
    """A CPU for another triple: a --target and --emit choice, refused when run here."""
    from rlxc.cli.main import main

    b = registry.register(_toyarm())
    assert "toyarm" in registry.artifact_targets() and targets.target("toyarm").triple
    assert b.codegen_options() == {"cpu": "toyarm:generic"}   # the lowering's cpu string
    src = tmp_path / "m.py"
    src.write_text("from rlxc import Func\n"
                   "def m():\n    return Func('m', lambda s: s.input('x', (3,)) * 2.0)\n")
    r = CliRunner().invoke(main, ["compile", f"{src}:m", "--target", "toyarm", "--emit", "rlx"])
    assert r.exit_code == 0 and "rlx.mul" in r.output, r.output
    r = CliRunner().invoke(main, ["compile", f"{src}:m", "--target", "toyarm", "--emit", "ptx"])
    assert r.exit_code == 2 and "not a stage of --target toyarm" in r.output, r.output
    assert "--target cuda" in r.output
    with pytest.raises(TargetUnavailable, match="builds code for toyarm64, this machine is"):
        addone().run_on("toyarm", x=[1, 2, 3])
    with pytest.raises(TargetUnavailable):
        addone().jit_on("toyarm")
    registry.unregister("toyarm")
    r = CliRunner().invoke(main, ["compile", f"{src}:m", "--target", "toyarm", "--emit", "rlx"])
    assert r.exit_code == 2 and "'cpu', 'cuda'" in r.output


def _fake_artifact(d, target):
    lib = d / "libm.so"
    lib.write_bytes(b"not an ELF file")
    from rlxc.runtime.loader import ABI_VERSION

    meta = {"format": "rlxc-artifact", "abi_version": ABI_VERSION, "name": "m",
            "target": target, "rlxc_version": "0", "ir_hash": "0" * 64, "library": "libm.so",
            "library_sha256": hashlib.sha256(lib.read_bytes()).hexdigest(),
            "library_size": lib.stat().st_size, "cpu": "native", "cpu_features": [],
            "inputs": [{"name": "x", "shape": [3], "dtype": "f32"}],
            "outputs": [{"name": "out0", "shape": [3], "dtype": "f32"}], "params": []}
    (d / "m.json").write_text(json.dumps(meta))
    return d


def test_loader_refuses_code_for_another_machine(scratch, tmp_path):
    """The runtime half of a cross target: the loader refuses before dlopen."""
    from rlxc.runtime import load

    with pytest.raises(ArtifactError, match=r"target 'toyarm' is not one of \['cpu', 'cuda'"):
        load(_fake_artifact(tmp_path, "toyarm"))
    targets.register_target(Target("toyarm", "cpu", machines=("toyarm64",)))
    with pytest.raises(ArtifactError, match="cannot run here: target 'toyarm' builds code "
                                            "for toyarm64"):
        load(tmp_path)
    with pytest.raises(ArtifactError, match="not an ELF file"):  # the host's target: ELF check
        load(_fake_artifact(tmp_path, "cpu"))
    targets.unregister_target("toyarm")


def test_runtime_half_does_not_import_the_compiler():
    code = ("import sys, rlxc.runtime.targets, rlxc.runtime.loader, rlxc.runtime.call, "
            "rlxc.registry\n"
            "bad = [m for m in ('xdsl', 'llvmlite', 'rlxc.lowering', 'rlxc.func') "
            "if m in sys.modules]\nassert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def _imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            yield node.module or "", [a.name for a in node.names], node.level
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, [], 0


@pytest.mark.parametrize("folder", ["rlxc", "runtime", "cli", "lowering", "dialect"])
def test_no_module_imports_another_modules_private_name(folder):
    bad = [f"{p.relative_to(ROOT)}: from {mod} import {n}"
           for p in sorted((ROOT / folder).rglob("*.py"))
           for mod, names, _ in _imports(p) for n in names
           if n.startswith("_") and not n.startswith("__")]
    assert not bad, bad


@pytest.mark.parametrize("importer, imported", [
    ("train.py", "func"), ("trainer.py", "func"),  # func -> train -> trainer, one way
    ("backends.py", "registry"),                   # registry -> backends, one way
])
def test_no_import_circle(importer, imported):
    mods = [(m, lvl) for m, _, lvl in _imports(ROOT / "rlxc" / importer)]
    assert (imported, 1) not in mods and (f"rlxc.{imported}", 0) not in mods, mods


def test_jitted_and_trainer_share_the_call_path():
    from rlxc.runtime.call import CallFrame, ResidentCall

    j = addone().jit_on("cpu")
    np.testing.assert_array_equal(j.run(np.zeros(3, F32))[0], [1, 1, 1])
    assert isinstance(j._caller._state(), CallFrame)
    f = Func("q", lambda s: (s.param("w", (3,)) * s.input("x", (3,))).sum()).with_param(
        "w", np.ones(3, F32))
    tr = f.trainer(SGD(0.1), device="cpu")
    assert isinstance(tr._engine, ResidentCall)
    assert all(isinstance(fr, CallFrame) for fr in tr._engine.frames)


def test_resident_call_checks_that_outputs_fit_the_state():
    from rlxc.backends import library
    from rlxc.runtime.call import ResidentCall

    g = Func("twice", lambda s: [s.input("x", (3,)) * 2.0, s.input("y", (2,)) + 1.0])
    lib = library(g)
    with pytest.raises(ValueError, match="a resident call of 2 state arguments needs 3"):
        ResidentCall(lib, [np.zeros(3, F32), np.zeros(2, F32)], [0, 1])
    with pytest.raises(ValueError, match=r"output 1 is float32 \(2,\), but it feeds input 'x'"):
        ResidentCall(lib, [np.zeros(3, F32), np.zeros(2, F32)], [0])
    rc = ResidentCall(lib, [None, np.arange(2, dtype=F32)], [1])
    with pytest.raises(ValueError, match=r"arguments \['x'\] are not set"):
        rc.run()  # a NULL input pointer would crash the kernel
    rc.set_arg(0, np.ones(3, F32))
    np.testing.assert_array_equal(rc.run(), [2, 2, 2])
    rc.run()
    np.testing.assert_array_equal(rc.read()[0], [2, 3])  # y fed back twice
    with pytest.raises(ValueError, match="is state"):
        rc.set_arg(1, np.zeros(2, F32))
    from rlxc.runtime.errors import ShapeError

    with pytest.raises(ShapeError, match=r"input 'y' expects shape \(2,\), got \(5,\)"):
        ResidentCall(lib, [np.zeros(3, F32), np.zeros(5, F32)], [1])


def test_trainer_feeds_a_noncontiguous_quantizer_result_correctly():
    """A callable quantizer may return a strided view: the native engine must see its
    values, not the memory its data pointer starts at."""
    def build(s):
        d = s.param("w", (8,)) * s.input("x", (8,)) - 1.0
        return (d * d).sum()

    f = Func("qv", build).with_param("w", np.linspace(-1, 1, 8, dtype=F32))
    x = {"x": np.linspace(0.5, 1.5, 8, dtype=F32)}

    def strided(name, a):
        return np.ascontiguousarray(a[::-1])[::-1]  # a's values, negative stride

    ref = f.trainer(SGD(0.05), quant=lambda n, a: a.copy(), device="cpu")
    tr = f.trainer(SGD(0.05), quant=strided, device="cpu")
    for _ in range(3):
        assert tr.step(x) == ref.step(x)
    np.testing.assert_array_equal(tr.func.params()["w"], ref.func.params()["w"])


def test_backend_compile_hooks():
    """`compile(module)` of each compiling backend: the CPU's object code, the GPU's PTX."""
    f = addone()
    art = registry.backend("cpu").compile(f.module, "addone", link=False)
    assert art.entry == "rlx_addone" and art.object[:4] == b"\x7fELF"
    assert [a["name"] for a in art.args] == ["x"]
    gpu = registry.backend("cuda").compile(f.module, "addone", ptxas=False)
    assert ".entry" in gpu.ptx
    with pytest.raises(ValueError, match="backend 'interp' has no compiler"):
        registry.backend("interp").compile(f.module)
    assert registry.backend("cpu").emit("loops", f.module, "addone", "native").strip()
    with pytest.raises(ValueError, match="backend 'cpu' has no --emit stage 'ptx'"):
        registry.backend("cpu").emit("ptx", f.module, "addone", "native")


def test_a_cross_target_says_what_the_lowering_lacks(scratch):
    """A registry entry with no lowering description (lowering/cpu/target.py TARGETS)
    of the same name is refused by the lowering, naming the known ones."""
    f = addone()
    b = registry.register(_toyarm())
    with pytest.raises(ValueError, match="unknown CPU target 'toyarm'.*aarch64-linux-gnu"):
        b.compile(f.module, "addone")
    with pytest.raises(ValueError, match="unknown CPU target 'toyarm'"):
        b.emit("asm", f.module, "addone", None)


def test_backend_load_reads_its_own_artifacts(tmp_path):
    from rlxc.export import spec_from_func

    f = addone()
    out = tmp_path / "a"
    meta = registry.backend("cpu").write_artifact(spec_from_func(f, "addone"), str(out))
    assert meta["target"] == "cpu"
    m = registry.backend("cpu").load(out)
    np.testing.assert_array_equal(m.run(x=[1, 2, 3])[0], [2, 3, 4])
    with pytest.raises(ArtifactError, match="built for --target cpu, not cuda"):
        registry.backend("cuda").load(out)


def test_bench_cpu_option_reaches_jit_and_trainer(monkeypatch):
    """benchmarks/compare.py --cpu X: Func.jit / Trainer pass no cpu option, so the cpu
    backend's default must become X (it silently stayed the host before)."""
    import os
    import sys

    from rlxc.registry import backend

    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    monkeypatch.syspath_prepend(here)
    compare = __import__("compare")
    b = backend("cpu")
    monkeypatch.setattr(b, "default_cpu", b.default_cpu)
    assert compare.use_cpu("portable") == "x86-64-v3"
    assert b.cpu_string(None) == "x86-64-v3"
    sys.modules.pop("compare", None)
