# zipccl_jax: two commands for a newcomer (see README.md)
#   make demo   set up .venv if missing, install, run the main job
#   make test   same set-up, then the test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# AUTO builds the CUDA module when nvcc is on PATH; OFF/ON force it.
ZIPCCL_CUDA ?= AUTO
# Python files too: the editable install maps the package's files when it is made.
NATIVE_SRC := $(wildcard ffi/* cuda/*) CMakeLists.txt pyproject.toml $(shell find zipccl_jax -name "*.py")

.PHONY: setup demo test test-fast bench sanitize clean

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

# The suite runs in TEST_JOBS worker processes (pytest-xdist), a whole test file
# per worker so that a file's session fixtures (the CUDA build, the emulators) are
# built once: about 6 minutes with 2 on 2 cores.
# TEST_JOBS=0 runs it in this process.
TEST_JOBS ?= 2

test: setup
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile

# The unit tier: everything but the slow, multi-process and emulator tests.
test-fast: setup
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not slow and not multiprocess and not emulator"

bench: setup
	$(PY) -m pip install -q "torch==2.13.0" ".[bench]"
	$(PY) benchmarks/codec.py

# The codec tests against a CPU module built with AddressSanitizer and
# UndefinedBehaviorSanitizer, in a venv of its own ($(SAN_VENV), build dir
# build/asan-*): any out-of-bounds access, use of freed memory or undefined
# behaviour aborts the run. Python itself is not instrumented, so the ASan runtime
# is preloaded, with libstdc++ (else ASan's C++-exception interceptor finds no
# __cxa_throw and aborts inside jaxlib); leak checking is off (the interpreter
# keeps its objects at exit); JAX_PLATFORMS=cpu skips the TPU plugin probe.
SAN_VENV ?= .venv-asan
SAN_PY   := $(SAN_VENV)/bin/python
CXX      ?= c++

sanitize:
	test -x $(SAN_PY) || $(PYTHON) -m venv $(SAN_VENV)
	$(SAN_PY) -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.0" "jax>=0.10.2"
	$(SAN_PY) -m pip install -q --no-build-isolation --config-settings=build-dir=build/asan-{wheel_tag} \
	    --config-settings=cmake.define.ZIPCCL_CUDA=OFF --config-settings=cmake.define.ZIPCCL_SANITIZE=ON \
	    -e ".[test]"
	LD_PRELOAD="$$($(CXX) -print-file-name=libasan.so) $$($(CXX) -print-file-name=libstdc++.so)" \
	    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1 \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 JAX_PLATFORMS=cpu \
	    $(SAN_PY) -m pytest -q -p no:cacheprovider tests/test_window.py \
	    tests/test_window_malformed.py tests/test_entropy.py tests/test_entropy_format.py

clean:
	rm -rf build $(VENV) $(SAN_VENV)
