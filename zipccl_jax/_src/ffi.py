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


def __getattr__(name: str):
  """ENCODE_TARGET / DECODE_TARGET: the FFI target names, read from the CPU module
  (its registrations() and these constants come from ffi/handler_common.h)."""
  if name in ("ENCODE_TARGET", "DECODE_TARGET"):
    return getattr(_cpu_module(), name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
  cpu_targets = _cpu_module().registrations()
  for name, capsule in cpu_targets.items():
    jax.ffi.register_ffi_target(name, capsule, platform="cpu")
  cuda = _cuda_module()
  if cuda is not None:
    cuda_targets = cuda.registrations()
    # Every GPU target has its CPU twin (a codec may exist on the CPU only); anything
    # else is a stale module from another build.
    if not set(cuda_targets) <= set(cpu_targets):
      raise ImportError(f"zipccl_jax: the CUDA module registers {sorted(cuda_targets)}, the CPU "
                        f"module {sorted(cpu_targets)}; reinstall the package")
    for name, capsule in cuda_targets.items():
      jax.ffi.register_ffi_target(name, capsule, platform="CUDA")


def has_cuda_support() -> bool:
  """True when the CUDA codec module was built and imports on this machine."""
  return _cuda_module() is not None


def native():
  """The CPU extension module: the codecs' size functions and constants, and both
  codecs on host buffers (`encode_into` / `decode_into`, `entropy_encode_into` /
  `entropy_decode_into`)."""
  return _cpu_module()


def mailbox_take(ledger: int) -> list:
  """The planned transport's mailbox table of `ledger` (ffi/mailbox.h: -1 never
  recorded), the elementwise max over the CPU and CUDA modules' tables, emptied."""
  tables = [list(_cpu_module().mailbox_take(ledger))]
  cuda = _cuda_module()
  if cuda is not None:
    tables.append(list(cuda.mailbox_take(ledger)))
  n = max(len(t) for t in tables)
  return [max((t[i] if i < len(t) else -1) for t in tables) for i in range(n)]
