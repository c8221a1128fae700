"""Test set-up shared by the suite: 8 simulated CPU devices, meshes built once.

jax_num_cpu_devices must be set before the CPU backend starts; conftest.py is
imported by pytest before any test module, so this is the place.
"""
import jax
import pytest

jax.config.update("jax_num_cpu_devices", 8)

from jax.sharding import AxisType  # noqa: E402


@pytest.fixture(scope="session")
def mesh8():
  """1-D mesh of the 8 CPU devices, axis "x"."""
  return jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))


@pytest.fixture(scope="session")
def mesh4x2():
  """2-D mesh 4 x 2, axes ("a", "b")."""
  return jax.make_mesh((4, 2), ("a", "b"), axis_types=(AxisType.Auto, AxisType.Auto))
