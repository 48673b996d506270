"""Matmul chains (lowering/cpu/matmul_chain.py): chained GEMMs of a small batch in one team.

Checked against NumPy (float64) at odd sizes (a partial last column panel and row
block), compiled for 3 threads, on teams of 1, 2 and 3 threads (units claimed):
an MLP whose layers split by columns (bias + relu, the built-in epilogue) and whose
narrow last layer splits by rows; called epilogues (tanh of bias, a per-row scale read
at the row a sub-block starts at) on both splits; a rebound param changes the result;
what is not a chain (a size-generic program, GEMMs that do not feed each other, one
GEMM) keeps its kernels.
"""
from __future__ import annotations

import numpy as np
import pytest

import rlxc
from rlxc.lowering.cpu.driver import lower
from rlxc.lowering.cpu.matmul_chain import MatmulChain

PARTS = 3


@pytest.fixture
def parts3(monkeypatch):
    import rlxc.backends as backends

    monkeypatch.setattr(backends, "_libs", {})
    monkeypatch.setenv("RLXC_MAX_THREADS", str(PARTS))    # libraries compiled for 3 threads
    monkeypatch.setenv("RLXC_ADAPTIVE_THREADS", "0")       # every call uses the count set


def _chains(f, cpu="native"):
    return [k for k in lower(f.module, "chk", cpu=cpu, max_threads=PARTS).kernels
            if isinstance(k, MatmulChain)]


def _params(sizes, seed):
    rng = np.random.default_rng(seed)
    return {**{f"w{i}": (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
               for i, (a, b) in enumerate(zip(sizes, sizes[1:]))},
            **{f"b{i}": rng.standard_normal(b).astype(np.float32)
               for i, b in enumerate(sizes[1:])}}


def _mlp(n, sizes, act="relu"):
    def build(s):
        h = s.input("x", (n, sizes[0]))
        for i in range(len(sizes) - 1):
            h = h.linear(s.param(f"w{i}", (sizes[i], sizes[i + 1])),
                         s.param(f"b{i}", (sizes[i + 1],)))
            if i < len(sizes) - 2:
                h = getattr(h, act)()
        return h
    return build


def _ref(p, x, nl, act=np.tanh):
    h = x.astype(np.float64)
    for i in range(nl):
        h = h @ p[f"w{i}"].astype(np.float64) + p[f"b{i}"]
        if i < nl - 1:
            h = act(h)
    return h


def _runs(j, *args):
    out = []
    for t in (1, 2, PARTS):
        j.set_num_threads(t)
        out.append((t, j.run(*args)[0]))
    return out


@pytest.mark.parametrize("n", [37, 130])
def test_mlp_chain_splits_columns_and_rows(parts3, n):
    sizes = (300, 520, 400, 10)
    p = _params(sizes, n)
    f = rlxc.Func(f"chain{n}", _mlp(n, sizes)).with_params(p)
    (ch,) = _chains(f)
    assert len(ch.steps) == 3 and ch.splits == ["cols", "cols", "rows"], ch.splits
    x = np.random.default_rng(1).standard_normal((n, sizes[0])).astype(np.float32)
    want = _ref(p, x, 3, lambda h: np.maximum(h, 0))
    j = f.jit()
    for t, got in _runs(j, x):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=f"{t} threads")
    # a rebound param is what the next call computes with (nothing is kept from before)
    p2 = dict(p, w1=-p["w1"], b2=p["b2"] + 1)
    j2 = f.with_params(p2).jit()
    want2 = _ref(p2, x, 3, lambda h: np.maximum(h, 0))
    assert np.abs(want2 - want).max() > 0.5
    for t, got in _runs(j2, x):
        np.testing.assert_allclose(got, want2, rtol=2e-4, atol=2e-4, err_msg=f"{t} threads")


def test_called_epilogues_move_with_the_sub_block(parts3):
    """tanh(x @ w + b) (a called epilogue, bias at the column a share starts at), then a
    narrow product scaled per row (a load at the row a share starts at)."""
    n, sizes = 70, (400, 300, 7)

    def build(s):
        x = s.input("x", (n, sizes[0]))
        r = s.input("r", (n, 1))
        h = x.linear(s.param("w0", sizes[:2]), s.param("b0", (sizes[1],))).tanh()
        return (h @ s.param("w1", sizes[1:])) * r
    p = _params(sizes, 3)
    p.pop("b1")
    f = rlxc.Func("chainepi", build).with_params(p)
    (ch,) = _chains(f)
    assert ch.splits == ["cols", "rows"] and all(s.epilogue is not None for s in ch.steps)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((n, sizes[0])).astype(np.float32)
    r = rng.standard_normal((n, 1)).astype(np.float32)
    want = np.tanh(x.astype(np.float64) @ p["w0"] + p["b0"]) @ p["w1"].astype(np.float64) * r
    j = f.jit()
    for t, got in _runs(j, x, r):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=f"{t} threads")


def test_mlp_loss_chain_matches_numpy(parts3):
    """W3's shape (a loss after the chain), smaller: the chain's outputs feed later kernels."""
    n, sizes = 64, (256, 320, 256, 10)
    p = _params(sizes, 7)

    def build(s):
        return _mlp(n, sizes)(s).cross_entropy(s.input("y", (n,), "i32"))
    f = rlxc.Func("chainloss", build).with_params(p)
    assert len(_chains(f)) == 1
    rng = np.random.default_rng(8)
    x = rng.standard_normal((n, sizes[0])).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    z = _ref(p, x, 3, lambda h: np.maximum(h, 0))
    z = z - z.max(-1, keepdims=True)
    want = -(z - np.log(np.exp(z).sum(-1, keepdims=True)))[np.arange(n), y].mean()
    for t, got in _runs(f.jit(), x, y):
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"{t} threads")


def test_what_is_not_a_chain_keeps_its_kernels(parts3):
    n = 40

    def independent(s):   # two GEMMs of one input: neither reads the other
        x = s.input("x", (n, 512))
        return x @ s.param("a", (512, 256)), x @ s.param("b", (512, 256))
    f = rlxc.Func("nochain", independent).init_randn(seed=1, stddev=0.1)
    assert _chains(f) == []
    single = rlxc.Func("single", _mlp(n, (512, 256))).init_randn(seed=1, stddev=0.1)
    assert _chains(single) == []
    # a size-generic program (dynsizes merges sampled programs kernel by kernel)
    dyn = rlxc.Func("dynchain", _mlp("B", (300, 520, 10)))
    p = _params((300, 520, 10), 2)
    dyn = dyn.with_params(p)
    x = np.random.default_rng(2).standard_normal((40, 300)).astype(np.float32)
    got = dyn.run(x=x)[0]
    np.testing.assert_allclose(got, _ref(p, x, 2, lambda h: np.maximum(h, 0)),
                               rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("classes", [10, 16])
def test_avx2_tiles_chain(parts3, monkeypatch, classes):
    """The portable (x86-64-v3: AVX2, 4x24 tiles) build; its narrow last layer (8 + 2 or
    8 + 8 columns: two vectors) runs in blocks of the 12-row tall tile."""
    from rlxc.lowering.cpu.matmul_chain import _row_block
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_config
    from rlxc.registry import backend

    monkeypatch.setattr(backend("cpu"), "default_cpu", "x86-64-v3")
    n, sizes = 41, (300, 520, 400, classes)
    p = _params(sizes, 9)
    f = rlxc.Func(f"chainv3_{classes}", _mlp(n, sizes)).with_params(p)
    (ch,) = _chains(f, "x86-64-v3")
    assert ch.splits == ["cols", "cols", "rows"]
    assert _row_block(sgemm_config("x86-64-v3"), ch.steps[-1], "rows") == 12
    x = np.random.default_rng(5).standard_normal((n, sizes[0])).astype(np.float32)
    want = _ref(p, x, 3, lambda h: np.maximum(h, 0))
    for t, got in _runs(f.jit(), x):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=f"{t} threads")


def test_avx2_thin_last_panel_joins_unit_zero(parts3, monkeypatch):
    """512 = 21 x 24 + 8 columns on AVX2: the 8-column panel is folded into unit 0 (on its
    own it would be an N <= VL product for the sgemm's narrow kernel), so the step has 21
    units; unit 0 covers 32 columns and the others are shifted by 8.  A step with no more
    units than the team's parts keeps its thin panel (every thread needs a unit)."""
    from rlxc.lowering.cpu.matmul_chain import _units
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_config
    from rlxc.registry import backend

    monkeypatch.setattr(backend("cpu"), "default_cpu", "x86-64-v3")
    cfg = sgemm_config("x86-64-v3")
    n, sizes = 45, (300, 512, 392, 56, 10)     # 392 = 16 x 24 + 8; 56 = 2 x 24 + 8
    p = _params(sizes, 21)
    f = rlxc.Func("chainthin", _mlp(n, sizes)).with_params(p)
    (ch,) = _chains(f, "x86-64-v3")    # the 56 -> 10 layer is too small to join it
    assert ch.splits == ["cols", "cols", "cols"]
    assert [_units(cfg, s, how, PARTS)[0] for s, how in zip(ch.steps, ch.splits)] == \
        [21, 16, 3]
    x = np.random.default_rng(6).standard_normal((n, sizes[0])).astype(np.float32)
    want = _ref(p, x, 4, lambda h: np.maximum(h, 0))
    for t, got in _runs(f.jit(), x):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=f"{t} threads")


@pytest.mark.parametrize("cpu", ["native", "x86-64-v3"])
def test_bound_weights_are_prepacked_once(parts3, monkeypatch, cpu):
    """A Jitted packs the bound weights of its column-split steps once (runtime/prepack.py)
    and calls the prepacked entry: the same numbers as the plain C entry (params passed
    per call), on 1-3 threads; AVX2's 512 = 21 x 24 + 8 columns lay out the folded thin
    panel second (unit 0's).  A call that passes its own params runs unpacked, and the
    next bound call packed again; RLXC_PREPACK=0 packs nothing."""
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_config
    from rlxc.registry import backend
    from rlxc.runtime.cpu import CpuCaller

    monkeypatch.setattr(backend("cpu"), "default_cpu", cpu)
    nr = sgemm_config(cpu).nr
    n, sizes = 45, (300, 512, 392, 10)
    p = _params(sizes, 23)

    def build(s):   # a sum over the batch: not batch-separable, so no batch split
        return _mlp(n, sizes)(s).sum(0)
    f = rlxc.Func(f"chainpre_{cpu.replace('-', '_')}", build).with_params(p)
    (ch,) = _chains(f, cpu)
    j = f.jit()
    specs = j.lib.prepack
    names = f.param_names()
    assert [names[s["param"]] for s in specs] == ["w0", "w1"]
    assert j.lib.meta["prepack_entry"] == j.lib.meta["entry"] + "_prepacked"
    cols = [0, 24, 32, 56] if nr == 24 else [0, 64, 128, 192]
    assert specs[0]["cols"][:4] == cols and specs[0]["cols"][-1] == 512
    assert j._caller._packed is not None
    x = np.random.default_rng(24).standard_normal((n, sizes[0])).astype(np.float32)
    want = _ref(p, x, 3, lambda h: np.maximum(h, 0)).sum(0)
    plain = CpuCaller(j.lib)   # unbound: the plain entry, params per call
    pars = [p[k] for k in names]
    for t, got in _runs(j, x):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-3, err_msg=f"{t} threads")
        np.testing.assert_array_equal(got, plain.call([x], pars)[0])
    q = _params(sizes, 25)
    np.testing.assert_allclose(j.run(x=x, **q)[0], _ref(q, x, 3, lambda h: np.maximum(h, 0))
                               .sum(0), rtol=2e-4, atol=2e-3)
    np.testing.assert_allclose(j.run(x)[0], want, rtol=2e-4, atol=2e-3)
    # writeable params could change under a packed copy: a caller bound to them packs
    # nothing (the Func's own bound arrays are read-only)
    mine = CpuCaller(j.lib, [a.copy() for a in pars])
    assert mine._packed is None
    np.testing.assert_array_equal(mine.call([x])[0], plain.call([x], pars)[0])
    monkeypatch.setenv("RLXC_PREPACK", "0")
    j0 = f.jit()
    assert j0._caller._packed is None
    np.testing.assert_array_equal(j0.run(x)[0], j.run(x)[0])


def test_prepack_metadata_is_checked(parts3, tmp_path):
    """A library whose prepack metadata does not fit its params is refused at load (a clear
    error, never a wrong pointer); pack_weight checks the weight it is given."""
    import json
    import shutil

    from rlxc.runtime.cpu import CpuLibrary
    from rlxc.runtime.errors import ArtifactError
    from rlxc.runtime.prepack import pack_weight

    n, sizes = 45, (300, 512, 392, 10)
    f = rlxc.Func("chainmeta", lambda s: _mlp(n, sizes)(s).sum(0)).with_params(
        _params(sizes, 3))
    lib = f.jit().lib
    so = str(tmp_path / "lib.so")
    shutil.copy(lib.path, so)
    meta = json.loads(json.dumps(lib.meta))
    CpuLibrary(so, meta)
    bad = json.loads(json.dumps(meta))
    bad["prepack"][0]["n"] = 500
    with pytest.raises(ArtifactError, match="prepack"):
        CpuLibrary(so, bad)
    bad = json.loads(json.dumps(meta))
    bad["prepack_entry"] = "no_such_symbol"
    with pytest.raises(ArtifactError, match="prepack"):
        CpuLibrary(so, bad)
    with pytest.raises(ValueError, match="float32 with 300 x 512"):
        pack_weight(np.zeros((300, 500), np.float32), meta["prepack"][0])


@pytest.mark.parametrize("cpu", ["native", "x86-64-v3"])
@pytest.mark.parametrize("n", [100, 128])
def test_tail_units_split_by_rows(parts3, monkeypatch, cpu, n):
    """The last `parts` column units of a step are claimed as TAIL_PIECES row blocks each
    (matmul_chain._tail), so the team reaches the barrier together; every piece moves A,
    C, the bias and the prepacked panel alike.  At 100 rows the last piece is shorter than
    the others.  Checked on 1-3 threads, prepacked (bound weights) and plain, against
    NumPy and bit for bit against a build without the tail split (prepacked too)."""
    from rlxc.lowering.cpu import matmul_chain as mc
    from rlxc.lowering.cpu.sgemm_kernels import sgemm_config
    from rlxc.registry import backend
    from rlxc.runtime.cpu import CpuCaller

    monkeypatch.setattr(backend("cpu"), "default_cpu", cpu)
    cfg = sgemm_config(cpu)
    sizes = (300, 512, 392, 10)
    p = _params(sizes, n)

    def build(s):   # a sum over the batch: not batch-separable, so no batch split
        return _mlp(n, sizes)(s).sum(0)
    tag = f"{cpu.replace('-', '_')}_{n}"
    f = rlxc.Func(f"chaintail_{tag}", build).with_params(p)
    (ch,) = _chains(f, cpu)
    tails = [mc._tail(cfg, s, how, PARTS) for s, how in zip(ch.steps, ch.splits)]
    rows = -(-(-(-n // mc.TAIL_PIECES)) // cfg.mr) * cfg.mr
    assert mc.TAIL_PIECES > 1 and tails[0] == (PARTS, -(-n // rows), rows), tails
    assert tails[0][1] * rows >= n > (tails[0][1] - 1) * rows
    x = np.random.default_rng(n).standard_normal((n, sizes[0])).astype(np.float32)
    want = _ref(p, x, 3, lambda h: np.maximum(h, 0)).sum(0)
    j = f.jit()
    assert j._caller._packed is not None
    plain = CpuCaller(j.lib)
    pars = [p[k] for k in f.param_names()]
    monkeypatch.setattr(mc, "TAIL_PIECES", 1)
    assert mc._tail(cfg, ch.steps[0], "cols", PARTS) == (0, 1, n)
    j1 = rlxc.Func(f"chainnotail_{tag}", build).with_params(p).jit()
    for t, got in _runs(j, x):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-3, err_msg=f"{t} threads")
        # the plain call (B read in place or packed per call) may take other kernels for
        # a piece than the prepacked one (a piece of at most 24 rows: the tall kernel, all
        # of K in one pass), which sum K in another order where K spans several K blocks
        # (kc 160 on Sapphire Rapids; Zen 4's 512 holds these K whole): rounding only
        np.testing.assert_allclose(got, plain.call([x], pars)[0], rtol=1e-5, atol=1e-5)
        j1.set_num_threads(t)
        np.testing.assert_array_equal(got, j1.run(x)[0])
