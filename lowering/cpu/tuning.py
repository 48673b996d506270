"""Tuning constants of the CPU backend, in one place.

Thresholds that decide threading, streaming stores and reduction blocking. Every
schedule module reads them from here (none imports another for a constant), and
the disk-cache fingerprint covers this file like every other lowering source.
The sgemm blocking (register tile, mc/kc/nc) lives with its kernels in
sgemm_kernels.SgemmConfig because it is derived per target.
"""

PAR_MIN_WORK = 1 << 19   # cost units (~1 vector op per element, ~0.1 ns) below which a
                         # loop nest is not split over threads: ~50 us of one thread's
                         # work.  A fork/join costs ~5 us when the team is spinning, but
                         # 50 us to whole scheduler slices when the cores are shared
                         # with other processes (measured on a loaded 2-core VM), so
                         # only loops that gain far more than that are split.
SGEMM_PAR_MIN = 1 << 22  # multiply-adds per sgemm call below which it runs on one thread
                         # (its workspace is sized for one; ~30 us of work at 1 thread)
STREAM_MIN_BYTES = 1 << 24  # f32 outputs at least this large that a map writes row by row
                         # go out with non-temporal stores (measured: 343 MB in 15 ms
                         # instead of 40-58 ms on one core); smaller ones stay in cache
STREAM_MIN_ROW = 64      # ... when the contiguous innermost loop has at least this many
BLOCK = 4096             # f32 partial-sum block of float sums/products
SPLIT_MIN = 1 << 16      # full reductions with at least this many elements run in chunks
CHUNK = 16384            # target elements per chunk of a split reduction
MAX_CHUNKS = 64
QBLOCK = 128  # output columns a buffer-mode reduction keeps in registers (8 AVX-512 vectors)
QBLOCK_VECTORS = 8  # vector registers of output a buffer-mode reduction block keeps (QBLOCK
                    # columns on AVX-512, 64 on AVX2; fewer per vector of merged matvecs)
