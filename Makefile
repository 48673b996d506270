# Everything installs itself into .venv on first use.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo bench bench-quick bench-compile prebuild clean

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q -e '.[test]'
	$(VPY) -m rlxc.lowering.cpu.sgemm_object
	$(VPY) -m rlxc.bytecode
	touch $(STAMP)

# the shared sgemm objects for this host and x86-64-v3, built ahead of time (~4-8 s), and
# rlxc's .pyc files (an editable install has none: rlxc/bytecode.py)
prebuild: $(STAMP)
	$(VPY) -m rlxc.lowering.cpu.sgemm_object
	$(VPY) -m rlxc.bytecode

test: $(STAMP)
	$(VPY) -m pytest -q tests

demo: $(STAMP)
	$(VPY) examples/demo.py
	$(VPY) examples/train_mlp.py

# the benchmarks run on the prebuilt sgemm of the current sources (W7's "first use"
# measures an install; a stale prebuild, after a change to the sgemm, would time its build)
bench: prebuild
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(VPY) benchmarks/compare.py

# W2, W3, W4, W8 against the peers, 20 samples each: under 3 minutes, for every perf change.
# An AVX2 build against AVX2 peers on an AVX-512 host: make bench-quick BENCH_CPU=znver3 PEER_ISA=avx2
BENCH_CPU ?= native
PEER_ISA ?= native
bench-quick: prebuild
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(VPY) benchmarks/compare.py \
	    --only W2,W3,W4,W8 --runs 20 --warmup 2 --no-compile \
	    --cpu $(BENCH_CPU) --peer-isa $(PEER_ISA)

# compile time: W4's train step and a 20-layer residual MLP value_and_grad vs jax.jit
bench-compile: prebuild
	$(VPY) benchmarks/bench_compile.py

clean:
	rm -rf $(VENV) build *.egg-info lowering/cpu/prebuilt
