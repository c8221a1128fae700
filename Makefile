# zipccl_jax: two commands for a newcomer (see README.md)
#   make demo   set up .venv if missing, install, run the main job
#   make test   same set-up, then the test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# AUTO builds the CUDA module when nvcc is on PATH; OFF/ON force it.
ZIPCCL_CUDA ?= AUTO
NATIVE_SRC := $(wildcard ffi/* cuda/*) CMakeLists.txt pyproject.toml

.PHONY: setup demo test bench clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# Build tools first, then the package editable without build isolation (the
# extension is built against the venv's jax FFI headers); reinstalled whenever a
# native source changes.
$(VENV)/.installed: $(VENV)/bin/python $(NATIVE_SRC)
	$(PY) -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.0" "jax>=0.10.2"
	$(PY) -m pip install -q --no-build-isolation \
	    --config-settings=cmake.define.ZIPCCL_CUDA=$(ZIPCCL_CUDA) -e ".[test]"
	@touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) examples/train_fsdp.py

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) -m pip install -q "torch==2.13.0" ".[bench]"
	$(PY) benchmarks/codec.py

clean:
	rm -rf build $(VENV)
