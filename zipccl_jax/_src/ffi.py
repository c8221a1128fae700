"""Loading the native modules and registering their XLA FFI targets.

The CPU module (`_zipccl_cpu`) is always built. The CUDA module (`_zipccl_cuda`) is
optional: it is built when nvcc was found at install time, registers the same
target names for platform "CUDA", and imports on machines with no GPU driver
(static cudart). Python never branches on the platform: it calls the target by
name and XLA picks the handler of the backend the computation runs on.
"""
from __future__ import annotations

import functools
import importlib

import jax

ENCODE_TARGET = "zipccl_zipccl_encode"
DECODE_TARGET = "zipccl_zipccl_decode"


def _cpu_module():
  try:
    return importlib.import_module("zipccl_jax._zipccl_cpu")
  except ImportError as e:  # pragma: no cover - only on a broken install
    raise ImportError(
        "zipccl_jax: the native module _zipccl_cpu is missing; install the package "
        "with `pip install .` (it compiles the C++ codec)") from e


def _cuda_module():
  try:
    return importlib.import_module("zipccl_jax._zipccl_cuda")
  except ImportError:
    return None


@functools.cache
def register() -> None:
  """Registers the codec FFI targets once per process (idempotent)."""
  for name, capsule in _cpu_module().registrations().items():
    jax.ffi.register_ffi_target(name, capsule, platform="cpu")
  cuda = _cuda_module()
  if cuda is not None:
    for name, capsule in cuda.registrations().items():
      jax.ffi.register_ffi_target(name, capsule, platform="CUDA")


def has_cuda_support() -> bool:
  """True when the CUDA codec module was built and imports on this machine."""
  return _cuda_module() is not None


def native():
  """The CPU native module (static-size contract, constants)."""
  return _cpu_module()
