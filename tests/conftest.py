"""Test set-up shared by the suite: 8 simulated CPU devices, meshes built once.

jax_num_cpu_devices must be set before the CPU backend starts; conftest.py is
imported by pytest before any test module, so this is the place.
"""
import os
import sys
import tempfile
from pathlib import Path

import jax
import pytest

# The repository root: `tests.reference` imports from a checkout
# whatever the install mode (the package itself is the installed one).
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

jax.config.update("jax_num_cpu_devices", 8)

# policy="auto" reads a calibration file when one exists (~/.cache/zipccl_jax or
# $ZIPCCL_CALIBRATION): point it at a path that does not, so that a file left by a
# user or a benchmark cannot change what the tests compile. Subprocesses inherit it.
os.environ["ZIPCCL_CALIBRATION"] = os.path.join(
    tempfile.gettempdir(), f"zipccl-tests-no-calibration-{os.getpid()}", "calibration.json")

from jax.sharding import AxisType  # noqa: E402


@pytest.fixture
def no_global_calibration(monkeypatch, tmp_path):
  """No process-wide calibration before or after the test, and an empty cache path
  (the cost-model and calibration tests)."""
  from zipccl_jax import costmodel as cm
  cm.set_calibration(None)
  monkeypatch.setenv(cm.ENV_VAR, str(tmp_path / "nothing-here.json"))
  yield
  cm.set_calibration(None)


@pytest.fixture(scope="session")
def mesh8():
  """1-D mesh of the 8 CPU devices, axis "x"."""
  return jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))


@pytest.fixture(scope="session")
def mesh4x2():
  """2-D mesh 4 x 2, axes ("a", "b")."""
  return jax.make_mesh((4, 2), ("a", "b"), axis_types=(AxisType.Auto, AxisType.Auto))


# Test tiers (`make test-fast` runs neither): files whose tests build the CUDA code or
# run the SIMT emulator, start several processes, or train the examples.
_TIERS = {
    "emulator": ("test_cuda_build.py", "test_entropy_cuda.py"),
    "multiprocess": ("test_multiprocess.py", "test_examples_mp.py"),
    "slow": ("test_example.py", "test_gpu_check.py", "test_lax_parity.py"),
}


def pytest_collection_modifyitems(config, items):
  for item in items:
    name = item.path.name
    for marker, files in _TIERS.items():
      if name in files:
        item.add_marker(getattr(pytest.mark, marker))
