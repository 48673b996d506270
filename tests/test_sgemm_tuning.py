"""The sgemm tile and blocking derived per target from its registers and caches
(lowering/cpu/sgemm_kernels.py derive_config, lowering/cpu/target.py cache_info), and
where the chosen parameters are recorded (JIT cache metadata, AOT JSON, rlxc compile -v)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlxc.lowering.cpu import sgemm_kernels as sg
from rlxc.lowering.cpu import target
from rlxc.lowering.cpu.target import CacheInfo

K, M = 1 << 10, 1 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_register_tile_per_isa():
    """32 zmm: 6x64 (24 accumulators + 4 + 1); 16 ymm: 4x24 (12 + 3 + 1: one load fewer
    per k step than 6x16); NEON by-element FMA: 8x12."""
    assert sg.register_tile(sg.ISAS["avx512"]) == (6, 4)
    assert sg.register_tile(sg.ISAS["avx2"]) == (4, 3)
    assert sg.register_tile(sg.ISAS["neon"]) == (8, 3)
    for isa in sg.ISAS.values():
        mr, nv = sg.register_tile(isa)
        assert 4 * mr * nv <= 3 * isa.regs and mr * nv + nv + 1 <= isa.regs


@pytest.mark.parametrize("caches, isa, want", [
    (CacheInfo(48 * K, 12, 2 * M, 150 * M, "t"), "avx512", (160, 288, 4096, 512)),   # SPR
    (CacheInfo(32 * K, 8, 512 * K, 4 * M, "t"), "avx2", (256, 256, 4080, 256)),      # Zen 3
    (CacheInfo(32 * K, 8, 256 * K, 2560 * K, "t"), "avx2", (256, 128, 2544, 256)),   # Haswell
    (CacheInfo(32 * K, 8, 1 * M, 16 * M, "t"), "avx512", (512, 252, 4096, 512)),     # Zen 4
    (CacheInfo(48 * K, 12, 512 * K, 2 * M, "t"), "avx512", (160, 288, 3264, 160)),   # ICL client
])
def test_blocking_follows_the_caches(caches, isa, want):
    cfg = sg.derive_config(sg.ISAS[isa], caches)
    assert (cfg.kc, cfg.mc, cfg.nc, cfg.kc_for(sg.KC_DEEP_MIN_M)) == want
    assert cfg.kc_for(sg.KC_DEEP_MIN_M - 1) == cfg.kc
    # the deep K block keeps the A block within half of L2 (ICL client's 512 KiB: no)
    assert cfg.mc * cfg.kc_for(sg.KC_DEEP_MIN_M) * 4 <= caches.l2 // 2
    # an explicit kc (tuning, tests) is every call's K block
    assert sg.derive_config(sg.ISAS[isa], caches, kc=64).kc_for(4096) == 64
    # the model's invariants: B micro-panel within L1d (or, where L1d cannot hold
    # KC_MIN rows of it, streamed from L2 at the deepest kc), A block within half of L2
    if cfg.kc < sg.KC_MAX:
        assert cfg.kc * cfg.nr * 4 <= caches.l1d
    else:
        assert cfg.kc * cfg.nr * 4 <= caches.l2 // 2
    assert cfg.mc * cfg.kc * 4 <= caches.l2 // 2
    assert cfg.mc % cfg.mr == 0 and cfg.nc % cfg.nr == 0


def test_smaller_caches_give_smaller_blocks():
    big = sg.derive_config(sg.ISAS["avx2"], CacheInfo(48 * K, 12, 2 * M, 8 * M, "t"))
    small = sg.derive_config(sg.ISAS["avx2"], CacheInfo(32 * K, 8, 256 * K, 1 * M, "t"))
    assert small.kc <= big.kc and small.mc < big.mc and small.nc < big.nc


def test_named_cpus_use_their_family_table():
    """A named --cpu that is not the host takes its family's typical caches: Zen 3's
    512 KiB L2 gives a larger A block than Haswell's 256 KiB, same AVX2 tile."""
    z, h = sg.sgemm_config("znver3"), sg.sgemm_config("haswell")
    assert (z.isa, z.mr, z.nr) == (h.isa, h.mr, h.nr) == ("avx2", 4, 24)
    assert z.mc > h.mc
    assert target.cache_info("znver3").source == "table:znver3"
    assert target.cache_info("x86-64-v3").source == "table:haswell"
    assert target.cache_info("generic").source == "table:haswell"   # x86 "generic"
    assert target.cache_info("aarch64-linux-gnu:neoverse-n1").source == "table:neoverse-n1"
    assert target.cache_info("aarch64-linux-gnu:cortex-a53").source == "table:generic-aarch64"
    assert sg.sgemm_config("skylake-avx512").isa == "avx512"


def test_sysfs_parsing(tmp_path):
    def cache(idx, level, kind, size, ways, cpus):
        d = tmp_path / f"index{idx}"
        d.mkdir()
        for n, v in (("level", level), ("type", kind), ("size", size),
                     ("ways_of_associativity", ways), ("shared_cpu_list", cpus)):
            (d / n).write_text(f"{v}\n")
    cache(0, 1, "Data", "32K", 8, "0,16")
    cache(1, 1, "Instruction", "32K", 8, "0,16")
    cache(2, 2, "Unified", "512K", 8, "0,16")
    cache(3, 3, "Unified", "32768K", 16, "0-7,16-23")
    got = target.sysfs_caches(str(tmp_path))
    assert got == CacheInfo(32 * K, 8, 256 * K, 2 * M, "sysfs")   # L2 per SMT pair: per CPU
    assert target.sysfs_caches(str(tmp_path / "missing")) is None


def test_native_reads_the_host():
    info = target.cache_info("native")
    if os.path.isdir("/sys/devices/system/cpu/cpu0/cache/index0"):
        assert info.source == "sysfs"
    assert info.l1d >= 16 * K and info.l2 >= info.l1d
    p = sg.sgemm_params()
    assert p["kc"] == sg.sgemm_config().kc and p["caches"]["l2"] == info.l2


def test_params_in_jit_metadata(tmp_path, monkeypatch):
    """The JIT cache entry's metadata records the derived sgemm parameters."""
    monkeypatch.setenv("RLXC_CACHE_DIR", str(tmp_path))
    from rlxc.lowering.cpu.driver import compile_cpu
    from rlxc import Func

    f = Func("mm_meta", lambda s: s.input("a", (8, 8)) @ s.input("b", (8, 8)))
    art = compile_cpu(f.module, "mm_meta", cpu="x86-64-v3", link=False)
    meta = art.metadata()
    assert meta["sgemm"]["tile"] == "4x24" and meta["sgemm"]["isa"] == "avx2"
    assert meta["sgemm"]["caches"]["source"] == "table:haswell"
    json.dumps(meta)


def test_params_in_aot_json_and_verbose(tmp_path):
    out = tmp_path / "o"
    p = subprocess.run([sys.executable, "-m", "rlxc.cli.main", "compile",
                        os.path.join(ROOT, "examples", "embed_c", "model.py") + ":mlp",
                        "-o", str(out), "--cpu", "znver3", "-v"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "sgemm for znver3: avx2 4x24 tile, kc=256 mc=256" in p.stderr
    meta = json.loads(next(out.glob("*.json")).read_text())
    assert meta["sgemm"]["tile"] == "4x24" and meta["sgemm"]["mc"] == 256


def test_prebuilt_objects_are_used_before_building(tmp_path, monkeypatch):
    """First use on a fresh machine: objects built at install time (prebuild, `make`)
    are found in prebuilt_dir() and nothing is compiled; a corrupt one is rebuilt."""
    from rlxc.lowering.cpu import sgemm_object as so

    built = []

    def fake_build(cpu, variant):
        built.append((cpu, variant))
        return f"OBJ {cpu} {variant}".encode()
    monkeypatch.setattr(so, "_build", fake_build)
    monkeypatch.setattr(so, "_objects", {})
    monkeypatch.setenv("RLXC_PREBUILT_DIR", str(tmp_path / "pre"))
    monkeypatch.setenv("RLXC_RUNTIME_DIR", str(tmp_path / "rt"))
    paths = so.prebuild(["x86-64-v3"])
    assert len(paths) == 2 and built == [("x86-64-v3", "plain"), ("x86-64-v3", "cb")]
    assert so.prebuild(["x86-64-v3"]) == paths and len(built) == 2   # kept, not rebuilt
    built.clear()
    assert so.sgemm_object("x86-64-v3", "cb") == b"OBJ x86-64-v3 cb"
    assert built == []
    # a corrupt prebuilt object is ignored (sha256 sidecar) and rebuilt into the runtime dir
    with open(paths[0], "ab") as f:
        f.write(b"junk")
    assert so.sgemm_object("x86-64-v3", "plain") == b"OBJ x86-64-v3 plain"
    assert built == [("x86-64-v3", "plain")]
    assert os.listdir(tmp_path / "rt")
    # RLXC_PREBUILT_DIR="" turns the lookup off
    monkeypatch.setenv("RLXC_PREBUILT_DIR", "")
    monkeypatch.setattr(so, "_objects", {})
    monkeypatch.setenv("RLXC_RUNTIME_DIR", str(tmp_path / "rt2"))
    built.clear()
    so.sgemm_object("x86-64-v3", "cb")
    assert built == [("x86-64-v3", "cb")]


@pytest.mark.parametrize("cpu, isa, tile", [("x86-64-v2", "sse", "6x8"),
                                            ("sandybridge", "avx", "6x16")])
def test_cpus_without_fma(tmp_path, cpu, isa, tile):
    """Pre-Haswell targets have no FMA: llvm.fma became a call to fmaf per lane (~100x
    slower); the kernel multiplies and adds instead, with a tile that keeps a register
    for the product, and still computes A @ B."""
    import ctypes

    import numpy as np

    from rlxc.lowering.cpu import openmp as parallel

    p = sg.sgemm_params(cpu)
    assert (p["isa"], p["tile"]) == (isa, tile)
    m = target.ir_module("nofma", cpu)
    sg.emit_sgemm(m, "sg", cpu=cpu)
    parallel.thread_control(m)
    mod = target.compile_ir(m, cpu)
    asm = target.emit_asm(mod, cpu)
    assert "fmaf" not in asm and "mulps" in asm
    if isa == "avx" and "+avx" not in target.host_cpu_features().split(","):
        return
    lib = ctypes.CDLL(target.link_shared([target.emit_object(mod, cpu)],
                                         str(tmp_path / "libnofma.so"), cpu=cpu))
    f = lib.sg
    P, L = ctypes.c_void_p, ctypes.c_int64
    f.argtypes = [L, L, L, P, L, L, P, L, L, P, L, ctypes.c_int32, P, L]
    f.restype = None
    rng = np.random.default_rng(5)
    cfg = sg.sgemm_config(cpu)
    for M, N, K in [(1, 1, 1), (7, 9, 33), (65, 70, 300), (130, 5, 64), (3, 200, 17)]:
        A = rng.standard_normal((M, K), dtype=np.float32)
        B = rng.standard_normal((K, N), dtype=np.float32)
        C = np.zeros((M, N), np.float32)
        ws = np.empty(sg.sgemm_workspace_floats(M, N, K, 2, config=cfg), np.float32)
        f(M, N, K, A.ctypes.data, K, 1, B.ctypes.data, N, 1, C.ctypes.data, N, 0,
          ws.ctypes.data, ws.size)
        ref = A.astype(np.float64) @ B
        np.testing.assert_allclose(C, ref, rtol=1e-4, atol=1e-4 * np.sqrt(K))


def test_every_named_cpu_gets_a_valid_config():
    """Every x86-64 CPU name the tables know (and --cpu portable = x86-64-v3, AVX2+FMA:
    the 4x24 ymm tile, not the SSE one) derives a config that satisfies the blocking
    model: B micro-panel in L1d (in L2 where L1d holds under KC_MIN rows of it), A block
    in half of L2 (or one tile of rows), blocks multiples of the tile, K blocks within
    [KC_MIN, KC_MAX], a bounded dynamic-split B part."""
    names = {*target.CACHE_TABLE, *target._CPU_FAMILY, *sum(sg.NO_FMA_CPUS.values(), ()),
             "x86-64-v3", "x86-64-v4", "znver3", "haswell"} - {
                 "neoverse-n1", "neoverse-v1", "neoverse-n2", "apple-m1", "generic-aarch64"}
    for name in sorted(names):
        cfg, caches = sg.sgemm_config(name), target.cache_info(name)
        # B micro-panel in L1d, or (an L1d too small for KC_MIN rows) streamed from L2
        assert cfg.kc * cfg.nr * 4 <= (caches.l1d if cfg.kc < sg.KC_MAX
                                       else caches.l2 // 2), name
        assert cfg.mc == cfg.mr or cfg.mc * cfg.kc * 4 <= caches.l2 // 2, name
        assert cfg.mc % cfg.mr == 0 and cfg.nc % cfg.nr == 0 and cfg.nr % cfg.vl == 0, name
        assert sg.KC_MIN <= cfg.kc <= cfg.kc_for(1 << 20) <= sg.KC_MAX, name
        assert cfg.mc == cfg.mr or cfg.mc * cfg.kc_for(1 << 20) * 4 <= caches.l2 // 2, name
        assert cfg.dyn_b_floats * 4 <= 8 * M, name
    p = sg.sgemm_config("x86-64-v3")
    assert (p.isa, p.mr, p.nr) == ("avx2", 4, 24)
    assert sg.sgemm_config("x86-64").isa == "sse"
