#!/bin/sh
# The runs behind benchmarks/RESULTS.md: compare.py for three rlxc builds on this host, each
# twice (W1-W4, W6, W8-W11: about 20 minutes on 2 cores), then W7 and the compile times.
# Output: one file per run in $OUT (default /tmp/rlxc-bench), and the target table of all
# of them in $OUT/table.md (printed too; benchmarks/matrix_table.py).
# Usage: benchmarks/bench_matrix.sh [PYTHON] [ROUNDS]
#   native    rlxc for the host; NumPy's OpenBLAS picks its kernels for the host
#   znver3    rlxc built with --cpu znver3 (AVX2, Zen 3 tiling) against peers capped at
#             AVX2 (--peer-isa avx2: OpenBLAS Haswell kernels, oneDNN/MKL and XLA capped;
#             XLA's YNNPACK dots only where the CPU has cpuid_fault, see compare.py)
#   portable  rlxc built for the x86-64-v3 baseline, peers as for znver3
set -e
PY=${1:-.venv/bin/python}
ROUNDS=${2:-2}
OUT=${OUT:-/tmp/rlxc-bench}
WL=${WL:-W1,W2,W3,W4,W6,W8,W9,W10,W11}   # W10, W11: issue 15's transformer workloads
mkdir -p "$OUT"
# the sgemm objects of the current sources, as an install builds them (else W7's "first
# use" times their build; an intact object is kept)
"$PY" -m rlxc.lowering.cpu.sgemm_object > "$OUT/prebuild.txt" 2>&1
uptime > "$OUT/uptime-start.txt"
run() {  # name, extra compare.py options
    name=$1; shift
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$PY" benchmarks/compare.py --only "$WL" \
        --runs 20 --warmup 2 --no-compile "$@" > "$OUT/$name-$r.txt" 2>&1
}
r=1
while [ "$r" -le "$ROUNDS" ]; do
    run native
    run znver3 --cpu znver3 --peer-isa avx2
    run portable --cpu portable --peer-isa avx2
    r=$((r + 1))
done
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$PY" benchmarks/compare.py --only W7 --w7-runs 3 \
    --runs 20 > "$OUT/w7.txt" 2>&1
"$PY" benchmarks/bench_compile.py --runs 3 > "$OUT/compile.txt" 2>&1
uptime > "$OUT/uptime-end.txt"
"$PY" benchmarks/matrix_table.py "$OUT" > "$OUT/table.md" && cat "$OUT/table.md"
