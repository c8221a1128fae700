"""The codec registry: one entry per codec, so that adding a codec is adding an entry.

A codec is a Python module that implements the codec contract (base.py), over the
FFI targets `zipccl_<name>_encode` / `zipccl_<name>_decode`. The transport looks
codecs up here by name and never branches on which one it got.

"raw" (the same transport moving uncompressed words) and None (the plain
`jax.lax` collective) are not codecs: they are the transport's own modes.
"""
from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType

from zipccl_jax._src import dtypes


@dataclasses.dataclass(frozen=True)
class Codec:
  """One registered codec.

  Attributes:
    name: the name users pass as `codec=` ("zipccl").
    codec_id: the header's codec byte (docs/format.md, offset 6).
    module: import path of the module implementing the contract functions.
    dtypes: the dtypes it encodes (any of bfloat16, float16, float32).
  """
  name: str
  codec_id: int
  module: str
  dtypes: tuple = dtypes.SUPPORTED

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name or self.name == "raw":
      raise ValueError(f"Codec: name must be a non-empty string other than 'raw', "
                       f"got {self.name!r}")
    object.__setattr__(self, "dtypes", tuple(dtypes.info(d, "Codec: dtypes entries").dtype
                                             for d in self.dtypes))

  @property
  def impl(self) -> ModuleType:
    """The implementing module (imported on first use)."""
    return importlib.import_module(self.module)

  @property
  def encode_target(self) -> str:
    return f"zipccl_{self.name}_encode"

  @property
  def decode_target(self) -> str:
    return f"zipccl_{self.name}_decode"

  def supports(self, dtype) -> bool:
    return dtypes.is_supported(dtype) and dtypes.info(dtype).dtype in self.dtypes

  def __getattr__(self, attr):
    # max_nbytes, min_nbytes, encode_rows, decode_rows, ...: the module's functions.
    if attr.startswith("_"):
      raise AttributeError(attr)
    return getattr(self.impl, attr)

  def decode_error_message(self, status: int) -> str:
    """Text of one of this codec's decoder statuses (0 = OK)."""
    if int(status) == 0:
      return "OK"
    errors = getattr(self.impl, "DECODE_ERRORS", {})
    return errors.get(int(status), f"unknown status {int(status)}")


_REGISTRY: dict[str, Codec] = {}


def register(codec: Codec) -> Codec:
  """Adds `codec` (its name must be new)."""
  if not isinstance(codec, Codec):
    raise TypeError(f"register_codec: expected a Codec, got {type(codec).__name__}")
  if codec.name in _REGISTRY or codec.name == "raw":
    raise ValueError(f"register_codec: codec {codec.name!r} is already registered")
  if codec.name == "auto":   # the collectives' codec="auto" (options.auto_codec)
    raise ValueError("register_codec: the name 'auto' is reserved (codec=\"auto\" lets "
                     "the cost model choose among the registered codecs)")
  _REGISTRY[codec.name] = codec
  return codec


def unregister(name: str) -> None:
  """Removes a codec registered with `register` (the built-in ones stay)."""
  if name in _BUILTIN:
    raise ValueError(f"unregister_codec: {name!r} is built in")
  _REGISTRY.pop(name, None)


def names() -> tuple:
  """Registered codec names, in registration order."""
  return tuple(_REGISTRY)


def get(name: str, where: str = "codec") -> Codec:
  """The codec called `name`; ValueError naming `where` otherwise."""
  try:
    return _REGISTRY[name]
  except (KeyError, TypeError):
    raise ValueError(f"{where} must be one of {names()}, got {name!r}") from None


# The window codec (docs/format.md): every dtype of the table.
register(Codec("zipccl", 1, "zipccl_jax._src.codecs.window"))
# The entropy codec (docs/format.md, "Entropy codec (codec id 2)"): bf16 and fp16.
register(Codec("entropy", 2, "zipccl_jax._src.codecs.entropy", (dtypes.BF16.dtype, dtypes.FP16.dtype)))
_BUILTIN = frozenset(_REGISTRY)
