"""A second, independent implementation of the zipccl v4 (window codec) format in numpy.

Written from docs/format.md alone (not from the C++), so that the tests compare two
implementations of the text: the C++/CUDA encoders must produce exactly these bytes,
and this decoder must read what they write. Slow but vectorized; fine for tests.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

B = 2048
ALIGN = 128
MAGIC = 0x4C43435A

# dtype -> (code, word dtype, exponent bits, mantissa bits, raw bytes, planes)
SPECS = {
    np.dtype(ml_dtypes.bfloat16): (1, np.uint16, 8, 7, 1, 3),
    np.dtype(np.float16): (2, np.uint16, 5, 10, 1, 6),
    np.dtype(np.float32): (3, np.uint32, 8, 23, 3, 3),
}


def align(x: int) -> int:
  return -(-x // ALIGN) * ALIGN


def plane_bytes(length: int) -> int:
  """Bytes of each bit plane of a block of `length` elements: 16 * ceil(length / 128)."""
  return 16 * -(-length // 128)


def layout(dtype, n: int, cap: int):
  _, _, _, _, rb, planes = SPECS[np.dtype(dtype)]
  nb = -(-n // B)
  table = 128
  raw = table + align(8 * nb)
  plane = raw + align(rb * n)
  last = n - B * (nb - 1) if nb else 0
  plane_end = plane + planes * ((nb - 1) * 256 + plane_bytes(last)) if nb else plane
  esc = plane + align(plane_end - plane)
  return dict(nb=nb, table=table, raw=raw, plane=plane, plane_end=plane_end, last=last,
              esc=esc, total=esc + align(cap))


def escape_stream(ex: np.ndarray, base: int, mode: int) -> tuple[int, int, np.ndarray]:
  """(width, split, stream bytes) of a block's escaped exponents ex (element order),
  docs/format.md "Escape section": w-bit values, below the window d - 1, above
  split + d - 1; the exponent byte itself (w = 8) when 7 bits do not reach."""
  ex = ex.astype(np.int64)
  if ex.size == 0:
    return 0, 0, np.zeros(0, np.uint8)
  lo, hi = base, base + (5 if mode else 6)
  db = int((lo - ex[ex < lo]).max()) if (ex < lo).any() else 0
  da = int((ex[ex > hi] - hi).max()) if (ex > hi).any() else 0
  if db > 127 or db + da > 128:
    w, sp, v = 8, 0, ex
  else:
    w = max(1, int(db + da - 1).bit_length())
    sp = db
    v = np.where(ex < lo, lo - ex - 1, sp + ex - hi - 1)
  bits = ((v[:, None] >> np.arange(w)) & 1).reshape(-1).astype(np.uint8)
  return w, sp, np.packbits(bits, bitorder="little")


def unpack_stream(sec: np.ndarray, count: int, w: int, sp: int, base: int, mode: int,
                  emax: int) -> np.ndarray:
  """The exponents of a block's escape stream at sec[0:]; ValueError if one is invalid."""
  if count == 0:
    return np.zeros(0, np.int64)
  nbytes = -(-count * w // 8)
  bits = np.unpackbits(sec[:nbytes], bitorder="little")
  if bits[count * w:].any():
    raise ValueError("stream padding bits")
  v = (bits[:count * w].reshape(count, w).astype(np.int64) << np.arange(w)).sum(1)
  if w == 8:
    e = v
  else:
    lo, hi = base, base + (5 if mode else 6)
    e = np.where(v < sp, lo - 1 - v, hi + 1 + v - sp)
    if (e < (1 if mode else 0)).any():
      raise ValueError("escape below the dtype")
  if (e > emax).any():
    raise ValueError("escape above the exponent max")
  return e


def planes_to_bytes(pl: np.ndarray, last: int) -> np.ndarray:
  """[nb, P, 256] plane bytes -> the plane section's bytes (the last block's planes
  cut to plane_bytes(last) each; no padding)."""
  if pl.shape[0] == 0:
    return np.zeros(0, np.uint8)
  return np.concatenate([pl[:-1].reshape(-1), pl[-1, :, :plane_bytes(last)].reshape(-1)])


def bytes_to_planes(sec: np.ndarray, nb: int, nplanes: int, last: int) -> np.ndarray:
  """The inverse of planes_to_bytes: [nb, P, 256], the last block's bytes past its
  planes zero."""
  pl = np.zeros((nb, nplanes, 256), np.uint8)
  if nb:
    full = (nb - 1) * nplanes * 256
    pl[:-1] = sec[:full].reshape(nb - 1, nplanes, 256)
    pb = plane_bytes(last)
    pl[-1, :, :pb] = sec[full:full + nplanes * pb].reshape(nplanes, pb)
  return pl


def min_nbytes(dtype, n: int) -> int:
  return layout(dtype, n, 0)["esc"]


def max_capacity(dtype, n: int) -> int:
  """max_escape_capacity of docs/format.md, "Row layout"."""
  area = max(align(np.dtype(dtype).itemsize * n) - min_nbytes(dtype, n), 0)
  return 128 if n > 0 and area < 128 else area


def max_nbytes(dtype, n: int) -> int:
  return min_nbytes(dtype, n) + max_capacity(dtype, n)


def checksum(buf: np.ndarray) -> int:
  """sum_j w_j (2j+1) mod 2^64 over the u32 words of buf, bytes 24..31 read as zero."""
  b = buf.copy()
  b[24:32] = 0
  w = b.view("<u4").astype(np.uint64)
  j = np.arange(w.size, dtype=np.uint64)
  with np.errstate(over="ignore"):
    return int(np.sum(w * (np.uint64(2) * j + np.uint64(1)), dtype=np.uint64))


def reseal(buf: np.ndarray) -> np.ndarray:
  """buf with its checksum field recomputed over its first used_nbytes bytes."""
  b = buf.copy()
  used = min(int(b[16:24].view("<u8")[0]), b.size)
  b[24:32] = np.frombuffer(np.uint64(checksum(b[:used // 4 * 4])).tobytes(), np.uint8)
  return b


def encode(x: np.ndarray, cap: int | None = None) -> tuple[np.ndarray, int, int, int]:
  """Returns (buffer uint8[esc + align128(cap)], status, escape_count, used_nbytes).

  cap = None: the FFI encoder's capacity, max_capacity(dtype, n).
  """
  x = np.ascontiguousarray(x).reshape(-1)
  code, wdt, eb, mb, rb, nplanes = SPECS[x.dtype]
  w = x.view(wdt).astype(np.int64)
  n = w.size
  cap = max_capacity(x.dtype, n) if cap is None else cap
  L = layout(x.dtype, n, cap)
  nb = L["nb"]
  emax = (1 << eb) - 1
  buf = np.zeros(L["total"], np.uint8)

  pad = nb * B
  e = np.zeros(pad, np.int64)
  e[:n] = (w >> mb) & emax
  valid = np.zeros(pad, bool)
  valid[:n] = True
  eb_ = e.reshape(nb, B)
  vb = valid.reshape(nb, B)
  normal = vb & (eb_ > 0) & (eb_ < emax)
  S = np.where(normal, eb_, 0).sum(1)
  N = normal.sum(1)
  Z = (vb & (eb_ == 0)).sum(1)
  ln = vb.sum(1)
  t = np.where(N > 0, np.floor_divide(4 * S - 13 * N, np.maximum(4 * N, 1)), 0)
  mode = (32 * Z > ln).astype(np.int64)
  base = np.where(mode == 1, np.clip(t + 1, 1, emax - 5), np.clip(t, 0, emax - 6))
  # best of base-1, base, base+1 by coverage (ties: base, then base-1)
  W = np.where(mode == 1, 6, 7)
  lo = np.where(mode == 1, 1, 0)
  hi = np.where(mode == 1, emax - 5, emax - 6)
  cnt = lambda v: (vb & (eb_ == v[:, None])).sum(1)
  gain_dn = np.where(base > lo, cnt(base - 1) - cnt(base + W - 1), -1)
  gain_up = np.where(base < hi, cnt(base + W) - cnt(base), -1)
  base = np.where((gain_dn > 0) & (gain_dn >= gain_up), base - 1,
                  np.where(gain_up > 0, base + 1, base))

  bb = base[:, None]
  d = eb_ - bb
  c0 = np.where((d >= 0) & (d <= 6), d + 1, 0)
  c1 = np.where(eb_ == 0, 1, np.where((d >= 0) & (d <= 5), d + 2, 0))
  c = np.where(mode[:, None] == 1, c1, c0)
  c = np.where(vb, c, 0)
  escaped = vb & (c == 0)
  esc_count = escaped.sum(1)
  coded = [escape_stream(eb_[b][escaped[b]], int(base[b]), int(mode[b])) for b in range(nb)]
  width = np.asarray([w for w, _, _ in coded], np.int64)
  split = np.asarray([sp for _, sp, _ in coded], np.int64)
  sbytes = np.asarray([st.size for _, _, st in coded], np.int64)
  esc_off = np.concatenate([[0], np.cumsum(sbytes)[:-1]]) if nb else np.zeros(0, np.int64)
  total = int(sbytes.sum())
  status = 1 if total > cap else 0
  escapes = (np.concatenate([st for _, _, st in coded]) if nb else np.zeros(0, np.uint8))[: min(total, cap)]

  # block table
  rec = np.zeros((nb, 8), np.uint8)
  rec[:, 0:4] = esc_off.astype("<u4").view(np.uint8).reshape(nb, 4) if nb else rec[:, 0:4]
  cw = esc_count | (width << 12)
  rec[:, 4:6] = cw.astype("<u2").view(np.uint8).reshape(nb, 2) if nb else rec[:, 4:6]
  rec[:, 6] = base
  rec[:, 7] = mode | (split << 1)
  buf[L["table"]:L["table"] + 8 * nb] = rec.reshape(-1)

  # raw section
  if code == 1:
    raw = (((w >> 8) & 0x80) | (w & 0x7F)).astype(np.uint8)
  elif code == 2:
    raw = (w & 0xFF).astype(np.uint8)
  else:
    r24 = ((w >> 8) & 0x800000) | (w & 0x7FFFFF)
    raw = np.stack([(r24 >> s) & 0xFF for s in (0, 8, 16)], 1).astype(np.uint8).reshape(-1)
  buf[L["raw"]:L["raw"] + raw.size] = raw

  # planes
  bits = [(c >> k) & 1 for k in range(3)]
  if code == 2:
    wp = np.zeros(pad, np.int64)
    wp[:n] = w
    wp = wp.reshape(nb, B)
    bits += [np.where(vb, (wp >> s) & 1, 0) for s in (8, 9, 15)]
  pl = np.stack([np.packbits(b.reshape(nb, 256, 8).astype(np.uint8), axis=2, bitorder="little")
                 .reshape(nb, 256) for b in bits], 1) if nb else np.zeros((0,), np.uint8)
  buf[L["plane"]:L["plane_end"]] = planes_to_bytes(pl.reshape(nb, len(bits), 256), L["last"])

  buf[L["esc"]:L["esc"] + escapes.size] = escapes

  used = L["esc"] + align(total) if status == 0 else L["total"]
  hdr = np.zeros(64, np.uint8)
  hdr[0:4] = np.frombuffer(np.uint32(MAGIC).tobytes(), np.uint8)
  hdr[4], hdr[5], hdr[6], hdr[7] = 4, code, 1, status
  hdr[32] = 11
  for off, v in ((8, n), (16, used), (40, cap), (48, int(esc_count.sum())), (56, total)):
    hdr[off:off + 8] = np.frombuffer(np.uint64(v).tobytes(), np.uint8)
  buf[:64] = hdr
  buf[24:32] = np.frombuffer(np.uint64(checksum(buf[:used])).tobytes(), np.uint8)
  return buf, status, int(esc_count.sum()), used


def decode(buf: np.ndarray, dtype, n: int) -> np.ndarray:
  """Decodes a valid row from any buffer holding its first used_nbytes bytes.

  Raises ValueError on the first failed check (a subset of the decoder's checks).
  """
  code, wdt, eb, mb, rb, nplanes = SPECS[np.dtype(dtype)]
  u64 = lambda o: int(buf[o:o + 8].view("<u8")[0])
  if buf.size < 128 or int(buf[:4].view("<u4")[0]) != MAGIC or buf[4] != 4 or buf[6] != 1:
    raise ValueError("bad size/magic/version/codec")
  used, count = u64(16), u64(56)
  L = layout(dtype, n, count)
  if (buf[5] != code or buf[32] != 11 or u64(8) != n or used > buf.size
      or used != L["total"]):
    raise ValueError("bad header/size")
  if buf[7] != 0 or count > u64(40):
    raise ValueError("not decodable")
  buf = buf[:used]
  if checksum(buf) != u64(24):
    raise ValueError("bad checksum")
  nb = L["nb"]
  rec = buf[L["table"]:L["table"] + 8 * nb].reshape(nb, 8)
  off = rec[:, 0:4].copy().view("<u4").reshape(-1).astype(np.int64)
  cw = rec[:, 4:6].copy().view("<u2").reshape(-1).astype(np.int64)
  base = rec[:, 6].astype(np.int64)
  mode = rec[:, 7].astype(np.int64) & 1
  pl = bytes_to_planes(buf[L["plane"]:L["plane_end"]], nb, nplanes, L["last"])
  bits = np.unpackbits(pl, axis=2, bitorder="little").reshape(nb, nplanes, B).astype(np.int64)
  c = bits[:, 0] | (bits[:, 1] << 1) | (bits[:, 2] << 2)
  e = np.where(mode[:, None] == 1, np.where(c == 1, 0, base[:, None] + c - 2), base[:, None] + c - 1)
  flat_c = c.reshape(-1)[:n]
  flat_e = e.reshape(-1)[:n]
  esc_idx = np.flatnonzero(flat_c == 0)
  emax = (1 << eb) - 1
  ex = [unpack_stream(buf[L["esc"] + off[b]:], int(cw[b] & 0xFFF), int(cw[b] >> 12),
                      int(rec[b, 7] >> 1), int(base[b]), int(mode[b]), emax) for b in range(nb)]
  flat_e[esc_idx] = np.concatenate(ex) if nb else np.zeros(0, np.int64)
  raw_sec = buf[L["raw"]:L["raw"] + rb * n].astype(np.int64)
  if code == 1:
    w = ((raw_sec & 0x80) << 8) | (flat_e << 7) | (raw_sec & 0x7F)
  elif code == 2:
    hi = bits[:, 3] | (bits[:, 4] << 1) | (bits[:, 5] << 5)  # m8, m9, sign(bit 15 -> shifted below)
    hi = hi.reshape(-1)[:n]
    w = raw_sec | ((hi & 3) << 8) | ((hi >> 5) << 15) | (flat_e << 10)
  else:
    r = raw_sec.reshape(n, 3)
    r24 = r[:, 0] | (r[:, 1] << 8) | (r[:, 2] << 16)
    w = ((r24 & 0x800000) << 8) | (flat_e << 23) | (r24 & 0x7FFFFF)
  assert off.size == nb
  return w.astype(wdt).view(dtype)
