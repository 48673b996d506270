# Everything installs itself into .venv on first use.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo bench clean

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(VPY) -m pytest -q tests

demo: $(STAMP)
	$(VPY) examples/demo.py
	$(VPY) examples/train_mlp.py

bench: $(STAMP)
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(VPY) benchmarks/compare.py

clean:
	rm -rf $(VENV) build *.egg-info
