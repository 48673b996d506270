"""Single-precision GEMM emitted as LLVM IR (llvmlite.ir): packed, blocked, threaded.

    C[i,j] (=|+=) sum_k A[i*rsa + k*csa] * B[k*rsb + j*csb]      (strided A, B)
      │ emit_sgemm
      ▼
    NAME          picks the workspace, splits C over an OpenMP team (openmp.py):
                  by rows or by columns, whichever costs a thread less
                  (its share of the FMAs plus the packing: a row split packs
                  all of B in every thread, a column split all of A); the row
                  split (M >= 256) hands out chunks of rows from a shared
                  counter (sgemm_dyn.py, dyn_chunks per thread, smaller ones
                  at the end; the team packs one shared B when N fits one
                  column block), so a descheduled thread does not hold up the
                  join on a shared machine; the column split (M >= 32) likewise
                  hands out items of column panels (dyn_cols)
     └ NAME.seq   one thread's C rows/columns:
         M <= MR, unit-stride B → NAME.skinnyM (M × W tiles over all of K, B read
                                  in place) or, for M == 1, NAME.gemv (streams
                                  gemv_rows rows of B at a time into C's row)
         MR < M <= 24 (12 with 16 registers), unit-stride B → NAME.tallR
                                  (sgemm_tall.py: one R-row register tile, A and
                                  B read in place; a conv's per-image GEMM)
         N <= VL, csa == 1, K >= VL → NAME.narrow (B packed transposed, K the
                                  vector axis, one transpose-and-add tree per
                                  row of C; variants for 2..VL columns)
         otherwise the GotoBLAS/BLIS loop nest:
         for jc in N by NC:                         (B block: L3)
           for pc in K by KC:                       (at least once, so K=0 works; KC is
                                                     kc, kc_deep from KC_DEEP_MIN_M rows)
             pack_b  B[pc:pc+kc, jc:jc+nc] → Bp   KC×NR micro-panels, zero padded
                     (row split with share_b: each thread packs 1/nt of the
                      panels into a shared, double-buffered Bp; one team
                      barrier per block; without: each thread its own, or
                      panel by panel (pack_b_panel, see jr))
             for ic in M by MC:                     (A block: L2)
               pack_a  A[ic:ic+mc, pc:pc+kc] → Ap MR×KC micro-panels, zero padded
                       (skipped with direct_a when csa == 1 and the panels are
                        full, or with direct_a_edge M <= MC: the micro_da tiles
                        broadcast A from its rows in place)
               for jr in nc by NR:                  (B micro-panel: L1)
                 pack_b_panel, M <= MC (one M block): pack this panel now, into
                       one L1-resident slot, and spread prefetches of the next
                       panel's source rows over the ir tiles, so the weights
                       stream in under the FMAs
                 for ir in mc by MR:
                   micro: MR×NR tile of C, kc rank-1 updates:
                     acc[r][v] = fma(splat(Ap[k*MR+r]), Bp[k*NR + v*VL : +VL], acc[r][v])
                   store: C += / = acc (only the first K block may skip loading C),
                          epilogue on the last K block, masked on edge tiles

Register tile: the vector axis is N (rows of C are contiguous), so each k step
loads NR/VL vectors of packed B and broadcasts MR scalars of packed A (one
vbroadcastss shared by the row's FMAs).  The tile and the cache blocking are
derived per target (register_tile, derive_config) from the vector registers
and the caches the CPU reports: AVX-512: 6×64 (24 zmm accumulators + 4 B
vectors + 1 broadcast, of 32 registers); AVX2: 4×24 (12 ymm accumulators + 3
+ 1, all 16).  The k loop is unrolled ``unroll`` times.  (A 14×32 tile needs
28 + 2 + 1 registers and LLVM then spills an accumulator.)  Packing
uses vector copies for unit-stride rows of B and an in-register transpose
(one shufflevector) for row-major A; strided operands take scalar gathers.

Workspace: packed buffers are 64-byte aligned slices of a caller-provided
workspace (``sgemm_workspace_floats`` says how many floats: one A part and
one B part per thread), so the hot path never allocates.  The thread count
is capped by how many slices fit; with a NULL or too small workspace the
kernel mallocs one slice and runs on one thread (a slow path, not meant for
the runtime).  The row split with share_b uses the B parts of slots 0 and 1
as its shared double buffer.

Edges: packing pads partial micro-panels with zeros.  The last column
panel runs the narrowest microkernel variant that covers it (MR × 16, 32,
48 or 64 on AVX-512), so N = 80 or N = 10 does not pay for 128 or 64
columns; edge tiles store only rows < m_rem with masked vector loads/stores
for columns < n_rem.  Row edges (m_rem < MR) compute the full MR rows.

Epilogue hook (fused bias/activation): ``epilogue(builder, row, col, vec,
lanes, mask, args) -> vec`` is called while emitting the final store of each
row-vector of each tile, only for the last K block, after C's old value has
been added when accumulating, i.e. C = epilogue(acc ? C + A@B : A@B).
``row``/``col`` are i64 global indices of C's element under lane 0, ``vec`` a
``<lanes x float>`` value (lanes = VL: 16 on AVX-512, 8 on AVX2) covering
columns col..col+lanes-1, ``mask`` is None for a full vector or an
``<lanes x i1>`` value (lane valid iff col+lane < N; use it to load bias
etc. with ``masked_load``); results in masked-off lanes are discarded.
``args`` are the values of the extra trailing arguments declared with
``epilogue_arg_types`` (the hook runs in an internal function, so it must
reach outside data through these).  The hook may be emitted several times.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Sequence

import llvmlite.ir as ir

from rlxc.lowering.cpu import openmp as parallel
from rlxc.lowering.cpu.target import host_has_avx512

__all__ = [
    "SgemmConfig",
    "sgemm_config",
    "sgemm_params",
    "derive_config",
    "register_tile",
    "sgemm_workspace_floats",
    "emit_sgemm",
    "sgemm_signature",
    "masked_load",
]

F32 = ir.FloatType()
F32P = F32.as_pointer()
I1 = ir.IntType(1)
I8 = ir.IntType(8)
I8P = I8.as_pointer()
I32 = ir.IntType(32)
I64 = ir.IntType(64)
VOID = ir.VoidType()

# bit 1 of sgemm's `accumulate` argument: B is prepacked (runtime/prepack.py's layout: a
# bound weight packed once); bit 0 says accumulate.  One thread: the caller splits.
PREPACKED_B = 2
# rows of the one-vector edge tile (AVX2, A in place): 12 accumulators like the 4x24 tile
EDGE_ROWS = 12


@dataclasses.dataclass(frozen=True)
class SgemmConfig:
    isa: str          # "avx512" | "avx2" | "neon"
    vl: int           # floats per vector
    mr: int           # register tile rows
    nr: int           # register tile columns (multiple of vl)
    kc: int           # K block (B micro-panel kc×nr should stay in L1)
    mc: int           # M block (packed A mc×kc in L2), multiple of mr
    nc: int           # N block (packed B kc×nc), multiple of nr
    unroll: int = 4   # k-loop unroll in the microkernel
    prefetch_a: int = 0   # prefetch distance in k steps for packed A (0 = off)
    prefetch_b: int = 0   # prefetch distance in k steps for packed B (0 = off)
    prefetch_c: bool = True
    min_work: int = 1 << 18  # M*N*K below this runs on one thread
    # Row split: True = the team packs each B block once into a shared buffer
    # (one barrier per K block); False = every thread packs all of B itself.
    # Sharing saves a few percent on an idle machine, but on a busy one a
    # descheduled thread stalls the whole team at every barrier.
    share_b: bool = False
    # Without share_b: a row split with at least this many rows per thread runs the share_b
    # path (0: never, the default).  AVX2 Zen 3, 2 threads, one-process A/B against the
    # dynamic split: 1024^3 0.95-0.99, 2048x2048x1024 0.96-0.97, 1024x512x512 0.95 of the
    # time; but in compare.py W2 with an x86-64-v3 build, 2 of 4 runs stalled at the
    # barriers often enough that the thread governor ran 58% of the calls on one thread
    # (median 22.7 ms against 12.3 ms), which the dynamic split never did
    coop_min_rows: int = 0
    # Row split without share_b: 0 = one static range per thread; n > 0 = chunks of about
    # M / (n * threads) rows (MR..MC) that the threads claim from a shared counter
    dyn_chunks: int = 4
    dyn_b_floats: int = 1 << 21   # ... when K x nc fits this many floats (its packed B part)
    dyn_tail: int = 4             # ... the last ~threads chunks split dyn_tail ways (<= 1: not)
    dyn_prefetch_b: int = 2       # ... prefetch the next packed B panel (0 off, else locality)
    # ... tiles read A in place (direct_a) instead of packing each item's A block
    # (derive_config: AVX-512 only; on AVX2 2.4-8% slower, though not in the static split)
    dyn_direct_a: bool = False
    # Column split: 0 = one static range of NR panels per thread; c > 0 = the threads claim
    # column items from a shared counter: about c per thread of equal size, then 2 per
    # thread of a quarter of that (sgemm_dyn.emit_col_items), so that a thread that starts
    # late or shares its core (another process's spinning threads) leaves its columns to
    # the others instead of holding up the join
    dyn_cols: int = 4
    skinny: bool = True       # M <= mr with unit-stride B: unpacked skinny kernels
    skinny_prefetch: int = 8  # B rows ahead prefetched by the skinny kernels (0 = off)
    gemv_rows: int = 8        # M == 1: B rows streamed together (0 = use the skinny tile)
    tall: bool = True         # MR < M <= 24 (12) with unit-stride B: sgemm_tall.py tiles
    # Threaded split: the cost of packing one float, in multiply-adds.  Packing reads
    # operands that are often not in cache (weights), so it costs far more than an FMA
    # lane; 16 was best on 128x512x784 and no worse elsewhere.
    pack_cost: int = 16
    narrow: bool = True       # N <= vl, csa == 1, K >= vl: the narrow (K-vectorized) kernel
    direct_a: bool = True     # csa == 1, full panels: the tile reads A in place (no pack_a)
    # ... and on the N edge panel too when M <= mc (direct tiles of every narrower width;
    # derive_config turns it on where NR is not a power of two, e.g. AVX2's 24, which
    # leaves an edge on every power-of-two N; each width is one more microkernel to build)
    direct_a_edge: bool = False
    pack_b_rows: int = 1      # csb == 1: pack B this many rows at a time across panels (0:
                              # panel by panel)
    pack_b_panel: bool = True  # M <= mc, not coop: pack B a panel at a time before its tiles
    pack_b_prefetch: int = 2  # ... prefetching the next panel: 0 off, else the locality
                              # (2: prefetcht1, into L2; 3: prefetcht0, into L1)
    # K block of calls with at least KC_DEEP_MIN_M rows (0: kc).  Deep blocks pass over C
    # fewer times; at such sizes that outweighs a B micro-panel that no longer fits the L1d
    # (derive_config)
    kc_deep: int = 0

    def __post_init__(self):
        bad = []
        if self.nr % self.vl:
            bad.append(f"nr={self.nr} is not a multiple of vl={self.vl}")
        if self.mc % self.mr:
            bad.append(f"mc={self.mc} is not a multiple of mr={self.mr}")
        if self.nc % self.nr:
            bad.append(f"nc={self.nc} is not a multiple of nr={self.nr}")
        if min(self.mr, self.kc, self.unroll) < 1:
            bad.append("mr, kc and unroll must be >= 1")
        if self.kc_deep and self.kc_deep < self.kc:
            # the workspace of a call is sized by its M, a seq block of fewer rows takes
            # kc: kc_for must grow with the rows
            bad.append(f"kc_deep={self.kc_deep} is neither 0 nor >= kc={self.kc}")
        if bad:
            raise ValueError("SgemmConfig: " + "; ".join(bad))

    @property
    def nv(self) -> int:
        return self.nr // self.vl

    def kc_for(self, m: int) -> int:
        """The K block of a call (or seq block) of ``m`` rows."""
        return self.kc_deep if self.kc_deep and m >= KC_DEEP_MIN_M else self.kc


# --------------------------------------------------------------------------
# per-target configuration: one derivation for every ISA, from the vector registers
# and the cache sizes the CPU reports (target.cache_info)

@dataclasses.dataclass(frozen=True)
class VectorIsa:
    name: str
    vl: int            # f32 lanes per vector register
    regs: int          # vector registers
    lane_fma: bool     # FMA by element (NEON fmla v, v, v.s[i]): A rows need no broadcast
    fma: bool = True   # fused multiply-add (else a multiply into a temporary, then an add)


ISAS = {i.name: i for i in (VectorIsa("avx512", 16, 32, False), VectorIsa("avx2", 8, 16, False),
                             VectorIsa("neon", 4, 32, True),
                             # x86-64 without FMA: Sandy/Ivy Bridge (AVX), the SSE baselines
                             VectorIsa("avx", 8, 16, False, fma=False),
                             VectorIsa("sse", 4, 16, False, fma=False))}
# x86-64 CPUs (LLVM names) without AVX2/FMA; every other x86-64 name has them
NO_FMA_CPUS = {"sse": ("x86-64", "x86-64-v2", "generic", "core2", "penryn", "nehalem",
                       "westmere", "silvermont", "goldmont", "goldmont-plus", "tremont",
                       "btver1", "amdfam10", "k8"),
               "avx": ("sandybridge", "ivybridge", "btver2", "corei7-avx", "core-avx-i")}
KC_MIN, KC_MAX = 128, 512   # K block bounds: C is loaded and stored once per K block
MC_MAX = 288                # rows of A per L2 block: more did not help on a 2 MiB L2 (SPR)
NC_MAX = 4096
DYN_MIN_ROWS = 64           # rows per item of the dynamic row split, at least
DYN_MIN_M = 256             # ... which runs for M >= this (smaller M: the static split)
KC_DEEP_MIN_M = 256         # calls of at least this many rows take SgemmConfig.kc_deep
DYN_COLS_MIN_M = 32         # the dynamic column split (SgemmConfig.dyn_cols) for M >= this
                            # (and unit-stride A rows, which its items read in place)


@functools.lru_cache(maxsize=None)   # pure in the (frozen) isa; asked ~60x per compile
def register_tile(isa: VectorIsa) -> tuple[int, int]:
    """(mr, nv): the MR x (nv*VL) register tile for ``isa``.

    Each k step loads nv vectors of packed B and mr scalars of A (broadcast into one
    register, or mr/VL vectors with by-element FMA) for mr*nv FMAs.  Accumulators take
    at most 3/4 of the registers, the tile plus its B vectors and A registers must fit
    all of them; among those: the most FMAs per step, then the fewest loads, then the
    most spare registers, then the widest B panel.  AVX-512 (32 zmm): 6x4 vectors
    (6x64; 4x6 ties on loads but leaves one register); AVX2 (16 ymm): 4x3 (4x24: 7 loads
    per 12 FMAs; 6x2 needs 8, and measured 13% slower on 1024^3); NEON: 8x3 (8x12)."""
    best = None
    for nv in range(1, isa.regs):
        for mr in range(1, isa.regs):
            acc = mr * nv
            a_regs = -(-mr // isa.vl) if isa.lane_fma else 1
            used = acc + nv + a_regs + (0 if isa.fma else 1)   # no FMA: a product temporary
            if 4 * acc > 3 * isa.regs or used > isa.regs:
                continue
            loads = nv + a_regs if isa.lane_fma else nv + mr
            key = (acc, -loads, isa.regs - used, nv)
            if best is None or key > best[0]:
                best = (key, mr, nv)
    return best[1], best[2]


def derive_config(isa: VectorIsa, caches, **overrides) -> SgemmConfig:
    """The SgemmConfig for ``isa`` on a CPU with ``caches`` (target.CacheInfo).

    The analytical model of Low et al. ("Analytical modeling is enough for
    high-performance BLIS", TOMS 2016) for the loop nest in the header:
      kc  the packed B micro-panel (kc x nr) stays in L1 while A micro-panels (mr x kc)
          stream through it: B gets floor((ways-1) / (1 + mr/nr)) ways of L1d (one
          way left for C); kc in [KC_MIN, KC_MAX], a multiple of 16;
      mc  the packed A block (mc x kc) takes half of L2 (the B micro-panel, C tiles and
          the next block share the rest); a multiple of mr, at most MC_MAX;
      nc  the packed B block (kc x nc) fits this core's share of L3; a multiple of nr,
          at most NC_MAX.
    kc_deep  calls of KC_DEEP_MIN_M rows and more take KC_MAX with the AVX-512 tile, where
          the A block still fits half of L2 (they pass over C fewer times, which outweighs
          B streaming from L2: see the measurements below).
    Sapphire Rapids (48 KiB/12-way L1d, 2 MiB L2), AVX-512 6x64: kc 160 (512 from 256
    rows), mc 288, nc 4096;
    Zen 3 (32 KiB/8-way, 512 KiB), AVX2 4x24: kc 256, mc 256, nc 4080; Haswell (256 KiB
    L2): kc 256, mc 128, nc 2544; Zen 4 (32 KiB/8-way, 1 MiB, 16 MiB L3 per core),
    AVX-512 6x64: the L1d holds under KC_MIN rows of B, so kc 512 (B from L2), mc 252,
    nc 4096."""
    mr, nv = register_tile(isa)
    nr = nv * isa.vl
    way = caches.l1d // max(caches.l1d_ways, 1)
    ways_b = max(1, int((caches.l1d_ways - 1) / (1 + mr / nr)))
    kc = ways_b * way // (nr * 4) // 16 * 16
    # an L1d too small for KC_MIN rows of the B micro-panel (Zen 4 / Skylake-SP: 32 KiB
    # 8-way against the 6x64 tile's 256-byte rows) cannot keep B there at any useful kc:
    # B streams from L2 anyway, so take the deepest block, which loads and stores C the
    # fewest times (Zen 4, 1 thread, 1024^3: kc 128 -> 512 gave 88-92 -> 96-101 GFLOP/s)
    kc = KC_MAX if kc < KC_MIN else min(KC_MAX, kc)
    mc = min(MC_MAX, max(mr, caches.l2 // 2 // (kc * 4) // mr * mr))
    nc = min(NC_MAX // nr * nr, max(nr, caches.l3 // (kc * 4) // nr * nr))
    # tail chunks of the dynamic split: with 16 registers (AVX2 4x24) +2-4% on a 2-thread
    # 1024^3; the AVX-512 6x64 tile's 40 KB B panel served only 6 tiles per tail chunk
    # (36 rows) ran 2-4% slower than without (one-process A/B on Sapphire Rapids)
    # the dynamic row split packs each item's A block with 16 registers (AVX2: 2.4-8% faster
    # than reading A in place on 1024^3 and 2048x1024x512, Zen 3); the AVX-512 tile keeps
    # reading A in place, as it was measured (Sapphire Rapids)
    # B packed row by row: enough rows per step that a panel's run is whole 64-byte lines
    # (AVX2's 24-float rows: 2; Zen 4, 2 threads, 1024^3 and W3/W10-like shapes: 1.0-1.3%
    # faster in the dynamic split, one thread and AVX-512 unchanged)
    # deep K blocks for calls of KC_DEEP_MIN_M rows and more, with the wide AVX-512 tile:
    # kc 512 against 160 on Sapphire Rapids-class Intel (48 KiB L1d, 2 MiB L2), 2 threads:
    # 1024^3 0.84 of the time, 2048x256x1024 0.92, 512^3 0.92, 256x512x1024 0.90,
    # 256x1024x2048 1.01, 1024x256x256 1.05 (one block of 256 against two of 128); 1 thread
    # 1024^3 0.87.  Not below that: W3's 128x512x784 ran 1.08 (B from L2 for few tiles).
    # AVX2 (4x24, Intel and Zen 4): kc 384-512 no faster on 1024^3, so no deep blocks.  The
    # A block at the deep kc must still fit half of L2 (not on a 512 KiB L2)
    deep = isa.regs > 16 and not isa.lane_fma and mc * KC_MAX * 4 <= caches.l2 // 2
    kc_deep = KC_MAX if deep and kc < KC_MAX else 0
    cfg = SgemmConfig(isa.name, isa.vl, mr, nr, kc=kc, mc=mc, nc=nc, kc_deep=kc_deep,
                      pack_b_rows=64 // math.gcd(nr * 4, 64),
                      direct_a_edge=bool(nr & (nr - 1)),
                      dyn_tail=4 if isa.regs <= 16 else 1, dyn_direct_a=isa.regs > 16)
    if "kc" in overrides and "kc_deep" not in overrides:
        overrides = {**overrides, "kc_deep": 0}   # an explicit kc is every call's K block
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


def _isa_for(cpu: str) -> VectorIsa:
    from rlxc.lowering.cpu.target import resolve_target

    arch = resolve_target(cpu)[0].arch
    if arch == "aarch64":
        return ISAS["neon"]
    if arch != "x86_64":
        raise NotImplementedError(f"sgemm: no kernel configuration for {arch}")
    if cpu in ("native", "host", ""):
        if host_has_avx512():
            return ISAS["avx512"]
        from rlxc.lowering.cpu.target import host_cpu_features

        feats = set(host_cpu_features().split(","))
        if feats and "+fma" not in feats:
            return ISAS["avx" if "+avx" in feats else "sse"]
        return ISAS["avx2"]
    for isa, names in NO_FMA_CPUS.items():
        if cpu in names:
            return ISAS[isa]
    if cpu in ("avx512", "x86-64-v4") or "avx512" in cpu or cpu in (
            "skylake-avx512", "cascadelake", "cooperlake", "icelake-server",
            "sapphirerapids", "graniterapids", "emeraldrapids", "znver4", "znver5",
            "tigerlake", "rocketlake", "icelake-client"):
        return ISAS["avx512"]
    return ISAS["avx2"]


def sgemm_config(cpu: str = "native", **overrides) -> SgemmConfig:
    """The sgemm configuration for ``cpu``: the ISA (AVX-512 when ``cpu`` is "native" and
    the host has avx512f, or an AVX-512 CPU name; AArch64 NEON; else AVX2) and the
    blocking derived from its caches (derive_config)."""
    from rlxc.lowering.cpu.target import cache_info

    return derive_config(_isa_for(cpu), cache_info(cpu), **overrides)


def sgemm_params(cpu: str = "native") -> dict:
    """What the sgemm of ``cpu`` was tuned with, for metadata and `rlxc compile -v`."""
    from rlxc.lowering.cpu.target import cache_info, resolve_target

    cfg, caches = sgemm_config(cpu), cache_info(cpu)
    return {"cpu": resolve_target(cpu)[1], "isa": cfg.isa, "tile": f"{cfg.mr}x{cfg.nr}",
            "kc": cfg.kc, "kc_deep": cfg.kc_for(KC_DEEP_MIN_M), "mc": cfg.mc, "nc": cfg.nc,
            "caches": {"l1d": caches.l1d, "l1d_ways": caches.l1d_ways, "l2": caches.l2,
                       "l3_per_core": caches.l3, "source": caches.source}}


def describe_params(p: dict) -> str:
    """One line for `rlxc compile -v`."""
    c = p["caches"]
    deep = p.get("kc_deep", p["kc"])
    kc = f"kc={p['kc']}" + (f" (M >= {KC_DEEP_MIN_M}: {deep})" if deep != p["kc"] else "")
    return (f"sgemm for {p['cpu']}: {p['isa']} {p['tile']} tile, {kc} mc={p['mc']} "
            f"nc={p['nc']} (L1d {c['l1d'] >> 10} KiB/{c['l1d_ways']}-way, L2 {c['l2'] >> 10} KiB,"
            f" L3 {c['l3_per_core'] >> 10} KiB/core from {c['source']})")


def _rup_ir(b, x, m: int):
    """x rounded up to a multiple of m, in IR (i64): the twin of _rup."""
    return b.mul(b.sdiv(b.add(x, _c64(m - 1)), _c64(m)), _c64(m))


def _rup(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _per_thread_floats(M: int, N: int, K: int, cfg: SgemmConfig) -> int:
    kc = max(1, min(cfg.kc_for(M), K))
    mc = min(cfg.mc, _rup(max(M, 1), cfg.mr))
    nc = min(cfg.nc, _rup(max(N, 1), cfg.nr))
    kb = max(K, 1) if dyn_ok(M, N, K, cfg) else kc   # the dynamic split packs all of K
    return _rup(mc * kc, 16) + 16 + _rup(kb * nc, 16) + 16


def sgemm_workspace_floats(M: int, N: int, K: int, threads: int = 1, *,
                           cpu: str = "native", config: SgemmConfig | None = None) -> int:
    """Floats of workspace an sgemm emitted with ``config`` (default: the one
    for ``cpu``) needs to run (M, N, K) on up to ``threads`` threads.  Passing
    a smaller workspace caps the thread count at what fits."""
    cfg = config or sgemm_config(cpu)
    return max(1, int(threads)) * _per_thread_floats(M, N, K, cfg)


def sgemm_signature(epilogue_arg_types: Sequence[ir.Type] = ()) -> ir.FunctionType:
    """``void (i64 M, i64 N, i64 K, float* A, i64 rsa, i64 csa, float* B,
    i64 rsb, i64 csb, float* C, i64 ldc, i32 accumulate, float* workspace,
    i64 workspace_floats, <epilogue args>...)``"""
    return ir.FunctionType(VOID, [I64, I64, I64, F32P, I64, I64, F32P, I64, I64,
                                  F32P, I64, I32, F32P, I64, *epilogue_arg_types])


# --------------------------------------------------------------------------
# small IR helpers

def _c64(v: int) -> ir.Constant:
    return ir.Constant(I64, int(v))


def _intrinsic(module: ir.Module, name: str, ret, args) -> ir.Function:
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ret, list(args)), name)
    return fn


def _smin(b, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


def _smax(b, x, y):
    return b.select(b.icmp_signed(">", x, y), x, y)


def _gep(b, p, i):
    return b.gep(p, [i], inbounds=True)


def _gep_any(b, p, i):
    """GEP without inbounds: prefetch addresses may point past the operand."""
    return b.gep(p, [i])


def counted_loop(b: ir.IRBuilder, lo, hi, step: int | ir.Value, body, name="i"):
    """for (iv = lo; iv < hi; iv += step) body(b, iv)   (signed i64)."""
    fn = b.function
    head = fn.append_basic_block(name + ".head")
    loop = fn.append_basic_block(name + ".body")
    done = fn.append_basic_block(name + ".done")
    pre = b.block
    b.branch(head)
    b.position_at_end(head)
    iv = b.phi(I64, name=name)
    iv.add_incoming(lo, pre)
    b.cbranch(b.icmp_signed("<", iv, hi), loop, done)
    b.position_at_end(loop)
    body(b, iv)
    st = step if isinstance(step, ir.Value) else _c64(step)
    iv.add_incoming(b.add(iv, st), b.block)
    b.branch(head)
    b.position_at_end(done)


def _vec_ptr(b, p, vt):
    return b.bitcast(p, vt.as_pointer())


def _splat(b, x, n):
    vt = ir.VectorType(x.type, n)
    v = b.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(v, ir.Constant(vt, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, n), [0] * n))


def _lane_mask(b, first_col_off: int, n_rem, lanes: int):
    """<lanes x i1>: lane l valid iff first_col_off + l < n_rem."""
    idx = ir.Constant(ir.VectorType(I64, lanes), [first_col_off + l for l in range(lanes)])
    return b.icmp_signed("<", idx, _splat(b, n_rem, lanes))


def masked_load(builder: ir.IRBuilder, ptr, lanes: int, mask=None, passthru=None,
                align: int = 4):
    """Load ``<lanes x float>`` from float* ``ptr``; with an ``<lanes x i1>``
    mask only the valid lanes are read (the others are ``passthru``, zero by
    default).  For epilogue hooks loading bias rows etc."""
    vt = ir.VectorType(F32, lanes)
    vp = _vec_ptr(builder, ptr, vt)
    if mask is None:
        return builder.load(vp, align=align)
    mt = ir.VectorType(I1, lanes)
    fn = _intrinsic(builder.module, f"llvm.masked.load.v{lanes}f32.p0", vt,
                    [vt.as_pointer(), I32, mt, vt])
    pt = passthru if passthru is not None else ir.Constant(vt, None)
    return builder.call(fn, [vp, ir.Constant(I32, align), mask, pt])


def _masked_store(b, val, ptr, mask, align=4):
    vt = val.type
    mt = ir.VectorType(I1, vt.count)
    vp = _vec_ptr(b, ptr, vt)
    if mask is None:
        b.store(val, vp, align=align)
        return
    fn = _intrinsic(b.module, f"llvm.masked.store.v{vt.count}f32.p0", VOID,
                    [vt, vt.as_pointer(), I32, mt])
    b.call(fn, [val, vp, ir.Constant(I32, align), mask])


def _prefetch(b, ptr, rw: int, locality: int = 3):
    fn = _intrinsic(b.module, "llvm.prefetch.p0", VOID, [I8P, I32, I32, I32])
    b.call(fn, [b.bitcast(ptr, I8P), ir.Constant(I32, rw), ir.Constant(I32, locality),
                ir.Constant(I32, 1)])


def _align64(b, p):
    """Round float* p up to a 64-byte boundary."""
    i = b.ptrtoint(p, I64)
    i = b.and_(b.add(i, _c64(63)), _c64(~63))
    return b.inttoptr(i, F32P)


def _set_noalias(fn: ir.Function, idxs):
    for i in idxs:
        fn.args[i].add_attribute("noalias")


# --------------------------------------------------------------------------
# packing

def _internal_fn(module: ir.Module, name: str, arg_types, noalias=(), inline=None
                 ) -> ir.Function:
    """A void internal function of the sgemm: its pointer args `noalias` marked noalias,
    and "noinline" or "alwaysinline" when given."""
    fn = ir.Function(module, ir.FunctionType(VOID, list(arg_types)), name)
    fn.linkage = "internal"
    if inline:
        fn.attributes.add(inline)
    _set_noalias(fn, noalias)
    return fn


def _fma(module: ir.Module, vl: int, fused: bool = True) -> ir.Function:
    """a*b + c on <vl x float>: llvm.fma, or (``fused=False``, a CPU without FMA, where
    llvm.fma would become a call to fmaf per lane) an inlined multiply and add."""
    vt = ir.VectorType(F32, vl)
    if fused:
        return _intrinsic(module, f"llvm.fma.v{vl}f32", vt, [vt, vt, vt])
    name = f"rlxc.madd.v{vl}f32"
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(vt, [vt, vt, vt]), name)
        fn.linkage = "internal"
        fn.attributes.add("alwaysinline")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.ret(b.fadd(b.fmul(fn.args[0], fn.args[1]), fn.args[2]))
    return fn


def _transpose_rows(b, vs, rows: int, lanes: int):
    """rows vectors of ``lanes`` floats → one <rows*lanes> vector, element
    kk*rows + r = vs[r][kk] (concatenate pairwise, then one shuffle)."""
    def concat(x, y):
        n = x.type.count
        if y is None:
            y = ir.Constant(x.type, ir.Undefined)
            return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, 2 * n),
                                                      list(range(n)) + [n] * n))
        return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n))))
    level = list(vs)
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level), 2):
            nxt.append(concat(level[i], level[i + 1] if i + 1 < len(level) else None))
        level = nxt
    whole = level[0]  # row r at [r*lanes, (r+1)*lanes)
    mask = [r * lanes + kk for kk in range(lanes) for r in range(rows)]
    return b.shuffle_vector(whole, ir.Constant(whole.type, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, rows * lanes), mask))


def _emit_pack_a(module, name, cfg: SgemmConfig) -> ir.Function:
    """pack_a(A, rsa, csa, mc, kc, Ap): MR-row micro-panels, Ap[p*MR*kc + k*MR + r]."""
    MR, VL = cfg.mr, cfg.vl
    vt = ir.VectorType(F32, VL)
    fn = _internal_fn(module, name, [F32P, I64, I64, I64, I64, F32P], [0, 5], inline="noinline")
    A, rsa, csa, mc, kc, Ap = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    zero = ir.Constant(F32, 0.0)

    def panel(b, i0):
        mr_cur = _smin(b, _c64(MR), b.sub(mc, i0))
        dst = _gep(b, Ap, b.mul(i0, kc))
        src = _gep(b, A, b.mul(i0, rsa))
        full = b.icmp_signed("==", mr_cur, _c64(MR))
        with b.if_else(full) as (then, other):
            with then:
                unit = b.icmp_signed("==", csa, _c64(1))
                with b.if_else(unit) as (t2, o2):
                    with t2:
                        # row-major A: each of MR rows read contiguously along k
                        rows = [_gep(b, src, b.mul(_c64(r), rsa)) for r in range(MR)]
                        kv = b.mul(b.sdiv(kc, _c64(VL)), _c64(VL))

                        def kbv(b, k):
                            # VL k-values of each row, transposed in registers:
                            # out[kk*MR + r] = row_r[k + kk]
                            vs = [b.load(_vec_ptr(b, _gep(b, rows[r], k), vt), align=4)
                                  for r in range(MR)]
                            out = _transpose_rows(b, vs, MR, VL)
                            b.store(out, _vec_ptr(b, _gep(b, dst, b.mul(k, _c64(MR))), out.type),
                                    align=4)
                        counted_loop(b, _c64(0), kv, VL, kbv, "pa.kv")

                        def kb(b, k):
                            d = _gep(b, dst, b.mul(k, _c64(MR)))
                            for r in range(MR):
                                b.store(b.load(_gep(b, rows[r], k)), _gep(b, d, _c64(r)))
                        counted_loop(b, kv, kc, 1, kb, "pa.k")
                    with o2:
                        def kb2(b, k):
                            s = _gep(b, src, b.mul(k, csa))
                            d = _gep(b, dst, b.mul(k, _c64(MR)))
                            for r in range(MR):
                                b.store(b.load(_gep(b, s, b.mul(_c64(r), rsa))),
                                        _gep(b, d, _c64(r)))
                        counted_loop(b, _c64(0), kc, 1, kb2, "pa.k2")
            with other:
                def kb3(b, k):
                    s = _gep(b, src, b.mul(k, csa))
                    d = _gep(b, dst, b.mul(k, _c64(MR)))
                    for r in range(MR):
                        ok = b.icmp_signed("<", _c64(r), mr_cur)
                        # clamp the row so the address is always in bounds
                        rr = b.select(ok, _c64(r), _c64(0))
                        v = b.load(_gep(b, s, b.mul(rr, rsa)))
                        b.store(b.select(ok, v, zero), _gep(b, d, _c64(r)))
                counted_loop(b, _c64(0), kc, 1, kb3, "pa.k3")

    counted_loop(b, _c64(0), mc, MR, panel, "pa.i")
    b.ret_void()
    return fn


def _emit_pack_b(module, name, cfg: SgemmConfig) -> ir.Function:
    """pack_b(B, rsb, csb, kc, nc, Bp): NR-column micro-panels, Bp[p*NR*kc + k*NR + c]."""
    NR, VL, NV = cfg.nr, cfg.vl, cfg.nv
    vt = ir.VectorType(F32, VL)
    fn = _internal_fn(module, name, [F32P, I64, I64, I64, I64, F32P], [0, 5], inline="noinline")
    B, rsb, csb, kc, nc, Bp = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    zero = ir.Constant(F32, 0.0)

    def panel(b, j0):
        nr_cur = _smin(b, _c64(NR), b.sub(nc, j0))
        dst = _gep(b, Bp, b.mul(j0, kc))
        src = _gep(b, B, b.mul(j0, csb))
        unit = b.icmp_signed("==", csb, _c64(1))
        with b.if_else(unit) as (then, other):
            with then:
                full = b.icmp_signed("==", nr_cur, _c64(NR))
                masks = [None] * NV
                with b.if_else(full) as (t2, o2):
                    with t2:
                        def kb(b, k):
                            s = _gep(b, src, b.mul(k, rsb))
                            d = _gep(b, dst, b.mul(k, _c64(NR)))
                            for v in range(NV):
                                x = b.load(_vec_ptr(b, _gep(b, s, _c64(v * VL)), vt), align=4)
                                b.store(x, _vec_ptr(b, _gep(b, d, _c64(v * VL)), vt), align=64)
                        counted_loop(b, _c64(0), kc, 1, kb, "pb.k")
                    with o2:
                        masks = [_lane_mask(b, v * VL, nr_cur, VL) for v in range(NV)]

                        def kb2(b, k):
                            s = _gep(b, src, b.mul(k, rsb))
                            d = _gep(b, dst, b.mul(k, _c64(NR)))
                            for v in range(NV):
                                x = masked_load(b, _gep(b, s, _c64(v * VL)), VL, masks[v])
                                b.store(x, _vec_ptr(b, _gep(b, d, _c64(v * VL)), vt), align=64)
                        counted_loop(b, _c64(0), kc, 1, kb2, "pb.k2")
            with other:
                # strided (e.g. transposed) B: gather NR columns per k
                def kb3(b, k):
                    s = _gep(b, src, b.mul(k, rsb))
                    d = _gep(b, dst, b.mul(k, _c64(NR)))
                    for c in range(NR):
                        ok = b.icmp_signed("<", _c64(c), nr_cur)
                        cc = b.select(ok, _c64(c), _c64(0))
                        x = b.load(_gep(b, s, b.mul(cc, csb)))
                        b.store(b.select(ok, x, zero), _gep(b, d, _c64(c)))
                counted_loop(b, _c64(0), kc, 1, kb3, "pb.k3")

    if not cfg.pack_b_rows:
        counted_loop(b, _c64(0), nc, NR, panel, "pb.j")
        b.ret_void()
        return fn
    # unit-stride B: row by row across all full panels (each source row is read
    # sequentially, which the hardware prefetcher follows; panel by panel reads NR
    # floats per row at stride rsb, a stream it loses when rows are >= 2 KiB apart)
    with b.if_else(b.icmp_signed("==", csb, _c64(1))) as (then, other):
        with then:
            nfull = b.mul(b.sdiv(nc, _c64(NR)), _c64(NR))
            pstride = b.mul(kc, _c64(NR))

            R = cfg.pack_b_rows       # >= 1 here (0 packs panel by panel, above)

            def kb(b, k, rows=R):
                # `rows` source rows per step: a panel then gets rows * NR floats in a run
                # (two rows of the AVX2 24-float panel: three whole cache lines), not one
                # NR-float row whose line another row completes after the line may have
                # left L1 (every panel starts kc*NR floats after the previous, a multiple
                # of 4 KiB at kc 256: all of them sit in one L1 set)
                s = _gep(b, B, b.mul(k, rsb))
                d = _gep(b, Bp, b.mul(k, _c64(NR)))

                def jb(b, j0):
                    dd = _gep(b, d, b.mul(b.sdiv(j0, _c64(NR)), pstride))
                    for r in range(rows):
                        sr = _gep(b, s, b.mul(_c64(r), rsb))
                        for v in range(NV):
                            x = b.load(_vec_ptr(b, _gep(b, sr, b.add(j0, _c64(v * VL))), vt),
                                       align=4)
                            b.store(x, _vec_ptr(b, _gep(b, dd, _c64(r * NR + v * VL)), vt),
                                    align=VL * 4)
                counted_loop(b, _c64(0), nfull, NR, jb, "pr.j")
            kmain = b.mul(b.sdiv(kc, _c64(R)), _c64(R))
            counted_loop(b, _c64(0), kmain, R, kb, "pr.k")
            if R > 1:
                counted_loop(b, kmain, kc, 1, lambda b, k: kb(b, k, 1), "pr.kt")
            counted_loop(b, nfull, nc, NR, panel, "pr.edge")
        with other:
            counted_loop(b, _c64(0), nc, NR, panel, "pb.j")
    b.ret_void()
    return fn


# --------------------------------------------------------------------------
# microkernel

def _emit_micro(module, name, cfg: SgemmConfig, epilogue, epi_types, nv: int | None = None,
                direct_a: bool = False) -> ir.Function:
    """micro(kc, Ap, Bp, C, ldc, m_rem, n_rem, beta i1, last i1, row0, col0, epi...)

    Computes an MR × (nv*VL) tile (nv <= NR/VL vectors; the packed B panel
    keeps its NR stride), for n_rem <= nv*VL: the narrower variants serve the
    last column panel when N is not a multiple of NR."""
    MR, NR, VL, U = cfg.mr, cfg.nr, cfg.vl, cfg.unroll
    NV = nv or cfg.nv
    vt = ir.VectorType(F32, VL)
    fn = _internal_fn(module, name, [I64, F32P, F32P, F32P, I64, I64, I64, I1, I1, I64, I64,
                                     *([I64] if direct_a else []), *epi_types],
                      [1, 2, 3], inline="alwaysinline")
    kc, Ap, Bp, C, ldc, m_rem, n_rem, beta, last, row0, col0 = fn.args[:11]
    lda = fn.args[11] if direct_a else None
    epi_args = list(fn.args[12 if direct_a else 11:])
    fma = _fma(module, VL, ISAS[cfg.isa].fma)

    b = ir.IRBuilder(fn.append_basic_block("entry"))
    entry = b.block
    zero_v = ir.Constant(vt, None)

    if cfg.prefetch_c:
        for r in range(MR):
            rr = b.select(b.icmp_signed("<", _c64(r), m_rem), _c64(r), _c64(0))
            crow = _gep(b, C, b.mul(rr, ldc))
            for off in range(0, NV * VL, 16):  # one prefetch per 64-byte line
                _prefetch(b, _gep_any(b, crow, _c64(off)), 1)

    if direct_a:   # A read in place: row r at Ap + r*lda (rows past m_rem repeat the last)
        aoff = [b.mul(_smin(b, _c64(r), b.sub(m_rem, _c64(1))), lda) for r in range(MR)]

    def step(b, pa, pb, acc, k_off):
        """One rank-1 update at k = k_off (relative to pa/pb)."""
        bv = [b.load(_vec_ptr(b, _gep(b, pb, _c64(k_off * NR + v * VL)), vt), align=64)
              for v in range(NV)]
        out = []
        for r in range(MR):
            ap = _gep(b, _gep(b, pa, aoff[r]), _c64(k_off)) if direct_a else \
                _gep(b, pa, _c64(k_off * MR + r))
            a = _splat(b, b.load(ap, align=4), VL)
            out.append([b.call(fma, [a, bv[v], acc[r][v]]) for v in range(NV)])
        return out

    def loop(b, pre_block, trip, pa0, pb0, acc0, per_iter, tag):
        head = fn.append_basic_block(tag + ".head")
        body = fn.append_basic_block(tag + ".body")
        done = fn.append_basic_block(tag + ".done")
        b.branch(head)
        b.position_at_end(head)
        it = b.phi(I64, name=tag + ".it")
        pa = b.phi(F32P, name=tag + ".pa")
        pb = b.phi(F32P, name=tag + ".pb")
        acc = [[b.phi(vt, name=f"{tag}.c{r}_{v}") for v in range(NV)] for r in range(MR)]
        it.add_incoming(_c64(0), pre_block)
        pa.add_incoming(pa0, pre_block)
        pb.add_incoming(pb0, pre_block)
        for r in range(MR):
            for v in range(NV):
                acc[r][v].add_incoming(acc0[r][v], pre_block)
        b.cbranch(b.icmp_signed("<", it, trip), body, done)
        b.position_at_end(body)
        cur = acc
        if cfg.prefetch_a:
            _prefetch(b, _gep_any(b, pa, _c64(cfg.prefetch_a * MR)), 0)
        if cfg.prefetch_b:
            _prefetch(b, _gep_any(b, pb, _c64(cfg.prefetch_b * NR)), 0)
        for u in range(per_iter):
            cur = step(b, pa, pb, cur, u)
        latch = b.block
        it.add_incoming(b.add(it, _c64(1)), latch)
        pa.add_incoming(_gep(b, pa, _c64(per_iter * (1 if direct_a else MR))), latch)
        pb.add_incoming(_gep(b, pb, _c64(per_iter * NR)), latch)
        for r in range(MR):
            for v in range(NV):
                acc[r][v].add_incoming(cur[r][v], latch)
        b.branch(head)
        b.position_at_end(done)
        return pa, pb, acc

    acc0 = [[zero_v] * NV for _ in range(MR)]
    n_main = b.sdiv(kc, _c64(U)) if U > 1 else kc
    pa, pb, acc = loop(b, entry, n_main, Ap, Bp, acc0, U, "km")
    if U > 1:
        n_rem_k = b.srem(kc, _c64(U))
        pa, pb, acc = loop(b, b.block, n_rem_k, pa, pb, acc, 1, "kr")

    # ---- store phase
    def store_tile(b, masked: bool, load_c: bool, epi: bool):
        masks = [_lane_mask(b, v * VL, n_rem, VL) for v in range(NV)] if masked else [None] * NV
        for r in range(MR):
            def row(b):
                crow = _gep(b, C, b.mul(_c64(r), ldc))
                for v in range(NV):
                    p = _gep(b, crow, _c64(v * VL))
                    x = acc[r][v]
                    if load_c:
                        x = b.fadd(x, masked_load(b, p, VL, masks[v]))
                    if epi:
                        x = epilogue(b, b.add(row0, _c64(r)), b.add(col0, _c64(v * VL)), x, VL,
                                     masks[v], epi_args)
                    _masked_store(b, x, p, masks[v])
            if masked and r > 0:
                with b.if_then(b.icmp_signed("<", _c64(r), m_rem)):
                    row(b)
            else:
                row(b)  # row 0 always exists (m_rem >= 1)

    # an epilogue with a tile form (sgemm_object's callback: one call per tile instead of one
    # per vector): the tile is stored as it is and the callback rewrites it in place
    tile = getattr(epilogue, "tile", None)

    def store_epi(b, masked, load_c):
        if tile is None:
            store_tile(b, masked, load_c, True)
            return
        use, call = tile
        with b.if_else(use(b, epi_args)) as (tt, to):
            with tt:
                store_tile(b, masked, load_c, False)
                call(b, row0, col0, C, ldc, m_rem, n_rem, epi_args)
            with to:
                store_tile(b, masked, load_c, True)

    def store_variants(b, masked):
        if epilogue is None:
            with b.if_else(beta) as (t, o):
                with t:
                    store_tile(b, masked, True, False)
                with o:
                    store_tile(b, masked, False, False)
        else:
            with b.if_else(beta) as (t, o):
                with t:
                    with b.if_else(last) as (t2, o2):
                        with t2:
                            store_epi(b, masked, True)
                        with o2:
                            store_tile(b, masked, True, False)
                with o:
                    with b.if_else(last) as (t2, o2):
                        with t2:
                            store_epi(b, masked, False)
                        with o2:
                            store_tile(b, masked, False, False)

    full = b.and_(b.icmp_signed("==", m_rem, _c64(MR)),
                  b.icmp_signed("==", n_rem, _c64(NV * VL)))
    with b.if_else(full, likely=True) as (t, o):
        with t:
            store_variants(b, False)
        with o:
            store_variants(b, True)
    b.ret_void()
    return fn


# --------------------------------------------------------------------------
# skinny kernel: M <= MR with unit-stride B rows (batch-1 inference, GEMV)

def _skinny_width(cfg: SgemmConfig, mr: int) -> int:
    """Vectors per row of the skinny tile: as wide as the accumulator budget allows."""
    budget, widest = (24, 8) if cfg.vl >= 16 else (12, 4)
    return max(1, min(widest, budget // mr))


def _skinny_fn(module, name, epi_types):
    """The function of a skinny kernel, gemv or skinnyM (seq calls either one with the same
    arguments): (fn, its 12 arguments, the epilogue's).

        (N, K, A, rsa, csa, B, rsb, C, ldc, beta i1, row0, col0, epi...)"""
    fn = _internal_fn(module, name, [I64, I64, F32P, I64, I64, F32P, I64, F32P, I64, I1, I64, I64,
                                     *epi_types],
                      [2, 5, 7], inline="noinline")
    return fn, fn.args[:12], list(fn.args[12:])


def _emit_gemv_rows(module, name, cfg: SgemmConfig, epilogue, epi_types) -> ir.Function:
    """skinny for one row (GEMV, c = a @ B): stream B row by row.

    With a single row there is no reuse to win in registers, only bandwidth:
    B is read as ``gemv_rows`` contiguous rows at a time and the row of C
    (in L1/L2) accumulates them, c[j] += a[k]*B[k,j] + a[k+1]*B[k+1,j] + ...,
    so the hardware streamers see long sequential runs.  C is zeroed first
    unless accumulating, and the epilogue runs in a last pass over C."""
    VL, KB = cfg.vl, cfg.gemv_rows
    vt = ir.VectorType(F32, VL)
    fn, (N, K, A, rsa, csa, B, rsb, C, ldc, beta, row0, col0), epi_args = \
        _skinny_fn(module, name, epi_types)
    fma = _fma(module, VL, ISAS[cfg.isa].fma)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    n_full = b.mul(b.sdiv(N, _c64(VL)), _c64(VL))
    tail = b.icmp_signed("<", n_full, N)

    def over_row(b, per_vec):
        """per_vec(b, j, mask) for every VL-vector of the row (masked tail)."""
        counted_loop(b, _c64(0), n_full, VL, lambda b, j: per_vec(b, j, None), "gv.j")
        with b.if_then(tail):
            per_vec(b, n_full, _lane_mask(b, 0, b.sub(N, n_full), VL))

    with b.if_then(b.not_(beta)):
        over_row(b, lambda b, j, m: _masked_store(b, ir.Constant(vt, None), _gep(b, C, j), m))

    def rows(b, k0, nrows):
        brows = [_gep(b, B, b.mul(b.add(k0, _c64(i)), rsb)) for i in range(nrows)]
        avs = [_splat(b, b.load(_gep(b, A, b.mul(b.add(k0, _c64(i)), csa))), VL)
               for i in range(nrows)]

        def vec(b, j, m):
            p = _gep(b, C, j)
            c = masked_load(b, p, VL, m)
            for i in range(nrows):
                c = b.call(fma, [avs[i], masked_load(b, _gep(b, brows[i], j), VL, m), c])
            _masked_store(b, c, p, m)
        over_row(b, vec)

    k_full = b.mul(b.sdiv(K, _c64(KB)), _c64(KB))
    counted_loop(b, _c64(0), k_full, KB, lambda b, k0: rows(b, k0, KB), "gv.k")
    counted_loop(b, k_full, K, 1, lambda b, k0: rows(b, k0, 1), "gv.kr")
    if epilogue is not None:
        def epi(b, j, m):
            p = _gep(b, C, j)
            x = epilogue(b, row0, b.add(col0, j), masked_load(b, p, VL, m), VL, m, epi_args)
            _masked_store(b, x, p, m)
        over_row(b, epi)
    b.ret_void()
    return fn


def _emit_skinny(module, name, cfg: SgemmConfig, mr: int, epilogue, epi_types) -> ir.Function:
    """skinny(N, K, A, rsa, csa, B, rsb, C, ldc, beta i1, row0, col0, epi...)

    C[0:mr, 0:N] (=|+=) A[0:mr, :] @ B with B rows read in place (csb == 1),
    nothing packed: with so few rows every element of B is used mr times
    only, so packing B would cost as much as the product and the problem is
    bound by streaming B.  Tiles of mr × W (W = skinny width) accumulate over
    all of K in registers; A elements are broadcast straight from A's
    strides; B rows W ahead are prefetched (each row of the tile sits on a
    different page, which the hardware streamers do not follow); the last
    partial tile uses masked loads and stores."""
    VL = cfg.vl
    NV = _skinny_width(cfg, mr)
    W = NV * VL
    vt = ir.VectorType(F32, VL)
    fn, (N, K, A, rsa, csa, B, rsb, C, ldc, beta, row0, col0), epi_args = \
        _skinny_fn(module, name, epi_types)
    fma = _fma(module, VL, ISAS[cfg.isa].fma)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    arows = [_gep(b, A, b.mul(_c64(r), rsa)) for r in range(mr)]

    def tile(b, j0, masks):
        b0 = _gep(b, B, j0)
        pre = b.block
        head = fn.append_basic_block("sk.head")
        body = fn.append_basic_block("sk.body")
        done = fn.append_basic_block("sk.done")
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(I64, name="k")
        brow = b.phi(F32P, name="brow")
        acc = [[b.phi(vt) for _ in range(NV)] for _ in range(mr)]
        k.add_incoming(_c64(0), pre)
        brow.add_incoming(b0, pre)
        for r in range(mr):
            for v in range(NV):
                acc[r][v].add_incoming(ir.Constant(vt, None), pre)
        b.cbranch(b.icmp_signed("<", k, K), body, done)
        b.position_at_end(body)
        if masks is None and cfg.skinny_prefetch:
            ahead = _gep_any(b, brow, b.mul(rsb, _c64(cfg.skinny_prefetch)))
            for off in range(0, W, 16):
                _prefetch(b, _gep_any(b, ahead, _c64(off)), 0)
        bv = [masked_load(b, _gep(b, brow, _c64(v * VL)), VL, None if masks is None else masks[v])
              for v in range(NV)]
        kcs = b.mul(k, csa)
        for r in range(mr):
            a = _splat(b, b.load(_gep(b, arows[r], kcs)), VL)
            for v in range(NV):
                acc[r][v].add_incoming(b.call(fma, [a, bv[v], acc[r][v]]), body)
        k.add_incoming(b.add(k, _c64(1)), body)
        brow.add_incoming(_gep(b, brow, rsb), body)
        b.branch(head)
        b.position_at_end(done)
        for r in range(mr):
            crow = _gep(b, C, b.add(b.mul(_c64(r), ldc), j0))
            for v in range(NV):
                m = None if masks is None else masks[v]
                p = _gep(b, crow, _c64(v * VL))
                x = acc[r][v]
                x = b.select(beta, b.fadd(x, masked_load(b, p, VL, m)), x)
                if epilogue is not None:
                    x = epilogue(b, b.add(row0, _c64(r)), b.add(col0, b.add(j0, _c64(v * VL))),
                                 x, VL, m, epi_args)
                _masked_store(b, x, p, m)

    n_full = b.mul(b.sdiv(N, _c64(W)), _c64(W))
    counted_loop(b, _c64(0), n_full, W, lambda b, j0: tile(b, j0, None), "skj")
    with b.if_then(b.icmp_signed("<", n_full, N)):
        n_rem = b.sub(N, n_full)
        tile(b, n_full, [_lane_mask(b, v * VL, n_rem, VL) for v in range(NV)])
    b.ret_void()
    return fn


# --------------------------------------------------------------------------
# narrow kernel: N <= VL with unit-stride rows of A (a classifier head, 512 -> 10)

def _narrow_widths(cfg: SgemmConfig) -> list[int]:
    """Column counts of the narrow variants: N runs the smallest one >= N.  6 is a conv's
    filter gradient of 6 output channels (LeNet's conv1: 75 x 6, K = 784 per image): on
    AVX-512 its tile is 3 rows (18 accumulators, 9 loads a k step) where the 8-column
    one is 2 rows of 8 (10 loads for 12 useful FMAs)."""
    return sorted({w for w in (2, 4, 6, 8, 12, 16) if w <= cfg.vl} | {cfg.vl})


def _narrow_rows(cfg: SgemmConfig, nj: int) -> int:
    """Rows per narrow tile (at most 4): R*nj accumulators and R rows of A, plus, once a
    Bt vector serves two rows, the nj Bt vectors must fit the registers (32 zmm or 16
    ymm, two spare); with one row each Bt load folds into its FMA."""
    regs = (32 if cfg.vl >= 16 else 16) - 2
    return max([1] + [r for r in range(2, 5) if r * nj + nj + r <= regs])


def _reduce_lanes(b, vecs, lanes: int):
    """One <lanes x float> whose lane j is the sum of the lanes of vecs[j] (len(vecs) <=
    lanes; other lanes undefined): a transpose-and-add tree, lanes-1 shuffle pairs and
    adds instead of one horizontal reduction per vector."""
    vt = ir.VectorType(F32, lanes)
    vs = list(vecs) + [None] * (lanes - len(vecs))
    # owner[v][lane]: whose partial sum (None: a missing vector's, don't care)
    owner = [[j if j < len(vecs) else None] * lanes for j in range(lanes)]
    h = lanes // 2
    while h >= 1:
        nvs, nown = [], []
        for t in range(0, len(vs), 2):
            x, y = vs[t], vs[t + 1]
            lo, hi, own = [], [], []
            for s0 in range(0, lanes, 2 * h):
                lo += list(range(s0, s0 + h)) + [lanes + i for i in range(s0, s0 + h)]
                hi += list(range(s0 + h, s0 + 2 * h)) + \
                    [lanes + i for i in range(s0 + h, s0 + 2 * h)]
                own += owner[t][s0:s0 + h] + owner[t + 1][s0:s0 + h]
            if x is None and y is None:
                nvs.append(None)
            else:
                # a missing partner: reuse the other vector (its lanes there are don't-care)
                xx, yy = (x if x is not None else y), (y if y is not None else x)
                mk = lambda idx: ir.Constant(ir.VectorType(I32, lanes), idx)  # noqa: E731
                nvs.append(b.fadd(b.shuffle_vector(xx, yy, mk(lo)),
                                  b.shuffle_vector(xx, yy, mk(hi))))
            nown.append(own)
        vs, owner, h = nvs, nown, h // 2
    where = {o: lane for lane, o in enumerate(owner[0])}
    perm = [where.get(j, 0) for j in range(lanes)]
    return b.shuffle_vector(vs[0], ir.Constant(vt, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, lanes), perm))


def _emit_narrow(module, name, cfg: SgemmConfig, nj: int, epilogue, epi_types) -> ir.Function:
    """narrow(M, K, A, rsa, Bt, ldbt, C, ldc, N, beta i1, last i1, row0, col0, epi...)

    C[0:M, 0:N] (=|+=) A[0:M, 0:K] @ Bt^T for N <= nj <= VL, A rows contiguous
    (csa == 1), Bt the packed transpose of B: nj rows of ldbt floats (ldbt a
    multiple of VL), zero beyond K and for rows >= N.  The vector axis is K:
    R rows at a time, acc[r][j] += A[i+r, k:k+VL] * Bt[j, k:k+VL], then one
    transpose-and-add tree per row gives the row of C as one vector.  The
    usual tile would broadcast A and fill nj of VL lanes with MR latency-bound
    accumulators, and pack all of A for a product this small."""
    VL = cfg.vl
    R = _narrow_rows(cfg, nj)
    vt = ir.VectorType(F32, VL)
    fn = _internal_fn(module, name, [I64, I64, F32P, I64, F32P, I64, F32P, I64, I64, I1, I1, I64,
                                     I64, *epi_types],
                      [2, 4, 6], inline="noinline")
    M, K, A, rsa, Bt, ldbt, C, ldc, N, beta, last, row0, col0 = fn.args[:13]
    epi_args = list(fn.args[13:])
    fma = _fma(module, VL, ISAS[cfg.isa].fma)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    k_full = b.mul(b.sdiv(K, _c64(VL)), _c64(VL))
    kmask = _lane_mask(b, 0, b.sub(K, k_full), VL)
    cmask = _lane_mask(b, 0, N, VL)
    btrows = [_gep(b, Bt, b.mul(_c64(j), ldbt)) for j in range(nj)]

    def tile(b, i):
        last_row = b.sub(M, _c64(1))
        arows = [_gep(b, A, b.mul(_smin(b, b.add(i, _c64(r)), last_row), rsa)) for r in range(R)]
        pre = b.block
        head = fn.append_basic_block("nk.head")
        body = fn.append_basic_block("nk.body")
        done = fn.append_basic_block("nk.done")
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(I64, name="k")
        acc = [[b.phi(vt) for _ in range(nj)] for _ in range(R)]
        k.add_incoming(_c64(0), pre)
        for r in range(R):
            for j in range(nj):
                acc[r][j].add_incoming(ir.Constant(vt, None), pre)
        b.cbranch(b.icmp_signed("<", k, k_full), body, done)
        b.position_at_end(body)

        def update(b, k, mask, acc_in):
            bv = [b.load(_vec_ptr(b, _gep(b, btrows[j], k), vt), align=64) for j in range(nj)]
            out = []
            for r in range(R):
                a = masked_load(b, _gep(b, arows[r], k), VL, mask)
                out.append([b.call(fma, [a, bv[j], acc_in[r][j]]) for j in range(nj)])
            return out
        nxt = update(b, k, None, acc)
        for r in range(R):
            for j in range(nj):
                acc[r][j].add_incoming(nxt[r][j], b.block)
        k.add_incoming(b.add(k, _c64(VL)), b.block)
        b.branch(head)
        b.position_at_end(done)
        res = acc
        # the K tail: A masked (Bt is zero there)
        tail_bb = b.block
        has_tail = b.icmp_signed("<", k_full, K)
        with b.if_then(has_tail):
            tail = update(b, k_full, kmask, acc)
            tail_end = b.block
        res = [[b.phi(vt) for _ in range(nj)] for _ in range(R)]
        for r in range(R):
            for j in range(nj):
                res[r][j].add_incoming(tail[r][j], tail_end)
                res[r][j].add_incoming(acc[r][j], tail_bb)
        for r in range(R):
            def store(b, r=r):
                x = _reduce_lanes(b, res[r], VL)
                p = _gep(b, C, b.mul(b.add(i, _c64(r)), ldc))
                x = b.select(beta, b.fadd(x, masked_load(b, p, VL, cmask)), x)
                if epilogue is not None:
                    with b.if_else(last) as (t, o):
                        with t:
                            y = epilogue(b, b.add(row0, b.add(i, _c64(r))), col0, x, VL,
                                         cmask, epi_args)
                            _masked_store(b, y, p, cmask)
                        with o:
                            _masked_store(b, x, p, cmask)
                else:
                    _masked_store(b, x, p, cmask)
            if r == 0:
                store(b)
            else:
                with b.if_then(b.icmp_signed("<", b.add(i, _c64(r)), M)):
                    store(b)

    counted_loop(b, _c64(0), M, R, tile, "ni")
    b.ret_void()
    return fn


def _emit_pack_bt(module, name, cfg: SgemmConfig) -> ir.Function:
    """pack_bt(B, rsb, csb, kc, N, nj, Bt, ldbt): Bt[j*ldbt + k] = B[k*rsb + j*csb] for
    j < N, k < kc; zero for kc <= k < ldbt and for N <= j < nj."""
    fn = _internal_fn(module, name, [F32P, I64, I64, I64, I64, I64, F32P, I64], [0, 6])
    B, rsb, csb, kc, N, nj, Bt, ldbt = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    zero = ir.Constant(F32, 0.0)

    def row(b, j):
        dst = _gep(b, Bt, b.mul(j, ldbt))
        real = b.icmp_signed("<", j, N)
        src = _gep(b, B, b.mul(b.select(real, j, _c64(0)), csb))
        kk = b.select(real, kc, _c64(0))

        def copy(b, k):
            b.store(b.load(_gep(b, src, b.mul(k, rsb))), _gep(b, dst, k))
        counted_loop(b, _c64(0), kk, 1, copy, "pbk")
        counted_loop(b, kk, ldbt, 1, lambda b, k: b.store(zero, _gep(b, dst, k)), "pbz")
    counted_loop(b, _c64(0), nj, 1, row, "pbj")
    b.ret_void()
    return fn


def _emit_narrow_driver(module, name, cfg: SgemmConfig, epilogue, epi_types) -> ir.Function:
    """narrow_drv(M, N, K, A, rsa, B, rsb, csb, C, ldc, beta i1, Bt, row0, col0, epi...):
    K in blocks of KC; each block packs Bt (workspace: VL rows of KC rounded up to VL,
    which fits the B part of a slot when K >= VL) and runs the variant for N."""
    VL, KC = cfg.vl, cfg.kc
    fn = _internal_fn(module, name, [I64, I64, I64, F32P, I64, F32P, I64, I64, F32P, I64, I1, F32P,
                                     I64, I64, *epi_types],
                      [3, 5, 8, 11])
    M, N, K, A, rsa, B, rsb, csb, C, ldc, beta, Bt, row0, col0 = fn.args[:14]
    epi_args = list(fn.args[14:])
    widths = _narrow_widths(cfg)
    variants = [_emit_narrow(module, f"{name}.n{w}", cfg, w, epilogue, epi_types)
                for w in widths]
    pack = _emit_pack_bt(module, name + ".pack_bt", cfg)
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def block(b, pc):
        kc = _smin(b, _c64(KC), b.sub(K, pc))
        ldbt = b.mul(b.sdiv(b.add(kc, _c64(VL - 1)), _c64(VL)), _c64(VL))
        beta_k = b.or_(beta, b.icmp_signed(">", pc, _c64(0)))
        last = b.icmp_signed(">=", b.add(pc, _c64(KC)), K)
        done = fn.append_basic_block("nw.done")
        for w, var in zip(widths, variants):
            nxt = fn.append_basic_block(f"nw.not{w}")
            with b.if_then(b.icmp_signed("<=", N, _c64(w))):
                b.call(pack, [_gep(b, B, b.mul(pc, rsb)), rsb, csb, kc, N, _c64(w), Bt, ldbt])
                b.call(var, [M, kc, _gep(b, A, pc), rsa, Bt, ldbt, C, ldc, N, beta_k, last,
                             row0, col0, *epi_args])
                b.branch(done)
            b.branch(nxt)
            b.position_at_end(nxt)
        b.unreachable()
        b.position_at_end(done)
    counted_loop(b, _c64(0), K, KC, block, "npc")
    b.ret_void()
    return fn


# --------------------------------------------------------------------------
# macro kernel + sequential driver

def _dispatch_width(b, n_rem, margs, variants, vl: int) -> None:
    """Call the microkernel variant for a column panel of n_rem columns: variants[i] is
    (i + 1) vectors of vl wide, the last one the full tile; the last panel of a block
    takes the narrowest tile covering it."""
    if len(variants) == 1:
        b.call(variants[0], margs)
        return
    fn = b.function
    nvu = b.sdiv(b.add(n_rem, _c64(vl - 1)), _c64(vl))
    done = fn.append_basic_block("micro.done")
    dflt = fn.append_basic_block("micro.full")
    sw = b.switch(nvu, dflt)
    for i, mk in enumerate(variants[:-1]):
        blk = fn.append_basic_block(f"micro.nv{i + 1}")
        sw.add_case(ir.Constant(I64, i + 1), blk)
        b.position_at_end(blk)
        b.call(mk, margs)
        b.branch(done)
    b.position_at_end(dflt)
    b.call(variants[-1], margs)
    b.branch(done)
    b.position_at_end(done)


def _emit_kc(b: ir.IRBuilder, M, cfg: SgemmConfig):
    """IR twin of cfg.kc_for(M): KC of a call (or seq block) of M rows (i64)."""
    if not cfg.kc_deep or cfg.kc_deep == cfg.kc:
        return _c64(cfg.kc)
    return b.select(b.icmp_signed(">=", M, _c64(KC_DEEP_MIN_M)), _c64(cfg.kc_deep),
                    _c64(cfg.kc))


def balanced_k_blocks(b: ir.IRBuilder, K, cfg: SgemmConfig, M):
    """(k_end, n_kblocks, kcb): the K blocks of seq and sgemm_dyn for M rows.  K = 0 still
    runs one (empty) block (k_end = max(K, 1)); n_kblocks = ceil(k_end / KC) blocks of kcb
    = ceil(k_end / n_kblocks) rounded up to the k unroll, at most KC (cfg.kc_for(M)):
    balanced (784 = 4 x 196, not 3 x 256 + 16), since a thin last block would pay a full
    pass of C loads and stores for a few rank-1 updates.  Every caller passes the M its
    workspace slot was sized for or less (seq: its rows of the call), so a deep KC always
    finds room for its blocks (kc_for grows with M)."""
    KC, UN = _emit_kc(b, M, cfg), cfg.unroll
    k_end = _smax(b, K, _c64(1))
    n_kblocks = b.sdiv(b.add(k_end, b.sub(KC, _c64(1))), KC)
    kcb = b.sdiv(b.add(k_end, b.sub(n_kblocks, _c64(1))), n_kblocks)
    kcb = b.mul(b.sdiv(b.add(kcb, _c64(UN - 1)), _c64(UN)), _c64(UN))
    return k_end, n_kblocks, _smin(b, kcb, KC)


def _emit_seq(module, name, cfg: SgemmConfig, micros, pack_a, pack_b, epi_types,
              skinnies=(), narrow=None, micro_da=None, talls=(), micro_edge=None) -> ir.Function:
    """seq(M, N, K, A, rsa, csa, B, rsb, csb, C, ldc, beta i1, Ap, Bp0, Bp1, row0, col0,
    tid i32, nt i32, coop i1, pre i1, epi...).

    coop = 0: one thread owns this whole C block; B is packed into Bp0.
    coop = 1: the nt threads of a team call this with their own rows of C
    (and their own Ap) but the same B; each packs its share of the NR panels
    of every (jc, pc) block into a shared buffer, then a team barrier makes
    the block visible.  The buffer alternates between Bp0 and Bp1 so one
    barrier per block suffices: a thread that packs block p+1 has passed
    barrier p, so nobody still reads the buffer of block p-1 it overwrites.

    pre = 1 (never with coop): B is already packed (PREPACKED_B, a bound weight):
    micro-panel p of these columns starts at B + p*rsb, K rows of NR floats each,
    zero padded, so no packing runs and every tile reads B there; the skinny, tall
    and narrow kernels (which read B's rows in place) are not used."""
    MR, NR, MC, NC, VL = cfg.mr, cfg.nr, cfg.mc, cfg.nc, cfg.vl
    fn = _internal_fn(module, name, [I64, I64, I64, F32P, I64, I64, F32P, I64, I64, F32P, I64, I1,
                                     F32P, F32P, F32P, I64, I64, I32, I32, I1, I1, *epi_types],
                      [3, 6, 9, 12])
    (M, N, K, A, rsa, csa, B, rsb, csb, C, ldc, acc, Ap, Bp0, Bp1, row0, col0, tid, nt,
     coop, pre) = fn.args[:21]
    epi_args = list(fn.args[21:])
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    # the in-place kernels below read B's rows: not for a packed B (coop never is)
    raw = b.not_(b.or_(coop, pre))
    if skinnies:
        # at most MR rows and unit-stride B rows: the unpacked skinny kernels
        use = b.and_(b.and_(b.icmp_signed("<=", M, _c64(len(skinnies))),
                            b.icmp_signed(">=", M, _c64(1))),
                     b.and_(b.icmp_signed("==", csb, _c64(1)), raw))
        with b.if_then(use, likely=False):
            rest = fn.append_basic_block("skinny.done")
            sw = b.switch(M, rest)
            for i, sk in enumerate(skinnies):
                blk = fn.append_basic_block(f"skinny{i + 1}")
                sw.add_case(ir.Constant(I64, i + 1), blk)
                b.position_at_end(blk)
                b.call(sk, [N, K, A, rsa, csa, B, rsb, C, ldc, acc, row0, col0, *epi_args])
                b.ret_void()
            b.position_at_end(rest)
            b.unreachable()
    if talls:
        # MR < M <= 24 (12) rows, unit-stride B: one register tile of all the rows
        from rlxc.lowering.cpu.sgemm_tall import emit_tall_dispatch
        emit_tall_dispatch(b, cfg, talls, M, [N, K, A, rsa, csa, B, rsb, C, ldc, acc, row0,
                                              col0, *epi_args], b.not_(raw), csb)
    if narrow is not None:
        # N <= VL, rows of A contiguous: the narrow kernel, which packs Bt into this
        # thread's B part (so not with coop, where Bp0 is shared; every thread of a team
        # decides alike, so none of them waits at a barrier the others skip)
        use = b.and_(b.and_(b.icmp_signed("<=", N, _c64(VL)), b.icmp_signed("==", csa, _c64(1))),
                     b.and_(b.icmp_signed(">=", K, _c64(VL)), raw))
        with b.if_then(use, likely=False):
            b.call(narrow, [M, N, K, A, rsa, B, rsb, csb, C, ldc, acc, Bp0, row0, col0,
                            *epi_args])
            b.ret_void()
    # a team that shares its B blocks (coop) must agree on them: the shallow KC for all,
    # whatever rows each thread has (seq's slot holds either)
    k_end, n_kblocks, kcb = balanced_k_blocks(b, K, cfg, b.select(coop, _c64(0), M))
    tid64, nt64 = b.sext(tid, I64), b.sext(nt, I64)
    # panelwise (one M block, not coop): B is packed one micro-panel at a time just
    # before its tiles, into one slot that stays in L1, while the next panel's source
    # rows are prefetched; with several M blocks each panel serves all of them, so the
    # block is packed whole first (amortized), and so is the team's shared (coop) B
    panelwise = (b.and_(b.not_(coop), b.icmp_signed("<=", M, _c64(MC)))
                 if cfg.pack_b_panel else None)
    # my share of the panels when cooperating: [share_lo, share_hi) of np panels
    share_lo_num = b.select(coop, tid64, _c64(0))
    share_den = b.select(coop, nt64, _c64(1))

    def _dispatch(b, n_rem, margs, micros=micros):
        _dispatch_width(b, n_rem, margs, micros, VL)

    def jc_body(b, jc):
        nc = _smin(b, _c64(NC), b.sub(N, jc))

        def pc_body(b, pc):
            kc = _smax(b, _smin(b, kcb, b.sub(K, pc)), _c64(0))
            blk = b.add(b.mul(b.sdiv(jc, _c64(NC)), n_kblocks), b.sdiv(pc, kcb))
            Bp = b.select(b.trunc(blk, I1), Bp1, Bp0)
            n_pan = b.sdiv(b.add(nc, _c64(NR - 1)), _c64(NR))
            p0 = b.sdiv(b.mul(n_pan, share_lo_num), share_den)
            p1 = b.sdiv(b.mul(n_pan, b.add(share_lo_num, _c64(1))), share_den)
            j0 = b.mul(p0, _c64(NR))
            j1 = _smin(b, b.mul(p1, _c64(NR)), nc)
            whole = ir.Constant(I1, 1) if panelwise is None else b.or_(coop, b.not_(panelwise))
            whole = b.and_(whole, b.not_(pre))
            with b.if_then(b.and_(whole, b.icmp_signed("<", j0, j1))):
                b.call(pack_b, [_gep(b, B, b.add(b.mul(pc, rsb), b.mul(b.add(jc, j0), csb))),
                                rsb, csb, kc, b.sub(j1, j0), _gep(b, Bp, b.mul(j0, kc))])
            with b.if_then(coop):
                parallel.emit_barrier(b, nt)
            beta = b.or_(acc, b.icmp_signed(">", pc, _c64(0)))
            last = b.icmp_signed(">=", b.add(pc, kcb), K)

            def ic_body(b, ic, direct=False):
                mc = _smin(b, _c64(MC), b.sub(M, ic))
                ablk = _gep(b, A, b.add(b.mul(ic, rsa), b.mul(pc, csa)))
                if not direct:
                    b.call(pack_a, [ablk, rsa, csa, mc, kc, Ap])
                cblk = _gep(b, C, b.add(b.mul(ic, ldc), jc))

                def jr_body(b, jr):
                    n_rem = _smin(b, _c64(NR), b.sub(nc, jr))
                    bp = _gep(b, Bp, b.mul(jr, kc))
                    # a prepacked B: this panel's rows of this K block, in place
                    pre_p = _gep(b, B, b.add(b.mul(b.sdiv(b.add(jc, jr), _c64(NR)), rsb),
                                             b.mul(pc, _c64(NR))))
                    pf_rows = None
                    if panelwise is not None:
                        # one M block: pack this panel now, into the one slot
                        bp = b.select(panelwise, Bp, bp)
                        mine = b.and_(panelwise, b.not_(pre))
                        with b.if_then(mine):
                            b.call(pack_b, [_gep(b, B, b.add(b.mul(pc, rsb),
                                                             b.mul(b.add(jc, jr), csb))),
                                            rsb, csb, kc, n_rem, bp])
                        # ... and prefetch the next panel's source rows (this block's next
                        # columns, else the next K block's first panel), a slice per tile
                        last_p = b.icmp_signed(">=", b.add(jr, _c64(NR)), nc)
                        nxt = _gep_any(b, B, b.add(
                            b.mul(b.select(last_p, b.add(pc, kcb), pc), rsb),
                            b.select(last_p, jc, b.add(jc, b.add(jr, _c64(NR))))))
                        # prepacked: the next panel at this K block, else this block's
                        # first panel at the next one (past the last: the next panel's
                        # first rows, contiguous in the packed layout)
                        nxt_pre = b.select(
                            last_p, _gep_any(b, B, b.add(
                                b.mul(b.sdiv(jc, _c64(NR)), rsb),
                                b.mul(b.add(pc, kcb), _c64(NR)))),
                            _gep_any(b, pre_p, rsb))
                        nxt = b.select(pre, nxt_pre, nxt)
                        tiles = b.sdiv(b.add(mc, _c64(MR - 1)), _c64(MR))
                        per = b.sdiv(b.add(kc, b.sub(tiles, _c64(1))), tiles)
                        pf_rows = (nxt, b.select(b.or_(pre, b.and_(
                            mine, b.icmp_signed("==", csb, _c64(1)))), per, _c64(0)),
                            b.select(pre, _c64(NR), rsb))
                    bp = b.select(pre, pre_p, bp)

                    def ir_body(b, i_r, rows=MR, edge=None):
                        m_rem = _smin(b, _c64(rows), b.sub(mc, i_r))
                        if pf_rows is not None and cfg.pack_b_prefetch:
                            nxt, per, pf_rs = pf_rows
                            if rows != MR:   # fewer, taller tiles: more rows each
                                per = b.mul(per, _c64(rows // MR))
                            r0 = b.mul(b.sdiv(i_r, _c64(rows)), per)

                            def pf(b, k):
                                row = _gep_any(b, nxt, b.mul(k, pf_rs))
                                for off in sorted({*range(0, NR, 16), NR - 1}):
                                    _prefetch(b, _gep_any(b, row, _c64(off)), 0,
                                              cfg.pack_b_prefetch)
                            counted_loop(b, r0, _smin(b, b.add(r0, per), kc), 1, pf, "pf")
                        ap = _gep(b, ablk, b.mul(i_r, rsa)) if direct else \
                            _gep(b, Ap, b.mul(i_r, kc))
                        cp = _gep(b, cblk, b.add(b.mul(i_r, ldc), jr))
                        margs = [kc, ap, bp, cp, ldc, m_rem, n_rem, beta, last,
                                 b.add(row0, b.add(ic, i_r)), b.add(col0, b.add(jc, jr))]
                        if edge is not None:
                            b.call(edge, [*margs, rsa, *epi_args])
                        elif direct:
                            _dispatch(b, n_rem, [*margs, rsa, *epi_args], micro_da)
                        else:
                            _dispatch(b, n_rem, [*margs, *epi_args])
                    if not (direct and micro_edge is not None):
                        counted_loop(b, _c64(0), mc, MR, ir_body, "ir")
                        return
                    # a panel of at most one vector (AVX2's N = 8 mod 24): EDGE_ROWS-row
                    # tiles, enough accumulators to keep both FMA pipes busy (MR x 1
                    # vector is MR accumulators: latency-bound at half speed)
                    with b.if_else(b.icmp_signed("<=", n_rem, _c64(VL))) as (t_e, o_e):
                        with t_e:
                            counted_loop(b, _c64(0), mc, EDGE_ROWS,
                                         lambda b, i_r: ir_body(b, i_r, EDGE_ROWS, micro_edge),
                                         "ire")
                        with o_e:
                            counted_loop(b, _c64(0), mc, MR, ir_body, "ir")
                counted_loop(b, _c64(0), nc, NR, jr_body, "jr")
            if micro_da is None:
                counted_loop(b, _c64(0), M, MC, ic_body, "ic")
                return
            # A read in place (no pack_a) when its rows are contiguous and either every
            # panel of this block is full width or there is one M block (small M: the
            # last column panel takes the narrowest direct tile covering it)
            full = b.icmp_signed("==", b.srem(nc, _c64(NR)), _c64(0))
            if cfg.direct_a_edge:
                full = b.or_(full, b.icmp_signed("<=", M, _c64(MC)))
            da = b.and_(b.icmp_signed("==", csa, _c64(1)), full)
            with b.if_else(da) as (t, o):
                with t:
                    counted_loop(b, _c64(0), M, MC, lambda b, ic: ic_body(b, ic, True), "icd")
                with o:
                    counted_loop(b, _c64(0), M, MC, ic_body, "ic")
        counted_loop(b, _c64(0), k_end, kcb, pc_body, "pc")
    counted_loop(b, _c64(0), N, NC, jc_body, "jc")
    b.ret_void()
    return fn


def _dyn_chunk_rows(b, M, nt, cfg: SgemmConfig):
    """Rows per item of the dynamic row split: M / (dyn_chunks * nt) rounded up to MR,
    at least DYN_MIN_ROWS (an item streams all of packed B through L2 once), at most MC
    and at most a 1/nt share of M (every thread gets an item)."""
    per = b.mul(_c64(cfg.dyn_chunks), nt)
    rows = _rup_ir(b, b.sdiv(b.add(M, b.sub(per, _c64(1))), per), cfg.mr)
    rows = _smax(b, rows, _c64(min(cfg.mc, -(-DYN_MIN_ROWS // cfg.mr) * cfg.mr)))
    share = _rup_ir(b, b.sdiv(b.add(M, b.sub(nt, _c64(1))), nt), cfg.mr)
    return _smax(b, _smin(b, _smin(b, rows, _c64(cfg.mc)), share), _c64(cfg.mr))


def dyn_ok(M: int, N: int, K: int, cfg: SgemmConfig) -> bool:
    """Whether a row split of (M, N, K) runs the dynamic split (sgemm_dyn.py), whose B part
    of the workspace holds all of K: M >= DYN_MIN_M, N wider than a vector, K x nc
    within cfg.dyn_b_floats (IR twin: _emit_dyn_ok)."""
    nc = min(cfg.nc, _rup(max(N, 1), cfg.nr))
    return bool(cfg.dyn_chunks) and not cfg.share_b and M >= DYN_MIN_M and N > cfg.vl \
        and max(K, 1) * nc <= cfg.dyn_b_floats


def _emit_dyn_ok(b, M, N, K, cfg: SgemmConfig):
    if not cfg.dyn_chunks or cfg.share_b:
        return ir.Constant(I1, 0)
    nc = _smin(b, _c64(cfg.nc), _rup_ir(b, _smax(b, N, _c64(1)), cfg.nr))
    ok = b.and_(b.icmp_signed(">=", M, _c64(DYN_MIN_M)), b.icmp_signed(">", N, _c64(cfg.vl)))
    return b.and_(ok, b.icmp_signed("<=", b.mul(_smax(b, K, _c64(1)), nc),
                                    _c64(cfg.dyn_b_floats)))


def _emit_ws_per_thread(b, M, N, K, cfg: SgemmConfig):
    """IR twin of _per_thread_floats (keep in sync)."""
    rup = functools.partial(_rup_ir, b)
    kc = _smax(b, _c64(1), _smin(b, _emit_kc(b, M, cfg), K))
    mc = _smin(b, _c64(cfg.mc), rup(_smax(b, M, _c64(1)), cfg.mr))
    nc = _smin(b, _c64(cfg.nc), rup(_smax(b, N, _c64(1)), cfg.nr))
    a_part = b.add(rup(b.mul(mc, kc), 16), _c64(16))
    kb = b.select(_emit_dyn_ok(b, M, N, K, cfg), _smax(b, K, _c64(1)), kc)
    b_part = b.add(rup(b.mul(kb, nc), 16), _c64(16))
    return a_part, b_part


def emit_sgemm(module: ir.Module, name: str, *, cpu: str = "native",
               config: SgemmConfig | None = None, threads: bool = True,
               epilogue: Callable | None = None,
               epilogue_arg_types: Sequence[ir.Type] = ()) -> ir.Function:
    """Define ``void NAME(i64 M, i64 N, i64 K, float* A, i64 rsa, i64 csa,
    float* B, i64 rsb, i64 csb, float* C, i64 ldc, i32 accumulate,
    float* workspace, i64 workspace_floats, <epilogue args>...)`` in ``module``:

        C[i*ldc + j] (= if accumulate & 1 == 0, += otherwise)
            sum_k A[i*rsa + k*csa] * B[k*rsb + j*csb],   0 <= i < M, 0 <= j < N

    With ``accumulate & PREPACKED_B``, B is packed already (runtime/prepack.py):
    column j's micro-panel j // NR starts at B + (j // NR) * rsb (csb unused), K rows of
    NR floats, 64-byte aligned; the call runs on one thread.

    A, B, C must not overlap (noalias).  ``workspace`` holds
    ``sgemm_workspace_floats(M, N, K, threads, config=...)`` floats for up to
    ``threads`` threads (any alignment); the thread count is
    min(rlxc_num_threads or all cores, what the workspace fits, blocks of
    work), and 1 when M*N*K < config.min_work.  ``threads=False`` emits a
    single-threaded kernel (no libgomp reference).  See the module docstring
    for the epilogue hook.  Returns the function."""
    cfg = config or sgemm_config(cpu)
    epi_types = list(epilogue_arg_types)
    pack_a = _emit_pack_a(module, name + ".pack_a", cfg)
    pack_b = _emit_pack_b(module, name + ".pack_b", cfg)
    micros = [_emit_micro(module, f"{name}.micro{nv}", cfg, epilogue, epi_types, nv)
              for nv in range(1, cfg.nv + 1)]
    skinnies = []
    if cfg.skinny:
        skinnies = [_emit_gemv_rows(module, f"{name}.gemv", cfg, epilogue, epi_types)
                    if mr == 1 and cfg.gemv_rows else
                    _emit_skinny(module, f"{name}.skinny{mr}", cfg, mr, epilogue, epi_types)
                    for mr in range(1, cfg.mr + 1)]
    narrow = (_emit_narrow_driver(module, name + ".narrow", cfg, epilogue, epi_types)
              if cfg.narrow else None)
    micro_da = ([_emit_micro(module, f"{name}.micro_da{nv}", cfg, epilogue, epi_types, nv, True)
                 for nv in range(1 if cfg.direct_a_edge else cfg.nv, cfg.nv + 1)]
                if cfg.direct_a else None)
    from rlxc.lowering.cpu.sgemm_tall import emit_tall, tall_rows
    talls = [(r, emit_tall(module, f"{name}.tall{r}", cfg, r, epilogue, epi_types))
             for r in tall_rows(cfg)]
    # A read in place, 16 registers: a one-vector panel gets EDGE_ROWS-row tiles
    micro_edge = (_emit_micro(module, f"{name}.micro_edge",
                              dataclasses.replace(cfg, mr=EDGE_ROWS, mc=EDGE_ROWS * cfg.mc),
                              epilogue, epi_types, 1, True)
                  if cfg.direct_a and cfg.direct_a_edge and cfg.nv == 3 and cfg.mr < EDGE_ROWS
                  else None)
    if micro_edge is not None:   # its own function: seq's main tile loop stays as it was
        micro_edge.attributes.discard("alwaysinline")
        micro_edge.attributes.add("noinline")
    seq = _emit_seq(module, name + ".seq", cfg, micros, pack_a, pack_b, epi_types, skinnies,
                    narrow, micro_da, talls, micro_edge)
    dyn = None
    if threads and cfg.dyn_chunks and not cfg.share_b:
        from rlxc.lowering.cpu.sgemm_dyn import SYNC_CELLS, emit_dyn
        dyn = emit_dyn(module, name + ".dyn", cfg, micros, micro_da, pack_a, pack_b, epi_types)

    fn = ir.Function(module, sgemm_signature(epi_types), name)
    _set_noalias(fn, [3, 6, 9])
    (M, N, K, A, rsa, csa, B, rsb, csb, C, ldc, accum, ws, ws_floats) = fn.args[:14]
    for a, n in zip(fn.args[:14], ["M", "N", "K", "A", "rsa", "csa", "B", "rsb", "csb", "C",
                                   "ldc", "accumulate", "workspace", "workspace_floats"]):
        a.name = n
    epi_args = list(fn.args[14:])
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    empty = b.or_(b.icmp_signed("<=", M, _c64(0)), b.icmp_signed("<=", N, _c64(0)))
    with b.if_then(empty, likely=False):
        b.ret_void()
    beta = b.icmp_signed("!=", b.and_(accum, ir.Constant(I32, 1)), ir.Constant(I32, 0))
    packed = b.icmp_signed("!=", b.and_(accum, ir.Constant(I32, PREPACKED_B)),
                           ir.Constant(I32, 0))
    a_part, b_part = _emit_ws_per_thread(b, M, N, K, cfg)
    per = b.add(a_part, b_part)

    def slot(b, ws_, per_, a_part_, t):
        base = _gep(b, ws_, b.mul(b.sext(t, I64), per_))
        return _align64(b, base), _align64(b, _gep(b, base, a_part_))

    def run(b, m0, m1, n0, n1, tid, nt, coop, args):
        (M_, N_, K_, A_, rsa_, csa_, B_, rsb_, csb_, C_, ldc_, beta_, ws_, a_part_, per_,
         pre_) = args[:16]
        eargs = args[16:]
        ap, bp = slot(b, ws_, per_, a_part_, tid)
        if coop:
            # shared double buffer: the B parts of slots 0 and 1 (one slot per thread
            # exists, and nt >= 2 whenever the team really cooperates)
            _, bp0 = slot(b, ws_, per_, a_part_, ir.Constant(I32, 0))
            _, bp1 = slot(b, ws_, per_, a_part_, ir.Constant(I32, 1))
            bp1 = b.select(b.icmp_signed(">", nt, ir.Constant(I32, 1)), bp1, bp0)
            bp = bp0
        else:
            bp1 = bp
        # a prepacked B's columns from n0 (a multiple of NR) start at panel n0 / NR
        b_off = b.select(pre_, b.mul(b.sdiv(n0, _c64(cfg.nr)), rsb_), b.mul(n0, csb_))
        b.call(seq, [b.sub(m1, m0), b.sub(n1, n0), K_,
                     _gep(b, A_, b.mul(m0, rsa_)), rsa_, csa_,
                     _gep(b, B_, b_off), rsb_, csb_,
                     _gep(b, C_, b.add(b.mul(m0, ldc_), n0)), ldc_, beta_, ap, bp, bp1, m0, n0,
                     tid, nt, ir.Constant(I1, int(coop)), pre_, *eargs])

    if threads:
        # below min_work the team is one thread whatever the split: with the caller's
        # workspace holding a slice, run seq at once (no division by the slice size, no
        # team limit from libgomp, no split costs: a conv's per-image GEMMs call this
        # 64 times per image batch, and those were ~5% of the ONNX CNN's time)
        small = b.icmp_signed("<", b.mul(b.mul(M, N), _smax(b, K, _c64(1))),
                              _c64(cfg.min_work))
        has = b.and_(b.icmp_unsigned("!=", b.ptrtoint(ws, I64), _c64(0)),
                     b.icmp_signed(">=", ws_floats, per))
        # (so does a prepacked B: its caller splits the work, matmul_chain.py)
        with b.if_then(b.and_(b.or_(small, packed), has), likely=True):
            run(b, _c64(0), M, _c64(0), N, ir.Constant(I32, 0), ir.Constant(I32, 1), False,
                [M, N, K, A, rsa, csa, B, rsb, csb, C, ldc, beta, ws, a_part, per, packed,
                 *epi_args])
            b.ret_void()

    # workspace: caller's, or a malloc'd single-thread slice (slow path)
    ws_null = b.icmp_unsigned("==", b.ptrtoint(ws, I64), _c64(0))
    fits = b.sdiv(ws_floats, per)
    fits = b.select(ws_null, _c64(0), fits)
    need_malloc = b.icmp_signed("<", fits, _c64(1))
    malloc = _intrinsic(module, "malloc", I8P, [I64])
    free = _intrinsic(module, "free", VOID, [I8P])
    pre = b.block
    with b.if_then(need_malloc, likely=False):
        mem = b.bitcast(b.call(malloc, [b.mul(per, _c64(4))]), F32P)
        mem_block = b.block
    wsp = b.phi(F32P)
    wsp.add_incoming(ws, pre)
    wsp.add_incoming(mem, mem_block)
    cap = _smax(b, fits, _c64(1))

    captured = [M, N, K, A, rsa, csa, B, rsb, csb, C, ldc, beta, wsp, a_part, per, packed,
                *epi_args]
    if threads:
        # a prepacked B without the caller's workspace: one thread, the malloc'd slice
        with b.if_then(packed, likely=False):
            run(b, _c64(0), M, _c64(0), N, ir.Constant(I32, 0), ir.Constant(I32, 1), False,
                captured)
            with b.if_then(need_malloc, likely=False):
                b.call(free, [b.bitcast(wsp, I8P)])
            b.ret_void()
        mb = b.sdiv(b.add(M, _c64(cfg.mr - 1)), _c64(cfg.mr))
        nb = b.sdiv(b.add(N, _c64(cfg.nr - 1)), _c64(cfg.nr))
        work = b.mul(b.mul(M, N), _smax(b, K, _c64(1)))
        # per-thread cost of each split, in multiply-adds: the row split has every thread
        # pack all of B (or 1/nt of it with share_b), the column split all of A; a packed
        # float costs pack_cost
        team = _smax(b, _smin(b, parallel.emit_team_limit(module, b), cap), _c64(1))
        kk = _smax(b, K, _c64(1))
        rows = b.mul(b.sdiv(b.add(mb, b.sub(team, _c64(1))), team), _c64(cfg.mr))
        cols = b.mul(b.sdiv(b.add(nb, b.sub(team, _c64(1))), team), _c64(cfg.nr))
        w = _c64(cfg.pack_cost)
        b_packed = cols if cfg.share_b else N
        row_cost = b.mul(kk, b.add(b.mul(rows, N), b.mul(w, b.add(b_packed, rows))))
        col_cost = b.mul(kk, b.add(b.mul(b.mul(mb, _c64(cfg.mr)), cols),
                                   b.mul(w, b.add(M, cols))))
        split_m = b.icmp_signed("<=", row_cost, col_cost)

        def rows_body(coop):
            def body_m(b, lo, hi, tid, nt, args):
                # every team member runs seq (even with no rows): with coop it owns a
                # share of the B packing and must meet the same barriers
                M_ = args[0]
                m0 = _smin(b, b.mul(lo, _c64(cfg.mr)), M_)
                m1 = _smin(b, b.mul(hi, _c64(cfg.mr)), M_)
                run(b, m0, m1, _c64(0), args[1], tid, nt, coop, args)
            return body_m
        body_m = rows_body(cfg.share_b)

        def body_dyn(b, lo, hi, tid, nt, args):
            # dynamic row split (sgemm_dyn.py): the threads claim chunks of rows from a
            # shared counter; a team of one runs the static seq
            counter, args = args[-1], args[:-1]
            with b.if_else(b.icmp_signed(">", nt, ir.Constant(I32, 1))) as (t2, o2):
                with t2:
                    (M_, N_, K_, A_, rsa_, csa_, B_, rsb_, csb_, C_, ldc_, beta_, ws_, a_part_,
                     per_) = args[:15]
                    ap, bp = slot(b, ws_, per_, a_part_, tid)
                    _, bs = slot(b, ws_, per_, a_part_, ir.Constant(I32, 0))
                    rows_c = _dyn_chunk_rows(b, M_, b.sext(nt, I64), cfg)
                    b.call(dyn, [M_, N_, K_, A_, rsa_, csa_, B_, rsb_, csb_, C_, ldc_, beta_,
                                 ap, bp, counter, rows_c, bs, b.sext(nt, I64), *args[16:]])
                with o2:
                    body_m(b, lo, hi, tid, nt, args)

        def body_n(b, lo, hi, tid, nt, args):
            N_ = args[1]
            with b.if_then(b.icmp_signed("<", lo, hi)):
                n0 = b.mul(lo, _c64(cfg.nr))
                n1 = _smin(b, b.mul(hi, _c64(cfg.nr)), N_)
                run(b, _c64(0), args[0], n0, n1, tid, nt, False, args)

        def body_ndyn(b, lo, hi, tid, nt, args):
            # dynamic column split: every thread claims column items (panel ranges) from
            # a shared counter; a team of one runs its static range
            from rlxc.lowering.cpu.sgemm_dyn import emit_col_items
            counter, args = args[-1], args[:-1]
            with b.if_else(b.icmp_signed(">", nt, ir.Constant(I32, 1))) as (t2, o2):
                with t2:
                    emit_col_items(b, counter, args[1], b.sext(nt, I64), cfg,
                                   lambda b, n0, n1: run(b, _c64(0), args[0], n0, n1, tid, nt,
                                                         False, args))
                with o2:
                    body_n(b, lo, hi, tid, nt, args)

        def cols_static(b):
            parallel.emit_parallel_ranges(module, b, nb, body_n, captured,
                                          name=name + ".par_n", work=work,
                                          min_work=cfg.min_work, max_threads=cap)

        def cols_split(b):
            if not cfg.dyn_cols:
                cols_static(b)
                return
            # the packed path only: the skinny/gemv/tall kernels (M <= 24) stream B in
            # place, and narrower column ranges cut its rows into shorter runs (a batch-1
            # MLP ran 4-23% slower with column items); and A read in place (csa == 1):
            # items that pack A would pack it once per item instead of once per thread
            items = b.and_(b.icmp_signed(">=", M, _c64(DYN_COLS_MIN_M)),
                           b.icmp_signed("==", csa, _c64(1)))
            with b.if_else(items) as (t4, o4):
                with t4:
                    counter = parallel.entry_alloca(b, I64, name="dyn.cols")
                    b.store(_c64(0), counter)
                    parallel.emit_parallel_ranges(
                        module, b, nb, body_ndyn, [*captured, counter],
                        name=name + ".par_ndyn", work=work, min_work=cfg.min_work,
                        max_threads=cap)
                with o4:
                    cols_static(b)

        def rows_split(b):
            if dyn is None:
                parallel.emit_parallel_ranges(module, b, mb, body_m, captured,
                                              name=name + ".par_m", work=work,
                                              min_work=cfg.min_work, max_threads=cap)
                return
            with b.if_else(_emit_dyn_ok(b, M, N, K, cfg)) as (t3, o3):
                with t3:
                    eb = ir.IRBuilder(fn.entry_basic_block)
                    eb.position_at_start(fn.entry_basic_block)
                    # the team's sync cells (sgemm_dyn.SYNC_CELLS), zeroed
                    counter = eb.alloca(I64, size=_c64(SYNC_CELLS), name="dyn.sync")
                    for i in range(SYNC_CELLS):
                        b.store(_c64(0), _gep(b, counter, _c64(i)))
                    parallel.emit_parallel_ranges(
                        module, b, mb, body_dyn, [*captured, counter],
                        name=name + ".par_dyn", work=work, min_work=cfg.min_work,
                        max_threads=cap)
                with o3:
                    parallel.emit_parallel_ranges(
                        module, b, mb, body_m, captured, name=name + ".par_m",
                        work=work, min_work=cfg.min_work, max_threads=cap)

        with b.if_else(split_m) as (t, o):
            with t:
                if cfg.coop_min_rows and not cfg.share_b:
                    # enough rows per thread: the team packs each B block once (share_b)
                    many = b.icmp_signed(">=", M, b.mul(team, _c64(cfg.coop_min_rows)))
                    with b.if_else(many) as (tc, oc):
                        with tc:
                            parallel.emit_parallel_ranges(
                                module, b, mb, rows_body(True), captured,
                                name=name + ".par_coop", work=work, min_work=cfg.min_work,
                                max_threads=cap)
                        with oc:
                            rows_split(b)
                else:
                    rows_split(b)
            with o:
                cols_split(b)
    else:
        run(b, _c64(0), M, _c64(0), N, ir.Constant(I32, 0), ir.Constant(I32, 1), False,
            captured)

    with b.if_then(need_malloc, likely=False):
        b.call(free, [b.bitcast(wsp, I8P)])
    b.ret_void()
    return fn


# the helpers the tall tiles (sgemm_tall.py) share, under public names
c64, gep, gep_any, smin, smax, splat, lane_mask, masked_store, prefetch, internal_fn, fma_fn, \
    skinny_width, dispatch_width, rup_ir = (_c64, _gep, _gep_any, _smin, _smax, _splat,
                                            _lane_mask, _masked_store, _prefetch, _internal_fn,
                                            _fma, _skinny_width, _dispatch_width, _rup_ir)
