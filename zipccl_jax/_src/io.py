"""Loading tensors from .npy, .npz and .safetensors files (for the CLI and benchmarks).

Tensors are read without copying where the format allows (`np.load(mmap_mode="r")`
for .npy, a numpy memmap over the data section for .safetensors). The safetensors
header is parsed here with json + numpy, not with the `safetensors` package, so that
bfloat16 ("BF16") loads as `ml_dtypes.bfloat16` with no torch dependency:

    u64 little-endian header length H | H bytes of JSON | data section
    JSON: {"name": {"dtype": "BF16", "shape": [...], "data_offsets": [begin, end]},
           "__metadata__": {...}}   (offsets in bytes, relative to the data section)

Every tensor comes back as a `Tensor`: either with an `array` (a dtype the codec
takes: bfloat16, float16, float32) or with a `skip` reason (other dtypes), so that
callers can list it instead of failing.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import zipfile
import zlib
from typing import Iterator

import ml_dtypes
import numpy as np

from zipccl_jax._src import dtypes

SUPPORTED_SUFFIXES = (".npy", ".npz", ".safetensors")

# Other safetensors dtypes, and their element size in bytes (to validate offsets).
_ST_OTHER_DTYPES = {
    "F64": 8, "I64": 8, "U64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2,
    "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75, "C64": 8,
}
# A JSON header larger than this is not a safetensors file (the format caps it at 100 MB).
_MAX_HEADER_BYTES = 100 * 1024 * 1024


class TensorFileError(ValueError):
  """A tensor file is missing, of an unknown kind, or malformed."""


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One tensor of a file.

  Attributes:
    name: "name" inside the file (the file's stem for .npy).
    dtype: dtype name as stored ("bfloat16", "float32", "I64", ...).
    shape: the stored shape.
    array: the values (possibly a read-only memmap), or None when skipped.
    skip: why the tensor is not analyzed (None when `array` is set).
    note: how the dtype was interpreted, if not literally (e.g. "|V2 read as bfloat16").
  """
  name: str
  dtype: str
  shape: tuple
  array: np.ndarray | None = None
  skip: str | None = None
  note: str | None = None

  @property
  def size(self) -> int:
    return math.prod(self.shape)


def _from_numpy(name: str, a: np.ndarray, void2: str, shape: tuple | None = None) -> Tensor:
  """Wraps a numpy array, interpreting 2-byte void data as `void2` (or skipping it).
  shape: the stored shape when `a` is a sample of it (flat)."""
  shape = tuple(a.shape) if shape is None else tuple(shape)
  if dtypes.is_supported(a.dtype):
    return Tensor(name, a.dtype.name, shape, array=a)
  # ml_dtypes' bfloat16 has no numpy type code: np.save writes it as '|V2' and
  # np.load returns void data. JAX users save bf16 this way, so read it as bf16.
  if a.dtype.kind == "V" and a.dtype.itemsize == 2 and a.dtype.names is None and void2 != "skip":
    dt = np.dtype(ml_dtypes.bfloat16 if void2 == "bfloat16" else np.float16)
    return Tensor(name, dt.name, shape, array=a.view(dt), note=f"|V2 read as {dt.name}")
  return Tensor(name, str(a.dtype), shape,
                skip=f"dtype {a.dtype} (the codec takes {dtypes.NAMES})")


_NPY_MAGIC = b"\x93NUMPY"            # every .npy file starts with these 6 bytes
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")   # a zip member / an empty zip archive


def _why(e: Exception) -> str:
  """numpy's reason in our words: never its advice to load pickles (we never do)."""
  text = str(e)
  if "pickle" in text:
    return "it holds Python objects (pickled data), not numbers; only numeric arrays are read"
  return text


def _npy_header(path: str, f, size: int) -> tuple[np.dtype, tuple, bool, int]:
  """Checks a .npy header read from stream f (a file or a zip member of `size`
  bytes): (dtype, shape, fortran_order, data offset), or TensorFileError in our words.

  np.load on a file that is not .npy falls back to unpickling and then suggests
  allow_pickle=True: never that. The magic bytes, the header, the dtype (no Python
  objects) and the data size against `size` are all checked first.
  """
  head = f.read(len(_NPY_MAGIC) + 2)
  if head[:len(_NPY_MAGIC)] != _NPY_MAGIC:
    raise TensorFileError(f"{path}: not a .npy file (it does not start with the .npy magic "
                          f"bytes \\x93NUMPY; first bytes {head[:len(_NPY_MAGIC)]!r})")
  version = tuple(head[len(_NPY_MAGIC):])
  try:
    if version == (1, 0):
      shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version in ((2, 0), (3, 0)):
      shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
      raise ValueError(f"unsupported .npy format version {version}")
  except (ValueError, OSError, EOFError, SyntaxError, UnicodeDecodeError, TypeError) as e:
    raise TensorFileError(f"{path}: malformed .npy header ({_why(e)})") from e
  if dtype.hasobject:
    raise TensorFileError(f"{path}: holds Python objects (dtype {dtype}), not numbers; "
                          "only numeric arrays are read")
  offset = f.tell()
  need = math.prod(shape) * dtype.itemsize
  have = size - offset
  if have < need:
    raise TensorFileError(f"{path}: truncated .npy data: its header describes {dtype} "
                          f"{list(shape)} ({need} bytes of data), the file holds {have}")
  return dtype, shape, bool(fortran), offset


def _load_npy(path: str, void2: str) -> Iterator[Tensor]:
  with open(path, "rb") as f:
    _npy_header(path, f, os.path.getsize(path))
  try:
    a = np.load(path, mmap_mode="r", allow_pickle=False)
  except (ValueError, OSError, EOFError) as e:
    raise TensorFileError(f"{path}: not a readable .npy file ({_why(e)})") from e
  yield _from_numpy(os.path.splitext(os.path.basename(path))[0], a, void2)


def _read(f, nbytes: int, where: str) -> bytes:
  data = f.read(nbytes)
  if len(data) != nbytes:
    raise TensorFileError(f"{where}: truncated data ({len(data)} of {nbytes} bytes)")
  return data


def _npz_member(path: str, z: zipfile.ZipFile, info: zipfile.ZipInfo, max_elements: int):
  """One .npz member, inflated as a stream: (the array, its stored shape). The
  whole array, or with max_elements > 0 only the `subsample` runs (the stream is
  read once, the rest discarded), so memory holds the sample, never more than the
  member's declared size, which must match its header."""
  where = f"{path}: member {info.filename!r}"
  with z.open(info) as f:
    dtype, shape, fortran, offset = _npy_header(where, f, info.file_size)
    n = math.prod(shape)
    if offset + n * dtype.itemsize != info.file_size:
      raise TensorFileError(f"{where}: its header describes {n * dtype.itemsize} bytes of data, "
                            f"the archive declares {info.file_size - offset}")
    runs = sample_runs(n, max_elements)
    if runs is None:
      a = np.frombuffer(_read(f, n * dtype.itemsize, where), dtype)
      a = a.reshape(shape[::-1]).T if fortran else a.reshape(shape)
      return a, tuple(shape)
    pieces, at = [], 0
    for start, count in runs:   # ascending, disjoint
      while at < start:
        skip = min(start - at, 1 << 20)
        _read(f, skip * dtype.itemsize, where)
        at += skip
      pieces.append(np.frombuffer(_read(f, count * dtype.itemsize, where), dtype))
      at += count
    return np.concatenate(pieces), tuple(shape)


def _load_npz(path: str, void2: str, max_elements: int = 0) -> Iterator[Tensor]:
  with open(path, "rb") as f:
    head = f.read(4)
  if head not in _ZIP_MAGICS:
    raise TensorFileError(f"{path}: not an .npz file (not a zip archive; first bytes {head!r})")
  try:
    z = zipfile.ZipFile(path)
  except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
    raise TensorFileError(f"{path}: not a readable .npz file ({_why(e)})") from e
  with z:
    for info in z.infolist():
      key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
      try:
        a, shape = _npz_member(path, z, info, max_elements)
      except TensorFileError:
        raise
      except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError,
              RuntimeError) as e:
        raise TensorFileError(f"{path}: member {info.filename!r} is not readable ({_why(e)})") from e
      yield _from_numpy(key, a, void2, shape)


def read_safetensors_header(path: str) -> tuple[dict, int]:
  """Parses a safetensors header. Returns (header dict, data section offset in bytes).

  Raises:
    TensorFileError: the file is too short, the header length or JSON is invalid.
  """
  fsize = os.path.getsize(path)
  with open(path, "rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise TensorFileError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    hlen = int.from_bytes(head, "little")
    if hlen > min(fsize - 8, _MAX_HEADER_BYTES):
      raise TensorFileError(f"{path}: not a safetensors file (header length {hlen} does not fit "
                            f"in the file of {fsize} bytes)")
    raw = f.read(hlen)
  try:
    header = json.loads(raw.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise TensorFileError(f"{path}: not a safetensors file (header is not JSON: {e})") from e
  if not isinstance(header, dict):
    raise TensorFileError(f"{path}: not a safetensors file (header is not a JSON object)")
  return header, 8 + hlen


def _load_safetensors(path: str) -> Iterator[Tensor]:
  header, data_off = read_safetensors_header(path)
  data_len = os.path.getsize(path) - data_off
  entries = [(k, v) for k, v in header.items() if k != "__metadata__"]
  # Data-section order, as the file is laid out (sequential reads of a memmap).
  try:
    entries.sort(key=lambda kv: int(kv[1]["data_offsets"][0]))
  except (TypeError, KeyError, ValueError, IndexError) as e:
    raise TensorFileError(f"{path}: malformed safetensors header (data_offsets: {e})") from e
  mm = np.memmap(path, dtype=np.uint8, mode="r", offset=data_off, shape=(data_len,)) \
      if data_len > 0 else np.zeros(0, np.uint8)
  for name, info in entries:
    try:
      st_dtype = str(info["dtype"])
      shape = tuple(int(d) for d in info["shape"])
      begin, end = (int(o) for o in info["data_offsets"])
    except (TypeError, KeyError, ValueError) as e:
      raise TensorFileError(f"{path}: malformed header entry for tensor {name!r} ({e})") from e
    n = math.prod(shape)
    if any(d < 0 for d in shape) or not 0 <= begin <= end <= data_len:
      raise TensorFileError(f"{path}: tensor {name!r} has offsets [{begin}, {end}) outside the "
                            f"data section of {data_len} bytes")
    entry = dtypes.by_safetensors(st_dtype)
    if entry is not None:
      dt = entry.dtype
      if end - begin != n * dt.itemsize:
        raise TensorFileError(f"{path}: tensor {name!r} ({st_dtype}{list(shape)}) should take "
                              f"{n * dt.itemsize} bytes, its offsets give {end - begin}")
      a = mm[begin:end].view(dt).reshape(shape)
      yield Tensor(name, dt.name, shape, array=a)
    elif st_dtype in _ST_OTHER_DTYPES:
      yield Tensor(name, st_dtype, shape,
                   skip=f"dtype {st_dtype} (the codec takes "
                   f"{', '.join(d.safetensors for d in dtypes.TABLE)})")
    else:
      yield Tensor(name, st_dtype, shape, skip=f"unknown safetensors dtype {st_dtype!r}")


def iter_tensors(path: str, *, void2: str = "bfloat16", max_elements: int = 0) -> Iterator[Tensor]:
  """Yields the tensors of a .npy, .npz or .safetensors file, in file order.

  Args:
    path: the file. Its kind is taken from the suffix.
    void2: how to read 2-byte void arrays (bfloat16 saved by ml_dtypes/JAX with
      np.save): "bfloat16", "float16" or "skip".
    max_elements: > 0: members of .npz archives are inflated as streams and only
      `subsample(.., max_elements)`'s runs are kept (a flat `array`; `shape` is the
      stored one). .npy and .safetensors arrays are memory maps either way.

  Raises:
    TensorFileError: the file does not exist, has another suffix, or is malformed.
  """
  if void2 not in ("bfloat16", "float16", "skip"):
    raise ValueError(f"void2 must be 'bfloat16', 'float16' or 'skip', got {void2!r}")
  problem = check_path(path)
  if problem:
    raise TensorFileError(problem)
  suffix = os.path.splitext(path)[1].lower()
  if suffix == ".npy":
    yield from _load_npy(path, void2)
  elif suffix == ".npz":
    yield from _load_npz(path, void2, max_elements)
  else:
    yield from _load_safetensors(path)


def check_path(path: str) -> str | None:
  """Why `path` cannot be a tensor file (missing, a directory, unknown suffix), else None.

  Cheap (no read): the CLI checks every file with it before doing any work.
  """
  if not os.path.exists(path):
    return f"{path}: no such file"
  if os.path.isdir(path):
    return f"{path}: is a directory, not a tensor file"
  try:
    mode = os.stat(path).st_mode
  except OSError as e:
    return f"{path}: cannot be read ({e.strerror})"
  if not stat.S_ISREG(mode):
    return f"{path}: not a regular file (a FIFO, socket or device); tensor files are regular files"
  suffix = os.path.splitext(path)[1].lower()
  if suffix not in SUPPORTED_SUFFIXES:
    return (f"{path}: unknown file kind {suffix or '(no suffix)'!r}; "
            f"expected one of {', '.join(SUPPORTED_SUFFIXES)}")
  return None


def sample_runs(n: int, max_elements: int, chunk: int = 65536) -> list | None:
  """The (start, count) runs `subsample` keeps of n elements, ascending and disjoint;
  None when it keeps all of them.

  The sample is `k` contiguous runs at evenly spaced offsets, from the first
  element to the last run ending at or before the end: at least 16 runs where the
  budget allows, each at most `chunk` elements. Runs of whole 2048-element blocks,
  starting on a block boundary, keep the local structure the per-block window sees;
  budgets under 16 blocks use shorter runs (the first N elements alone would
  describe only the start of the tensor).
  """
  if max_elements <= 0 or n <= max_elements:
    return None
  block = 2048
  runs = 16
  if max_elements >= runs * block:
    c = min(chunk, max_elements // runs) // block * block
    k = max_elements // c
    sizes = [c] * k
  else:
    k = min(runs, max_elements)
    sizes = np.diff(np.linspace(0, max_elements, k + 1).astype(np.int64)).tolist()
    c = max(sizes)
  starts = np.linspace(0, n - c, k).astype(np.int64)
  if c % block == 0:
    starts = starts // block * block   # runs stay >= c apart: spacing >= c, c a multiple
  return [(int(s), int(m)) for s, m in zip(starts, sizes)]


def subsample(a: np.ndarray, max_elements: int, chunk: int = 65536) -> np.ndarray:
  """At most `max_elements` elements of `a` (flattened), spread evenly over all of it
  (`sample_runs`). Returns `a.reshape(-1)` itself when small enough."""
  flat = a.reshape(-1)
  runs = sample_runs(flat.size, max_elements, chunk)
  if runs is None:
    return flat
  return np.concatenate([np.asarray(flat[s:s + m]) for s, m in runs])
