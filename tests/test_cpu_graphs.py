"""Whole graphs on the native CPU backend against the interpreter, plus fusion checks.

Random graphs come from hypothesis (tests/randgraph.py, and a generator here
with broadcasting, reductions over random axes and view ops on varied shapes);
each example compiles one function, so the example counts are modest.
Tolerance rtol 1e-4 / atol 1e-5: compositions of ops amplify the few-ulp
differences of transcendentals and of reassociated sums.
"""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlxc
from rlxc import Func
from rlxc.lowering.cpu import driver as cpu
from rlxc.lowering.cpu.buffers import peak_without_reuse
from rlxc.lowering.cpu.loops import LoopKernel, MatmulKernel

import randgraph

RNG = np.random.default_rng(7)


def agree(f, inputs, rtol=1e-4, atol=1e-5):
    got = f.run_on("cpu", **inputs)
    ref = f.run_on("interp", **inputs)
    for k, (g, r) in enumerate(zip(got, ref)):
        assert g.shape == r.shape and g.dtype == r.dtype, k
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol, equal_nan=True,
                                   err_msg=f"output {k}\n{cpu.emit_loops(f.module)}")
    return got


# ---------------------------------------------------------------- random graphs

@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(recipe=randgraph.steps, seed=st.integers(0, 1000))
def test_random_graphs_randgraph(recipe, seed):
    agree(randgraph.build_func(recipe), randgraph.inputs(seed))


BASES = [(2, 3, 4), (5, 7), (1, 9), (17,), (3, 1, 33)]
UN = ["tanh", "sigmoid", "relu", "abs", "neg", "exp_c", "silu", "sin"]


def _sub_shapes(shape):
    """Shapes that broadcast against `shape`: trailing dims, and dims set to 1."""
    out = [shape, shape[-1:], ()]
    out += [tuple(1 if j == i else d for j, d in enumerate(shape)) for i in range(len(shape))]
    return out


def _step(s, vals, kind, a, b, c):
    x = vals[a % len(vals)]
    y = vals[b % len(vals)]
    if kind in UN:
        return (x.tanh() * 2.0).exp() if kind == "exp_c" else getattr(x, kind)()
    if kind in ("add", "mul", "sub", "max"):
        try:
            return {"add": lambda: x + y, "mul": lambda: x * y, "sub": lambda: x - y,
                    "max": lambda: x.maximum(y)}[kind]()
        except rlxc.ShapeError:
            return x * 0.5
    if kind == "reduce":
        if not x.shape:
            return x + 1.0
        axes = tuple(sorted({c % len(x.shape), (c // 7) % len(x.shape)}))
        r = [x.sum, x.max, x.mean][c % 3](axes, keepdims=bool(b % 2))
        try:
            return x - r if b % 2 else r
        except rlxc.ShapeError:
            return r
    if kind == "transpose":
        return x.transpose(*reversed(range(len(x.shape)))) if x.shape else x
    if kind == "reshape":
        return x.reshape(-1) if len(x.shape) != 1 else x.reshape(1, x.shape[0], 1)
    if kind == "slice":
        if not x.shape or x.shape[0] < 2:
            return x
        return x[1:] if c % 2 else x[::2]
    if kind == "where":
        try:
            return x.gt(y).where(x, y)
        except rlxc.ShapeError:
            return x
    raise AssertionError(kind)


graph_steps = st.lists(st.tuples(st.sampled_from(UN + ["add", "mul", "sub", "max", "reduce",
                                                       "transpose", "reshape", "slice",
                                                       "where"]),
                                 st.integers(0, 60), st.integers(0, 60), st.integers(0, 60)),
                       min_size=1, max_size=10)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=graph_steps, base=st.sampled_from(BASES), pick=st.integers(0, 100),
       seed=st.integers(0, 1000))
def test_random_graphs_broadcast_views(steps, base, pick, seed):
    subs = _sub_shapes(base)
    shapes = [base, subs[pick % len(subs)]]

    def build(s):
        vals = [s.input(f"x{i}", sh) for i, sh in enumerate(shapes)]
        for st_ in steps:
            vals.append(_step(s, vals, *st_))
        return vals[-1], vals[len(vals) // 2].sum(), vals[-1] * 1.0

    rng = np.random.default_rng(seed)
    inputs = {f"x{i}": rng.uniform(-1.5, 1.5, sh).astype(np.float32)
              for i, sh in enumerate(shapes)}
    agree(Func("rgraph", build), inputs)


# ---------------------------------------------------------------- models and transforms

def _mlp(sizes, batch):
    def build(s):
        h = s.input("x", (batch, sizes[0]))
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            h = h @ s.param(f"w{i}", (a, b)) + s.param(f"b{i}", (b,))
            if i < len(sizes) - 2:
                h = h.relu()
        return h
    return Func("mlp", build).init_randn(0, 0.05)


def test_mlp_forward_784_512_512_10():
    f = _mlp([784, 512, 512, 10], 16)
    x = RNG.standard_normal((16, 784)).astype(np.float32)
    agree(f, {"x": x}, rtol=1e-4, atol=1e-5)
    prog = cpu.lower(f.module)
    mms = [m for k in prog.kernels for m in getattr(k, "steps", [k])   # matmul_chain.py
           if isinstance(m, MatmulKernel)]
    assert len(mms) == 3 and all(k.epilogue is not None for k in mms), \
        "bias (+relu) should be fused into the sgemm epilogue"
    assert not [k for k in prog.kernels if isinstance(k, LoopKernel)]


def test_mlp_value_and_grad_and_softmax_ce():
    def build(s):
        x, y = s.input("x", (8, 12)), s.input("y", (8,), "i32")
        h = (x @ s.param("w1", (12, 16)) + s.param("b1", (16,))).gelu()
        logits = h @ s.param("w2", (16, 5))
        return logits.cross_entropy(y) + h.layer_norm().mean() * 0.1

    f = Func("ce", build).init_randn(1, 0.3)
    inputs = {"x": RNG.standard_normal((8, 12)).astype(np.float32),
              "y": RNG.integers(0, 5, 8).astype(np.int32)}
    agree(f, inputs)
    agree(f.value_and_grad_all(), inputs, rtol=2e-4, atol=2e-5)


def test_vmap_and_jvp():
    def build(s):
        x = s.input("x", (4, 6))
        return (x.softmax() * s.param("w", (6,))).sum(1).tanh()

    f = Func("vj", build).init_randn(2, 1.0)
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    agree(f.vmap("x", 3), {"x": np.stack([x, 2 * x, -x])})
    agree(f.jvp("x"), {"x": x, "tangent_x": np.ones_like(x)})


def test_outputs_aliasing_inputs_and_each_other():
    def build(s):
        x = s.input("x", (3, 4))
        y = x.exp()
        return [x, y, y, x.T, s.constant(np.arange(4, dtype=np.float32)), s.scalar(2.0)]

    x = RNG.standard_normal((3, 4)).astype(np.float32)
    got = agree(Func("alias", build), {"x": x})
    assert got[1] is not got[2] and got[0] is not x


# ---------------------------------------------------------------- fusion and buffers

def test_elementwise_chain_and_reduction_are_one_kernel():
    n = 1 << 20

    def build(s):
        x, a, b = s.input("x", (n,)), s.input("a", ()), s.input("b", ())
        return ((x * a + b).tanh() * x.sigmoid()).sum()

    prog = cpu.lower(Func("fused", build).module)
    kinds = [k.name.split("_", 1)[1] for k in prog.kernels]
    assert kinds == ["reduce_chunks", "reduce_combine"], kinds
    temps = [b for b in prog.buffers if b.kind == "temp" and b.first >= 0]
    assert [b.numel for b in temps] == [64]  # only the chunk partials touch memory


def test_broadcast_and_transpose_are_index_maps():
    def build(s):
        x, b = s.input("x", (64, 32)), s.input("b", (32,))
        return (x.T + b.reshape(32, 1)).T.exp() * 2.0

    prog = cpu.lower(Func("views", build).module)
    assert len(prog.kernels) == 1 and prog.workspace_size == 0


def test_workspace_reuses_dead_buffers():
    def build(s):
        h = s.input("x", (64, 64))
        for _ in range(6):  # each step's output is a workspace temp the next one reads
            h = h.softmax() * 3.0   # (its exp() rows and row stats are per-thread blocks)
        return h

    f = Func("reuse", build)
    prog = cpu.lower(f.module)
    # five 64 x 64 temps (and their row maxima), at most two of them live at once
    assert prog.workspace_size < peak_without_reuse(prog) / 2
    agree(f, {"x": RNG.standard_normal((64, 64)).astype(np.float32)})


def test_stage_printers():
    f = Func("printers", lambda s: (s.input("x", (1000,)) * 2.0 + 1.0).tanh())
    loops = cpu.emit_loops(f.module)
    assert "kernel k1_map" in loops and "tanh(add(mul(%in0_x[i0], 2.0), 1.0))" in loops
    raw = cpu.emit_llvm(f.module)
    assert 'define i32 @"rlx_printers"' in raw or "define i32 @rlx_printers" in raw
    assert "noalias" in raw and "getelementptr inbounds" in raw and "ptrtoint" not in raw
    opt = cpu.emit_llvm(f.module, optimized=True)
    assert "<8 x float>" in opt or "<16 x float>" in opt, "loop was not vectorized"
    asm = cpu.emit_asm(f.module)
    assert "ymm" in asm or "zmm" in asm
    art = cpu.compile_cpu(f.module, "printers", link=False)
    assert art.object[:4] == b"\x7fELF" and art.so_path is None
