"""The `python -m zipccl_jax analyze` command line and the tensor file loader."""
import io
import json
import os
import struct
import subprocess
import sys
import zipfile

import ml_dtypes
import numpy as np
import pytest

from zipccl_jax import __main__ as cli
from zipccl_jax import io as tio

BF16 = np.dtype(ml_dtypes.bfloat16)


def _gauss(n, dtype, seed=0, sigma=0.02):
  return (np.random.default_rng(seed).standard_normal(n) * sigma).astype(dtype)


def write_safetensors(path, tensors, metadata=None):
  """Writes a safetensors file by hand (the format: u64 header length, JSON, data)."""
  names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", BF16: "BF16",
           np.dtype(np.int64): "I64", np.dtype(np.int32): "I32"}
  header, blobs, off = {}, [], 0
  if metadata:
    header["__metadata__"] = metadata
  for name, a in tensors.items():
    b = np.ascontiguousarray(a).tobytes()
    header[name] = {"dtype": names[a.dtype], "shape": list(a.shape),
                    "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
  h = json.dumps(header).encode()
  h += b" " * (-len(h) % 8)
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


@pytest.fixture
def files(tmp_path):
  """A .npy (bf16 via ml_dtypes: stored as |V2), an .npz and a .safetensors file."""
  npy = tmp_path / "w.npy"
  np.save(npy, _gauss((64, 96), BF16, 1))
  npz = tmp_path / "grads.npz"
  np.savez(npz, g32=_gauss(5000, np.float32, 2), g16=_gauss(3001, np.float16, 3),
           step=np.arange(4, dtype=np.int32))
  st = tmp_path / "model.safetensors"
  write_safetensors(st, {"layer.weight": _gauss((128, 64), BF16, 4),
                         "layer.bias": np.zeros(64, BF16),
                         "ids": np.arange(10, dtype=np.int64),
                         "emb": _gauss((50, 40), np.float32, 5)}, metadata={"format": "pt"})
  return npy, npz, st


def _lines_by_name(text):
  return {ln.split()[0]: ln for ln in text.splitlines() if ln.strip() and not ln.startswith("-")}


def test_loader_reads_all_kinds(files):
  npy, npz, st = files
  (t,) = tio.iter_tensors(str(npy))
  assert t.dtype == "bfloat16" and t.shape == (64, 96) and t.note
  assert np.array_equal(np.asarray(t.array).view(np.uint16),
                        _gauss((64, 96), BF16, 1).view(np.uint16))
  z = {t.name: t for t in tio.iter_tensors(str(npz))}
  assert z["g32"].dtype == "float32" and z["g16"].dtype == "float16"
  assert z["step"].array is None and "int32" in z["step"].skip
  s = {t.name: t for t in tio.iter_tensors(str(st))}
  assert set(s) == {"layer.weight", "layer.bias", "ids", "emb"}  # no __metadata__
  assert s["layer.weight"].dtype == "bfloat16" and s["layer.weight"].shape == (128, 64)
  assert np.array_equal(np.asarray(s["layer.weight"].array).view(np.uint16),
                        _gauss((128, 64), BF16, 4).view(np.uint16))
  assert s["ids"].array is None and "I64" in s["ids"].skip
  (v,) = tio.iter_tensors(str(npy), void2="skip")
  assert v.array is None


def test_loader_matches_safetensors_package(tmp_path):
  st_numpy = pytest.importorskip("safetensors.numpy")
  a = {"a": _gauss((33, 7), BF16, 6), "b": _gauss(100, np.float16, 7),
       "c": _gauss((2, 3, 4), np.float32, 8)}
  p = tmp_path / "pkg.safetensors"
  st_numpy.save_file(a, str(p))
  got = {t.name: t for t in tio.iter_tensors(str(p))}
  for k, v in a.items():
    assert got[k].array.dtype == v.dtype and got[k].shape == v.shape
    assert np.array_equal(np.asarray(got[k].array).view(np.uint8), v.view(np.uint8))


def test_subsample_is_blockwise_and_bounded():
  a = np.arange(10_000_000, dtype=np.float32)
  s = tio.subsample(a, 1_000_000)
  assert 0 < s.size <= 1_000_000 and s.size % 2048 == 0
  assert s[0] == 0 and s[-1] > 9_000_000  # spread over the whole tensor
  assert tio.subsample(a[:100], 1000).size == 100
  assert tio.subsample(a, 1000).size == 1000


@pytest.mark.parametrize("n, budget", [(200_000, 1000), (200_000, 50_000), (10_000, 4095),
                                       (1_000_000, 100_000), (5000, 17)])
def test_subsample_spreads_over_the_whole_tensor(n, budget):
  """Every budget below the size samples all of the tensor, not its first N elements:
  at least 16 evenly spaced runs (fewer only when the budget has fewer elements)."""
  idx = tio.subsample(np.arange(n, dtype=np.int64), budget)
  assert 0 < idx.size <= budget and idx.size >= budget * 0.9
  assert len(np.unique(idx)) == idx.size            # no element twice
  runs = np.split(idx, np.flatnonzero(np.diff(idx) != 1) + 1)
  assert len(runs) >= min(16, budget)
  assert idx[0] == 0 and idx[-1] >= n - n // 16     # first and last sixteenth both sampled
  gaps = np.diff([r[0] for r in runs])
  assert gaps.max() - gaps.min() <= 2048 + 1        # evenly spaced (block-aligned starts)


@pytest.mark.parametrize("budget", [1000, 4000, 50_000])
def test_max_elements_reports_the_whole_tensor_ratio(tmp_path, capsys, budget):
  """A sample's ratio is the estimate for the whole tensor: the fixed per-row overhead
  is counted once for all of it (a 1000-element sample alone would report ~0.95x
  for fp32 data that gets ~1.17x), escapes scaled from the sample's rate."""
  p = tmp_path / "big.npy"
  np.save(p, _gauss(200_000, np.float32, 9))
  assert cli.main(["analyze", str(p), "--json"]) == 0
  (whole,) = json.loads(capsys.readouterr().out)["files"][0]["tensors"]
  assert cli.main(["analyze", str(p), "--max-elements", str(budget), "--json"]) == 0
  doc = json.loads(capsys.readouterr().out)
  (r,) = doc["files"][0]["tensors"]
  assert r["elements"] == 200_000 and 0 < r["analyzed_elements"] <= budget
  assert r["estimated"] and not whole["estimated"] and doc["total"]["estimated"]
  assert r["raw_nbytes"] == whole["raw_nbytes"] == 800_000
  assert abs(r["wire_ratio"] / whole["wire_ratio"] - 1) < 0.02, (r["wire_ratio"], whole["wire_ratio"])
  assert abs(r["ratio"] / whole["ratio"] - 1) < 0.01, (r["ratio"], whole["ratio"])
  rate, m = whole["escape_rate"], r["analyzed_elements"]
  tol = 3 * (rate * (1 - rate) / m) ** 0.5 * 200_000   # 3 sigma of the sample's binomial noise
  assert abs(r["escape_count"] - whole["escape_count"]) <= tol, (r["escape_count"], tol)
  assert doc["total"]["elements"] == 200_000 and doc["total"]["ratio"] == r["ratio"]
  assert cli.main(["analyze", str(p), "--max-elements", str(budget), "--no-progress"]) == 0
  out = capsys.readouterr().out
  assert f"(sampled {r['analyzed_elements']:,})" in out and "estimates for the WHOLE" in out


def test_main_table(files, capsys):
  npy, npz, st = files
  rc = cli.main(["analyze", str(npy), str(npz), str(st), "--no-progress"])
  out = capsys.readouterr().out
  assert rc == 0
  rows = _lines_by_name(out)
  # --codec auto (the default): per dtype the collectives' codec, named in the last column
  for name in ("w", "g32", "g16", "layer.weight", "layer.bias", "emb"):
    assert rows[name].split()[-2] == "ok", rows[name]
    want = "zipccl" if "float32" in rows[name] else "entropy"
    assert rows[name].split()[-1] == want, rows[name]
  assert "skipped" in rows["ids"] and "skipped" in rows["step"]
  assert "bfloat16" in rows["layer.weight"] and "128x64" in rows["layer.weight"]
  assert "bfloat16*" in rows["w"]  # |V2 interpreted as bf16
  # Gaussian bf16: actual ratio a little under 1.43x at this size, entropy bound ~1.5x.
  cells = rows["layer.weight"].split()
  ent, ratio = float(cells[4].rstrip("x")), float(cells[5].rstrip("x"))
  assert 1.4 < ent < 1.6 and 1.2 < ratio < ent
  totals = [ln for ln in out.splitlines() if ln.startswith("TOTAL")]
  assert len(totals) == 4  # one per file and the grand total


def test_main_json(files, capsys):
  npy, npz, st = files
  assert cli.main(["analyze", str(st), "--json", "--codec", "zipccl"]) == 0
  doc = json.loads(capsys.readouterr().out)
  (f,) = doc["files"]
  t = {r["name"]: r for r in f["tensors"]}
  assert t["layer.weight"]["codec"] == "zipccl"
  assert t["layer.weight"]["dtype"] == "bfloat16" and t["layer.weight"]["roundtrip_ok"]
  assert t["layer.bias"]["escape_count"] == 0  # zeros: zero-mode window, no escapes
  assert t["ids"]["skipped"]
  tot = f["total"]
  assert tot["analyzed_elements"] == 128 * 64 + 64 + 50 * 40
  assert tot["raw_nbytes"] == 2 * (128 * 64 + 64) + 4 * 50 * 40
  assert abs(tot["ratio"] - tot["raw_nbytes"] / tot["actual_nbytes"]) < 1e-12


def test_main_other_codec(files, capsys):
  """--codec entropy: bf16/fp16 tensors measured by the entropy codec (its used bytes,
  bit-exact round trip), fp32 ones skipped; the ratio column is named after it."""
  import zipccl_jax as zc
  npy, npz, st = files
  rc = cli.main(["analyze", str(npy), str(npz), str(st), "--codec", "entropy", "--no-progress"])
  out = capsys.readouterr().out
  assert rc == 0
  assert "entropy codec" in out.splitlines()[1]
  rows = _lines_by_name(out)
  for name in ("w", "g16", "layer.weight", "layer.bias"):
    assert rows[name].split()[-1] == "ok", rows[name]
  for name in ("g32", "emb"):
    assert "skipped: codec 'entropy' takes bfloat16, float16" in rows[name], rows[name]
  assert cli.main(["analyze", str(st), "--codec", "entropy", "--json"]) == 0
  doc = json.loads(capsys.readouterr().out)
  assert doc["codec"] == "entropy"
  t = {r["name"]: r for r in doc["files"][0]["tensors"]}
  w = _gauss((128, 64), BF16, 4)
  a = zc.analyze(w, codec="entropy")
  assert t["layer.weight"]["actual_nbytes"] == a.actual_nbytes
  assert t["layer.weight"]["wire_nbytes"] == a.wire_nbytes
  assert t["layer.weight"]["escape_rate"] is None and doc["files"][0]["total"]["escape_rate"] is None
  # the entropy codec beats the window codec on Gaussian weights
  assert t["layer.weight"]["ratio"] > zc.analyze(w).ratio


def test_main_other_codec_sampled(tmp_path, capsys):
  """A sampled tensor's whole-tensor estimate for a non-window codec: within 1% of the
  measured whole-tensor ratio."""
  p = tmp_path / "big.npy"
  np.save(p, _gauss(300_001, np.float16, 11))
  assert cli.main(["analyze", str(p), "--codec", "entropy", "--json"]) == 0
  (whole,) = json.loads(capsys.readouterr().out)["files"][0]["tensors"]
  assert cli.main(["analyze", str(p), "--codec", "entropy", "--max-elements", "20000", "--json"]) == 0
  (r,) = json.loads(capsys.readouterr().out)["files"][0]["tensors"]
  assert r["estimated"] and r["analyzed_elements"] <= 20000 and r["roundtrip_ok"]
  assert abs(r["wire_ratio"] / whole["wire_ratio"] - 1) < 0.02, (r["wire_ratio"], whole["wire_ratio"])
  assert abs(r["ratio"] / whole["ratio"] - 1) < 0.01, (r["ratio"], whole["ratio"])


def test_main_unknown_codec(files, capsys):
  npy, _, _ = files
  assert cli.main(["analyze", str(npy), "--codec", "nope"]) == 2
  err = capsys.readouterr().err
  assert "--codec must be auto or one of zipccl, entropy" in err and "'nope'" in err


def test_main_max_elements(tmp_path, capsys):
  p = tmp_path / "big.npy"
  np.save(p, _gauss(200_000, np.float32, 9))
  assert cli.main(["analyze", str(p), "--max-elements", "50000", "--json"]) == 0
  (r,) = json.loads(capsys.readouterr().out)["files"][0]["tensors"]
  assert r["elements"] == 200_000 and 0 < r["analyzed_elements"] <= 50_000


def test_progress_bar_for_many_tensors(tmp_path, capsys):
  p = tmp_path / "many.npz"
  np.savez(p, **{f"t{i}": _gauss(100, np.float32, i) for i in range(12)})
  assert cli.main(["analyze", str(p)]) == 0
  err = capsys.readouterr().err
  assert "/12" in err  # tqdm or the simple bar, on stderr
  assert cli.main(["analyze", str(p), "--no-progress"]) == 0
  assert "/12" not in capsys.readouterr().err


def _npy_bytes(a) -> bytes:
  buf = io.BytesIO()
  np.save(buf, a)
  return buf.getvalue()


def _zip_bytes(name: str, data: bytes) -> bytes:
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr(name, data)
  return buf.getvalue()


def _zip(path, name: str, data: bytes):
  path.write_bytes(_zip_bytes(name, data))
  return path


def _corrupt_crc(blob: bytes) -> bytes:
  """The member's stored CRC-32 changed (local header and central directory)."""
  b = bytearray(blob)
  for sig, off in ((b"PK\x03\x04", 14), (b"PK\x01\x02", 16)):
    i = b.index(sig) + off
    b[i] ^= 0xFF
  return bytes(b)


@pytest.mark.parametrize("make, msg", [
    (lambda d: d / "missing.npy", "no such file"),
    (lambda d: (d / "x.bin").write_bytes(b"1234") and d / "x.bin", "unknown file kind"),
    (lambda d: (d / "bad.safetensors").write_bytes(b"\xff" * 16) and d / "bad.safetensors",
     "not a safetensors file"),
    (lambda d: (d / "bad.npy").write_bytes(b"not numpy") and d / "bad.npy", "not a .npy file"),
    (lambda d: (d / "bad.npz").write_bytes(b"not numpy") and d / "bad.npz", "not an .npz file"),
    (lambda d: (d / "hdr.npy").write_bytes(b"\x93NUMPY\x01\x00\x10\x00{garbage header}\n")
     and d / "hdr.npy", "malformed .npy header"),
    (lambda d: np.save(d / "obj.npy", np.array([1, "a", None], object), allow_pickle=True)
     or d / "obj.npy", "holds Python objects (dtype object)"),
    (lambda d: np.savez(d / "obj.npz", a=np.array([1, None], object)) or d / "obj.npz",
     "member 'a.npy': holds Python objects (dtype object)"),
    (lambda d: np.save(d / "t.npy", np.zeros(1000, np.float32)) or (d / "t.npy").write_bytes(
        (d / "t.npy").read_bytes()[:-100]) and d / "t.npy",
     "truncated .npy data: its header describes float32 [1000] (4000 bytes of data), the file "
     "holds 3900"),
    (lambda d: os.mkfifo(d / "pipe.npy") or d / "pipe.npy", "not a regular file (a FIFO"),
    (lambda d: _zip(d / "lie.npz", "a.npy", _npy_bytes(np.zeros(64, np.float32))[:-40]),
     "member 'a.npy': truncated .npy data"),
    (lambda d: _zip(d / "long.npz", "a.npy", _npy_bytes(np.zeros(64, np.float32)) + b"x" * 9),
     "its header describes 256 bytes of data, the archive declares 265"),
    (lambda d: _zip(d / "hdr.npz", "a.npy", b"\x93NUMPY\x01\x00\x10\x00{garbage header}\n"),
     "member 'a.npy': malformed .npy header"),
    (lambda d: _zip(d / "notnpy.npz", "a.npy", b"hello world"), "member 'a.npy': not a .npy file"),
    (lambda d: (d / "cut.npz").write_bytes(_zip_bytes("a.npy", _npy_bytes(_gauss(5000, np.float32)))[:3000])
     and d / "cut.npz", "not a readable .npz file"),
    (lambda d: (d / "crc.npz").write_bytes(_corrupt_crc(_zip_bytes("a.npy", _npy_bytes(np.ones(50, np.float32)))))
     and d / "crc.npz", "is not readable (Bad CRC-32"),
])


def test_bad_files(tmp_path, capsys, make, msg):
  path = make(tmp_path)
  assert cli.main(["analyze", str(path)]) == 2
  err = capsys.readouterr().err
  assert msg in err
  assert "allow_pickle" not in err and "pickle.load" not in err   # never numpy's advice


def test_npz_members_stream_with_bounded_memory(tmp_path):
  """A 4.5 MB .npz of zeros that inflates to 1 GiB: with --max-elements the member is
  inflated as a stream and only the sample is kept (peak memory far below the
  inflated size); the sample equals subsample() of the whole array."""
  n = 1 << 28   # float32 zeros: 1 GiB inflated
  path = tmp_path / "bomb.npz"
  with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
    with z.open("z.npy", "w", force_zip64=True) as f:
      f.write(_npy_bytes(np.zeros(0, np.float32)).replace(b"(0,)", b"(%d,)" % n)[:128])
      chunk = bytes(1 << 24)
      for _ in range(n * 4 // len(chunk)):
        f.write(chunk)
  assert path.stat().st_size < 8 << 20
  small = tmp_path / "small.npz"
  x = _gauss(300_000, np.float32, seed=3)
  np.savez_compressed(small, x=x)

  def peak_kib(p):
    code = ("import resource, sys; from zipccl_jax import __main__ as cli; "
            f"rc = cli.main(['analyze', '--max-elements', '100000', '--json', {str(p)!r}]); "
            "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); "
            "sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return int(res.stderr.split("PEAK")[-1].split()[0]), res.stdout

  base, _ = peak_kib(small)          # the interpreter, jax, the analysis of a sample
  peak, out = peak_kib(path)
  assert peak - base < 128 * 1024, (peak, base)   # not the 1 GiB the member inflates to
  doc = json.loads(out)
  (t,) = doc["files"][0]["tensors"]
  assert t["shape"] == [n] and t["analyzed_elements"] <= 100000 and t["roundtrip_ok"]
  # the streamed sample is subsample()'s
  (got,) = list(tio.iter_tensors(str(small), max_elements=50_000))
  assert got.shape == (300_000,)
  np.testing.assert_array_equal(got.array.view(np.uint32), tio.subsample(x, 50_000).view(np.uint32))


def test_bad_safetensors_offsets(tmp_path, capsys):
  p = tmp_path / "trunc.safetensors"
  write_safetensors(p, {"a": _gauss(1000, BF16)})
  data = p.read_bytes()
  p.write_bytes(data[:-100])  # data section shorter than the header says
  assert cli.main(["analyze", str(p)]) == 2
  assert "outside the data section" in capsys.readouterr().err


def test_subprocess(files):
  npy, npz, st = files
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-m", "zipccl_jax", "analyze", str(st), str(npy)],
                     capture_output=True, text=True, env=env, timeout=120)
  assert r.returncode == 0, r.stderr
  rows = _lines_by_name(r.stdout)
  assert rows["layer.weight"].split()[-2:] == ["ok", "entropy"]
  assert "TOTAL (all files)" in r.stdout
  bad = subprocess.run([sys.executable, "-m", "zipccl_jax", "analyze", str(st) + ".nope"],
                       capture_output=True, text=True, env=env, timeout=120)
  assert bad.returncode == 2 and "no such file" in bad.stderr


def test_simple_progress_bar_without_tqdm(tmp_path, capsys, monkeypatch):
  monkeypatch.setitem(sys.modules, "tqdm", None)  # `from tqdm import tqdm` raises ImportError
  p = tmp_path / "few.npz"
  np.savez(p, a=_gauss(10, np.float32), b=_gauss(10, np.float32))
  assert cli.main(["analyze", str(p), "--progress"]) == 0
  err = capsys.readouterr().err
  assert "analyze [" in err and "2/2" in err
