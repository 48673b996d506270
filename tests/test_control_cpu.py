"""Control flow on the native CPU backend (issue 16): region ops lowered to native loops
(lowering/cpu/regions.py), checked against the reference interpreter; grads, vmap(grad),
index errors inside a body, the Trainer and an AOT artifact with --train."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import rlxc
from rlxc import Func

pytest.importorskip("rlxc.lowering.cpu.driver", reason="lowering/cpu/driver.py not available")

RNG = np.random.default_rng(1)
F32 = np.float32


def close(got, want, tol=2e-5):
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                   rtol=tol, atol=tol)


def gru_build(T=6, B=4, D=3, H=5):
    """A GRU over a sequence with rlxc.scan; loss: mean squared readout of every step."""
    def build(s):
        x = s.input("x", (T, B, D))
        y = s.input("y", (B,))
        wx = s.param("wx", (D, 3 * H))
        wh = s.param("wh", (H, 3 * H))
        wo = s.param("wo", (H, 1))

        def cell(h, xt):
            gx, gh = xt @ wx, h @ wh
            z = (gx[:, :H] + gh[:, :H]).sigmoid()
            r = (gx[:, H:2 * H] + gh[:, H:2 * H]).sigmoid()
            n = (gx[:, 2 * H:] + r * gh[:, 2 * H:]).tanh()
            h2 = (1.0 - z) * n + z * h
            return h2, (h2 @ wo).reshape(B)
        h, outs = rlxc.scan(cell, s.constant(np.zeros((B, H), F32)), x)
        return ((outs[-1] - y) ** 2).mean() + (outs ** 2).mean() * 0.01
    return Func("gru", build)


def gru_data(T=6, B=4, D=3):
    return {"x": RNG.standard_normal((T, B, D)).astype(F32),
            "y": RNG.standard_normal(B).astype(F32)}


@pytest.fixture(scope="module")
def gru():
    return gru_build().init_randn(seed=3, stddev=0.4)


def nested_build(fori=True):
    """A reverse scan whose body holds a cond, then a while_loop over its carry (and, with
    `fori`, a fori_loop): the nesting the CPU and GPU tests both run."""
    def build(s):
        x = s.input("x", (5, 4))
        p = s.input("p", (), "i1")
        w = s.input("w", (4,))

        def body(c, xt):
            nc = rlxc.cond(p, lambda a: (a + w * xt).tanh(), lambda a: a * 0.5 - xt, c)
            return nc, nc.sum()
        c, ys = rlxc.scan(body, w, x, reverse=True)
        n, v = rlxc.while_loop(lambda q: q[1].abs().sum() < 50.0,
                               lambda q: (q[0] + 1, q[1] * 2.0 + 0.5), (s.scalar(0, "i32"), c))
        if not fori:
            return c, ys, n, v
        k = rlxc.fori_loop(0, 7, lambda i, a: a + i.cast("f32") * w, w)
        return c, ys, n, v, k
    return Func("nest", build)


def test_scan_while_if_nested_match_the_interpreter():
    f = nested_build()
    for p in (True, False):
        d = {"x": RNG.standard_normal((5, 4)).astype(F32), "w": RNG.standard_normal(4).astype(F32),
             "p": np.bool_(p)}
        close(f.run(**d), f.run_on("interp", **d))


def test_grad_and_per_example_grads_compiled(gru):
    d = gru_data()
    g = gru.value_and_grad(["wx", "wh", "wo"])
    close(g.run(**d), g.run_on("interp", **d), 1e-4)
    pe = gru.grad(["wh"]).vmap(["x", "y"], 3)
    db = {"x": RNG.standard_normal((3, 6, 4, 3)).astype(F32),
          "y": RNG.standard_normal((3, 4)).astype(F32)}
    close(pe.run(**db), pe.run_on("interp", **db), 1e-4)


def test_index_error_inside_a_body_is_an_index_error():
    def build(s):
        ids = s.input("ids", (3, 2), "i32")
        table = s.input("table", (4, 2))
        c, _ = rlxc.scan(lambda c, i: (c + table[i].sum(0), None), table[0], ids)
        return c
    f = Func("emb", build)
    t = RNG.standard_normal((4, 2)).astype(F32)
    ok = np.array([[0, 1], [2, 3], [1, 1]], np.int32)
    close(f.run(ids=ok, table=t), f.run_on("interp", ids=ok, table=t))
    with pytest.raises(IndexError, match="index out of range"):
        f.run(ids=np.array([[0, 1], [2, 9], [1, 1]], np.int32), table=t)


def test_compiled_code_does_not_grow_with_the_length():
    from rlxc.lowering.cpu.driver import emit_llvm

    def sized(T):
        text = emit_llvm(gru_build(T=T).grad(["wh"]).module, "g")
        return len([ln for ln in text.splitlines() if ln.strip()])
    assert sized(4) == sized(400)


def test_trainer_learns_with_a_scan(gru):
    d = gru_data()
    tr = gru.trainer(rlxc.optim.Adam(0.05))
    losses = [tr.step(d) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]
    # the same first step as the interpreter's train_step
    from rlxc.train import train_step
    _, l0 = train_step(gru, rlxc.optim.Adam(0.05), d, device="interp")
    np.testing.assert_allclose(losses[0], l0, rtol=1e-4)


def test_aot_artifact_with_train_runs_a_scan(gru, tmp_path):
    from rlxc import export as aot
    from rlxc.runtime import load

    spec = aot.spec_from_func(gru, "gruart")
    spec.train = aot.train_spec(gru, rlxc.optim.Adam(0.05))
    aot.build_artifact(spec, str(tmp_path / "gruart"))
    m = load(tmp_path / "gruart")
    d = gru_data()
    close(m.run(**d), gru.run_on("interp", **d), 1e-4)
    losses = [m.train_step(**d) for _ in range(20)]
    assert losses[-1] < losses[0]
    # the same library from a C program: train_step through the C ABI lowers the loss
    out = tmp_path / "gruart"
    (out / "main.c").write_text(C_TRAIN)
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    subprocess.run([cc, "-std=c99", "-I", str(out), str(out / "main.c"), "-L", str(out),
                    "-lgruart", f"-Wl,-rpath,{out}", "-lm", "-o", str(out / "main")], check=True)
    res = subprocess.run([str(out / "main")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    first, last = (float(v) for v in res.stdout.split())
    assert last < first


C_TRAIN = r"""
#include <math.h>
#include <stdio.h>
#include "gruart.h"
int main(void) {
    static float x[6 * 4 * 3], y[4];
    for (int i = 0; i < 72; i++) x[i] = (float)sin(0.37 * i);
    for (int i = 0; i < 4; i++) y[i] = (float)cos(1.3 * i);
    const float *in[2] = {x, y};
    gruart_ctx *ctx = gruart_create();
    if (!ctx || gruart_check_abi() != RLX_OK) return 2;
    float loss, first = 0;
    for (int s = 0; s < 20; s++) {
        if (gruart_train_step(ctx, in, 0.05f, &loss) != RLX_OK) return 3;
        if (s == 0) first = loss;
    }
    printf("%g %g\n", first, loss);
    gruart_destroy(ctx);
    return 0;
}
"""


def test_train_rnn_example_learns_parity():
    """examples/train_rnn.py at a small size: the GRU scan learns the parity of 8 bits."""
    from scripts import load_script

    mod = load_script("examples/train_rnn.py", "train_rnn")
    assert mod.main(["--length", "8", "--steps", "200", "--hidden", "16"]) > 0.9
