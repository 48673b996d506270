#!/bin/sh
# The runs behind benchmarks/RESULTS.md: compare.py for three rlxc builds on this host, each
# twice, then W7 and the compile times.  Output: one file per run in $OUT (default
# /tmp/rlxc-bench).  Usage: benchmarks/bench_matrix.sh [PYTHON] [ROUNDS]
#   native    rlxc for the host; NumPy's OpenBLAS picks its kernels for the host
#   znver3    rlxc built with --cpu znver3 (AVX2, Zen 3 tiling); OpenBLAS forced to the
#             Haswell kernels it runs on Zen 3 (OPENBLAS_CORETYPE=Haswell)
#   portable  rlxc built for the x86-64-v3 baseline; OpenBLAS as for native
set -e
PY=${1:-.venv/bin/python}
ROUNDS=${2:-2}
OUT=${OUT:-/tmp/rlxc-bench}
WL=${WL:-W1,W2,W3,W4,W6,W8}
mkdir -p "$OUT"
uptime > "$OUT/uptime-start.txt"
run() {  # name, extra compare.py options
    name=$1; shift
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$PY" benchmarks/compare.py --only "$WL" \
        --runs 20 --warmup 2 --gap 0.05 --no-compile "$@" > "$OUT/$name-$r.txt" 2>&1
}
r=1
while [ "$r" -le "$ROUNDS" ]; do
    run native
    run znver3 --cpu znver3 --blas-coretype Haswell
    run portable --cpu portable
    r=$((r + 1))
done
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$PY" benchmarks/compare.py --only W7 --w7-runs 3 \
    --runs 20 > "$OUT/w7.txt" 2>&1
"$PY" benchmarks/bench_compile.py --runs 3 > "$OUT/compile.txt" 2>&1
uptime > "$OUT/uptime-end.txt"
