"""The one table of floating-point dtypes the codecs take (bf16, fp16, fp32).

Everything that needs to know about a dtype asks here: the format's dtype code
(docs/format.md, header byte 5), the same-width unsigned word the raw paths move
(never bf16 on the wire: XLA:CPU widens bf16 collectives to f32), the exponent and
mantissa widths, and the names used by numpy, safetensors and the reports.
"""
from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np


@dataclasses.dataclass(frozen=True)
class DType:
  """One supported dtype.

  Attributes:
    dtype: the numpy dtype (ml_dtypes.bfloat16 for bf16).
    short: short name used in reports ("bf16", "fp16", "fp32").
    code: format dtype code of the row header (1 bf16, 2 fp16, 3 fp32).
    word: same-width unsigned dtype (uint16 / uint32): the raw wire type.
    exponent_bits: width of the biased exponent field.
    mantissa_bits: width of the stored mantissa (sign bit not counted).
    safetensors: the dtype's name in a safetensors header.
  """
  dtype: np.dtype
  short: str
  code: int
  word: np.dtype
  exponent_bits: int
  mantissa_bits: int
  safetensors: str

  @property
  def name(self) -> str:
    """numpy's name ("bfloat16", "float16", "float32")."""
    return self.dtype.name

  @property
  def itemsize(self) -> int:
    return self.dtype.itemsize

  @property
  def bits(self) -> int:
    return 8 * self.dtype.itemsize


BF16 = DType(np.dtype(ml_dtypes.bfloat16), "bf16", 1, np.dtype(np.uint16), 8, 7, "BF16")
FP16 = DType(np.dtype(np.float16), "fp16", 2, np.dtype(np.uint16), 5, 10, "F16")
FP32 = DType(np.dtype(np.float32), "fp32", 3, np.dtype(np.uint32), 8, 23, "F32")

TABLE = (BF16, FP16, FP32)
SUPPORTED = tuple(d.dtype for d in TABLE)
NAMES = "bfloat16, float16 or float32"

_BY_DTYPE = {d.dtype: d for d in TABLE}
_BY_CODE = {d.code: d for d in TABLE}
_BY_SHORT = {d.short: d for d in TABLE}


def _np_dtype(dtype) -> np.dtype | None:
  try:
    return np.dtype(dtype)
  except TypeError:
    return None


def is_supported(dtype) -> bool:
  """True for bfloat16, float16 and float32 (anything np.dtype accepts)."""
  return _np_dtype(dtype) in _BY_DTYPE


def info(dtype, where: str = "dtype") -> DType:
  """The table entry of `dtype`.

  Raises:
    TypeError: another dtype; the message names `where`.
  """
  dt = _np_dtype(dtype)
  if dt not in _BY_DTYPE:
    raise TypeError(f"{where} must be {NAMES}, got {dtype}")
  return _BY_DTYPE[dt]


def by_code(code: int) -> DType:
  """The entry with format dtype code `code` (KeyError if none)."""
  return _BY_CODE[int(code)]


def by_short(short: str) -> DType:
  """The entry named "bf16", "fp16" or "fp32" (KeyError if none)."""
  return _BY_SHORT[short]


def by_safetensors(name: str) -> DType | None:
  """The entry whose safetensors name is `name` ("BF16", "F16", "F32"), else None."""
  return next((d for d in TABLE if d.safetensors == name), None)
