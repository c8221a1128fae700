"""Set-up of the benchmark suites' own tests: the repository root on sys.path (the
suites import `benchmarks.*` from a checkout), 8 simulated CPU devices, and no
calibration file, as in tests/conftest.py."""
import os
import sys
import tempfile
from pathlib import Path

import jax
import pytest
from jax.sharding import AxisType

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

jax.config.update("jax_num_cpu_devices", 8)
os.environ.setdefault("ZIPCCL_CALIBRATION", os.path.join(
    tempfile.gettempdir(), f"zipccl-tests-no-calibration-{os.getpid()}", "calibration.json"))


@pytest.fixture(scope="session")
def mesh8():
  """1-D mesh of the 8 CPU devices, axis "x"."""
  return jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
