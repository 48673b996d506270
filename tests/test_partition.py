"""Large modules compile in parts, side by side (lowering/cpu/partition.py)."""

from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
import pytest

from rlxc import Func, nn
from rlxc.lowering.cpu import partition, target
from rlxc.lowering.cpu.driver import compile_cpu

IR = '''; ModuleID = "f"
target triple = "x86_64-unknown-linux-gnu"
target datalayout = ""

@"f.state" = internal thread_local global [4 x i64] zeroinitializer
@"rlxc_num_threads" = weak global i32 0, align 4
@"f.table" = private constant [2 x float] [float 1.0, float 2.0], align 64
define internal float @"rlx.math.twice"(float %"x") alwaysinline nounwind
{
entry:
  %"y" = fmul float %"x", 2.0
  ret float %"y"
}

define internal void @"f.k1"(float* noalias %".1", i64 %".2") nounwind noinline
{
entry:
  %"p" = getelementptr [2 x float], [2 x float]* @"f.table", i64 0, i64 1
  %"v" = load float, float* %"p"
  %"w" = call float @"rlx.math.twice"(float %"v")
  store float %"w", float* %".1"
  %"s" = getelementptr [4 x i64], [4 x i64]* @"f.state", i64 0, i64 0
  store i64 %".2", i64* %"s"
  call void @"f.k1.helper"(float* %".1")
  ret void
}

define internal void @"f.k1.helper"(float* %".1") nounwind
{
entry:
  %"n" = load i32, i32* @"rlxc_num_threads"
  %"f" = sitofp i32 %"n" to float
  %"q" = getelementptr float, float* %".1", i64 1
  store float %"f", float* %"q"
  ret void
}

define internal void @"f.k2"(float* noalias %".1") nounwind noinline
{
entry:
  %"p" = getelementptr float, float* %".1", i64 2
  %"u" = call float @"rlx.math.twice"(float 1.0)
  %"w" = fadd float %"u", 1.0
  %"v" = fmul float %"w", 2.0
  store float %"v", float* %"p"
  ret void
}

define i32 @"f"(float* %".1") nounwind
{
entry:
  call void @"f.k1"(float* %".1", i64 7)
  call void @"f.k2"(float* %".1")
  %"s" = getelementptr [4 x i64], [4 x i64]* @"f.state", i64 0, i64 0
  %"v" = load i64, i64* %"s"
  %"t" = trunc i64 %"v" to i32
  ret i32 %"t"
}
'''


@pytest.fixture
def small_units(monkeypatch):
    """Split even this tiny module: a kernel of 10 lines or more is a unit."""
    monkeypatch.setattr(partition, "MIN_UNIT", 10)


def _parse(text):
    target._ensure_init()
    m = llvm.parse_assembly(text, llvm.create_context())
    m.verify()
    return m


def test_split_golden(small_units):
    """Each part parses and verifies on its own; a kernel used from another part turns
    hidden and is declared there (nounwind kept); its helper stays with it (the dominator
    tree); the thread-local global stays in part 0, declared external hidden elsewhere;
    the private constant and the alwaysinline helper are copied where used."""
    parts = partition.split_module(IR, parts=3, hidden_globals=("rlxc_num_threads",))
    assert len(parts) == 3
    for p in parts:
        _parse(p)
    main = next(p for p in parts if 'define i32 @"f"' in p)
    assert 'declare hidden void @"f.k1"(float* noalias, i64) nounwind' in main
    assert 'declare hidden void @"f.k2"(float* noalias) nounwind' in main
    assert '@"f.state" = hidden thread_local global [4 x i64] zeroinitializer' in main
    k1 = next(p for p in parts if 'define hidden void @"f.k1"' in p)
    assert 'define internal void @"f.k1.helper"' in k1     # with its only caller
    assert '@"f.state" = external hidden thread_local global [4 x i64]' in k1
    ie = partition.split_module(IR.replace("thread_local global", "thread_local(initialexec) "
                                           "global"), parts=3)
    assert any('@"f.state" = external hidden thread_local(initialexec) global [4 x i64]' in p
               for p in ie)
    for p in ie:
        _parse(p)
    assert '@"rlxc_num_threads" = external hidden global i32' in k1
    assert '@"f.table" = private constant' in k1
    assert 'define internal float @"rlx.math.twice"' in k1
    k2 = next(p for p in parts if 'define hidden void @"f.k2"' in p)
    assert "f.state" not in k2 and 'define internal float @"rlx.math.twice"' in k2
    # deterministic: the same text, the same parts
    assert partition.split_module(IR, parts=3, hidden_globals=("rlxc_num_threads",)) == parts


def test_split_links_and_runs(small_units, tmp_path):
    """The parts' objects, compiled on threads, link into a library that computes what
    the one-module build computes."""
    import ctypes

    objs = target.compile_objects(IR.replace("target datalayout = \"\"\n", ""))
    assert len(objs) == 1   # below PART_LINES: one module
    parts = partition.split_module(IR, parts=3, hidden_globals=target.HIDDEN_GLOBALS)
    objs = [target._compile_part(p, "native", 3, True) for p in parts]
    so = target.link_shared(objs, str(tmp_path / "libf.so"))
    lib = ctypes.CDLL(so)
    out = np.zeros(3, np.float32)
    assert lib.f(out.ctypes.data_as(ctypes.c_void_p)) == 7
    np.testing.assert_array_equal(out, [4.0, 0.0, 6.0])
    # nothing new is exported: the promoted kernels are hidden
    import subprocess
    syms = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True,
                          text=True).stdout
    assert "f.k1" not in syms and "f.k2" not in syms and " f\n" in syms


def test_split_falls_back_on_unknown_items():
    """A top-level item the splitter does not know: the module stays whole."""
    text = IR + '$c = comdat any\n'
    assert partition.split_module(text, parts=2) == [text]
    text = IR + '!0 = !{void (float*)* @"f.k2"}\n'   # metadata that names a symbol
    assert partition.split_module(text, parts=2) == [text]
    assert partition.split_module(IR, parts=1) == [IR]


def test_split_keeps_foreign_names_internal(small_units):
    """A symbol that would turn hidden but is not named after the program's entry (two
    programs linked into one library could both define it): the module stays whole."""
    text = IR.replace('@"f.k2"', '@"g.k2"')
    assert partition.split_module(text, parts=3) == [text]


def test_split_shared_runtime_object(small_units):
    """A runtime object that one link holds several copies of (the sgemm objects):
    functions used across parts turn weak_odr hidden, so the copies merge; a global used
    across parts keeps such a module whole."""
    assert partition.split_module(IR, parts=3, shared=True) == [IR]   # f.state
    stateless = IR.replace('@"f.state" = internal thread_local global',
                           '@"f.state" = private constant')
    parts = partition.split_module(stateless, parts=3, shared=True)
    assert len(parts) == 3
    assert any('define weak_odr hidden void @"f.k1"' in p for p in parts)


def test_sgemm_objects_of_two_programs_link_together(tmp_path):
    """Two programs' objects, each combined with the sgemm object in parts (weak_odr),
    link into one library (the AOT artifact links a model and its train step so)."""
    from rlxc.lowering.cpu import sgemm_object

    obj = sgemm_object._build("native", "plain")
    a = sgemm_object.relocatable_link([obj], "native")
    so = target.link_shared([a, a], str(tmp_path / "libtwo.so"))
    assert so


def test_parts_for(monkeypatch):
    monkeypatch.delenv("RLXC_LLVM_PARTS", raising=False)
    assert partition.parts_for(100) == 1
    assert partition.parts_for(2 * partition.PART_LINES) == 2
    assert partition.parts_for(100 * partition.PART_LINES) == partition.MAX_PARTS
    monkeypatch.setenv("RLXC_LLVM_PARTS", "1")
    assert partition.parts_for(100 * partition.PART_LINES) == 1
    monkeypatch.setenv("RLXC_LLVM_PARTS", "two")
    with pytest.raises(ValueError, match="RLXC_LLVM_PARTS"):
        partition.parts_for(5000)


def _block(name):
    def build(s):
        y = nn.transformer_block(s, "blk", s.input("x", (2, 8, 16)), 2, mask="causal")
        return (y * y).mean()
    return nn.init(Func(name, build), seed=3, std=0.1)


def test_transformer_grad_in_parts_matches_one_module(monkeypatch):
    """A transformer block's value_and_grad compiled in several parts computes what the
    same program compiled as one module computes (bit for bit: the same kernels, linked
    apart), and the split objects are reproducible."""
    x = np.random.default_rng(0).normal(size=(2, 8, 16)).astype(np.float32)
    monkeypatch.setenv("RLXC_LLVM_PARTS", "1")
    one = _block("part_one").value_and_grad_all()
    assert compile_cpu(one.module, "part_one", link=False).timings["llvm parts"] == 1
    ref = one.jit().run(x)
    monkeypatch.setenv("RLXC_LLVM_PARTS", "4")
    monkeypatch.setattr(partition, "PART_LINES", 200)
    many = _block("part_many").value_and_grad_all()
    a = compile_cpu(many.module, "part_many", link=False)
    b = compile_cpu(many.module, "part_many", link=False)
    assert a.timings["llvm parts"] == 4 and a.object == b.object
    got = many.jit().run(x)
    assert len(got) == len(ref) > 2
    for u, v in zip(ref, got):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def test_compile_threads_follow_rlxc_num_threads(monkeypatch):
    """The parts compile on at most RLXC_NUM_THREADS threads (here one: in order, on
    the calling thread), with the same objects."""
    import threading

    monkeypatch.setattr(partition, "MIN_UNIT", 10)
    monkeypatch.setattr(partition, "PART_LINES", 10)
    seen = set()
    real = target._compile_part

    def spy(*a):
        seen.add(threading.current_thread().name)
        return real(*a)
    monkeypatch.setattr(target, "_compile_part", spy)
    monkeypatch.setenv("RLXC_NUM_THREADS", "1")
    one = target.compile_objects(IR)
    assert len(one) >= 2 and seen == {threading.current_thread().name}
    monkeypatch.setenv("RLXC_NUM_THREADS", "2")
    assert target.compile_objects(IR) == one

