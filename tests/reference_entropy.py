"""An independent numpy/Python implementation of the entropy codec's format,
version 5 (docs/format.md, "Entropy codec (codec id 2)"), written from the text
alone. Kinds: 0 (E), 1 (J), 2 (Z: J symbols, raw values of e != 0 only). The
symbols code the *coded exponent* c = e << q | (top q mantissa bits): bf16 q = 0,
fp16 q = 1.

Slow and simple (bit strings, Python loops): for tests with small rows only.
`encode_row` must produce exactly the bytes the C++ encoder produces; `decode_row`
must decode the C++ rows and report the same statuses for the checks it makes.
"""
from __future__ import annotations

import numpy as np

BLOCK = 4096
STREAMS = 8
STREAM_LEN = 512
MAX_LEN = 11
MAGIC = 0x4C43435A
VERSION = 5
KIND_E, KIND_J, KIND_Z = 0, 1, 2
# dtype code -> (exponent bits E, mantissa bits M)
DTYPES = {1: (8, 7), 2: (5, 10)}
# dtype code -> q, the top mantissa bits coded in the symbol (with the exponent)
QBITS = {1: 0, 2: 1}


def coded_bits(dcode: int):
  """(E + q, M - q): the coded exponent's width and the low mantissa bits' width."""
  eb, mb = DTYPES[dcode]
  q = QBITS[dcode]
  return eb + q, mb - q


def align128(x: int) -> int:
  return -(-x // 128) * 128


def checksum(row: bytes) -> int:
  """sum_j w_j (2j+1) mod 2^64 over u32 words, bytes 24..31 as zero."""
  b = bytearray(row)
  b[24:32] = bytes(8)
  w = np.frombuffer(bytes(b), "<u4").astype(np.uint64)
  j = np.arange(w.size, dtype=np.uint64)
  return int(np.sum(w * (2 * j + 1), dtype=np.uint64))


# ---- symbols and raw bits -------------------------------------------------------------


def split(words: np.ndarray, dcode: int, kind: int):
  """(symbols, raw values) of 16-bit words s | e | m. With the coded exponent
  c = e << q | m >> (M - q) and m_low = m & (2^(M-q) - 1): kind 0 = c /
  s << (M-q) | m_low, kind 1 (and 2) = c << 1 | s / m_low (kind 2 keeps only the
  raw values of elements with c != 0: see z_raw)."""
  cb, lb = coded_bits(dcode)
  w = words.astype(np.int64)
  s = w >> 15
  c = (w >> lb) & ((1 << cb) - 1)  # e and the top q mantissa bits are adjacent
  m_low = w & ((1 << lb) - 1)
  if kind == 0:
    return c, (s << lb) | m_low
  return (c << 1) | s, m_low


def join(sym, raw, dcode: int, kind: int) -> np.ndarray:
  cb, lb = coded_bits(dcode)
  sym = np.asarray(sym, np.int64)
  raw = np.asarray(raw, np.int64)
  if kind == 0:
    v = ((raw >> lb) << 15) | (sym << lb) | (raw & ((1 << lb) - 1))
  else:
    v = ((sym & 1) << 15) | ((sym >> 1) << lb) | raw
  return v.astype(np.uint16)


def raw_layout(dcode: int, kind: int):
  """(byte plane?, packed width w); kind Z's planes are kind J's."""
  cb, lb = coded_bits(dcode)
  width = lb + 1 if kind == 0 else lb
  if width >= 8:
    return True, width - 8
  return False, width


def raw_nbytes(dcode, kind, length):
  bp, w = raw_layout(dcode, kind)
  return (length if bp else 0) + (length + 7) // 8 * w


def pack_raw(raw: np.ndarray, dcode: int, kind: int) -> bytes:
  bp, w = raw_layout(dcode, kind)
  out = b""
  rest = raw
  if bp:
    out += (raw & 0xFF).astype(np.uint8).tobytes()
    rest = raw >> 8
  if w:
    groups = -(-raw.size // 8)
    r = np.zeros(groups * 8, np.int64)
    r[:raw.size] = rest
    for g in range(groups):
      acc = 0
      for k in range(8):
        acc |= int(r[8 * g + k]) << (k * w)
      out += acc.to_bytes(w, "little")
  return out


def unpack_raw(buf: bytes, length: int, dcode: int, kind: int) -> np.ndarray:
  bp, w = raw_layout(dcode, kind)
  raw = np.zeros(length, np.int64)
  pos = 0
  if bp:
    raw |= np.frombuffer(buf[:length], np.uint8).astype(np.int64)
    pos = length
  if w:
    shift = 8 if bp else 0
    for g in range(-(-length // 8)):
      acc = int.from_bytes(buf[pos + g * w:pos + g * w + w], "little")
      for k in range(min(8, length - 8 * g)):
        raw[8 * g + k] |= ((acc >> (k * w)) & ((1 << w) - 1)) << shift
  return raw


# ---- code lengths, canonical codes, nibble stream ---------------------------------------


def package_merge(counts: dict) -> dict:
  """Length-limited (MAX_LEN) optimal code lengths; ties as in the format text."""
  leaves = sorted((c, s) for s, c in counts.items())  # (count, symbol) ascending
  k = len(leaves)
  if k < 2:
    return {s: 0 for s in counts}
  # each item: (weight, multiset of leaf indices as a count vector)
  lw = [c for c, _ in leaves]
  level = [(w, True) for w in lw]
  levels = [level]
  for _ in range(MAX_LEN - 1):
    prev = levels[-1]
    pk = [prev[2 * i][0] + prev[2 * i + 1][0] for i in range(len(prev) // 2)]
    merged, i, j = [], 0, 0
    while i < k or j < len(pk):
      if j >= len(pk) or (i < k and lw[i] <= pk[j]):
        merged.append((lw[i], True))
        i += 1
      else:
        merged.append((pk[j], False))
        j += 1
    levels.append(merged)
  lens = [0] * k
  take = 2 * k - 2
  for lev in reversed(levels):
    c = sum(1 for item in lev[:take] if item[1])
    for i in range(c):
      lens[i] += 1
    take = 2 * (take - c)
  return {leaves[i][1]: lens[i] for i in range(k)}


def canonical(lengths: dict) -> dict:
  """symbol -> (code, length), codes assigned in (length, symbol) order."""
  order = sorted((l, s) for s, l in lengths.items() if l > 0)
  codes, code, prev = {}, 0, order[0][0]
  for idx, (l, s) in enumerate(order):
    if idx:
      code = (code + 1) << (l - prev)
    prev = l
    codes[s] = (code, l)
  return codes


def nibbles_of(lengths: dict, sym_end: int) -> bytes:
  out = []
  a = 0
  while a < sym_end:
    l = lengths.get(a, 0)
    if l:
      out.append(l)
      a += 1
      continue
    r = 0
    while a + r < sym_end and lengths.get(a + r, 0) == 0:
      r += 1
    a += r
    while r >= 3:
      c = min(r, 258)
      out += [15, (c - 3) & 15, (c - 3) >> 4]
      r -= c
    out += [0] * r
  if len(out) % 2:
    out.append(0)
  return bytes(out[i] | (out[i + 1] << 4) for i in range(0, len(out), 2))


def parse_nibbles(buf: bytes, sym_end: int, alphabet: int):
  """-> (lengths dict, bytes used) or None when invalid."""
  if sym_end == 0 or sym_end > alphabet:
    return None
  nib = [x for b in buf for x in (b & 15, b >> 4)]
  lengths, a, i = {}, 0, 0
  while a < sym_end:
    if i >= len(nib):
      return None
    v = nib[i]
    i += 1
    if v <= MAX_LEN:
      if v:
        lengths[a] = v
      a += 1
    elif v == 15:
      if i + 2 > len(nib):
        return None
      a += (nib[i] | (nib[i + 1] << 4)) + 3
      i += 2
    else:
      return None
  if a != sym_end or lengths.get(sym_end - 1, 0) == 0:
    return None
  if i % 2 and nib[i] != 0:
    return None
  return lengths, (i + 1) // 2


# ---- blocks ----------------------------------------------------------------------------------


def z_valid(x: np.ndarray, dcode: int) -> bool:
  """Kind Z applies: some element has exponent 0 and every such one has m = 0."""
  eb, mb = DTYPES[dcode]
  w = x.astype(np.int64)
  e0 = ((w >> mb) & ((1 << eb) - 1)) == 0
  return bool(e0.any()) and not bool((w[e0] & ((1 << mb) - 1)).any())


def z_raw(x: np.ndarray, dcode: int) -> np.ndarray:
  """Kind Z's raw values: those of the elements with symbol >= 2 (c != 0; in a
  Z-valid block exactly the elements with exponent != 0), in order."""
  sym, raw = split(x, dcode, KIND_J)
  return raw[sym >= 2]


def encode_block(x: np.ndarray, dcode: int) -> tuple[bytes, bool]:
  length = x.size
  cands = []  # (size, order, builder); order: CONST-E, CONST-J, CONST-Z, HUFF-E, HUFF-J, HUFF-Z, RAW
  info = {}
  for kind in (0, 1):
    sym, raw = split(x, dcode, kind)
    vals, cnts = np.unique(sym, return_counts=True)
    info[kind] = (sym, raw, dict(zip(vals.tolist(), cnts.tolist())))
  jc = info[1][2]
  zok = z_valid(x, dcode)
  z = jc.get(0, 0) + jc.get(1, 0)
  nz = length - z
  for kind in (0, 1):  # CONST-E, CONST-J
    sym, raw, counts = info[kind]
    if len(counts) == 1:
      cands.append((4 + raw_nbytes(dcode, kind, length), kind, ("const", kind)))
  if zok and len(jc) == 1:  # CONST-Z: every element +0 or every one -0
    cands.append((4, 2, ("const", KIND_Z)))
  imbalance = sum(abs(jc.get(2 * e, 0) - jc.get(2 * e + 1, 0)) for e in info[0][2])
  j_lengths = 16 * imbalance >= length or (zok and 16 * z >= length)
  for kind in (0, 1):  # HUFF-E, HUFF-J (kind J only when its lengths are computed)
    sym, raw, counts = info[kind]
    if len(counts) >= 2 and (kind == 0 or j_lengths):
      lens = package_merge(counts)
      bits = sum(counts[s] * lens[s] for s in counts)
      sym_end = max(counts) + 1
      head = 20 + len(nibbles_of(lens, sym_end)) + -(-bits // 8)
      cands.append((head + raw_nbytes(dcode, kind, length), 3 + kind, ("huff", kind, lens, sym_end)))
      if kind == 1 and zok:  # HUFF-Z: the same code and streams, fewer raw values
        cands.append((head + raw_nbytes(dcode, KIND_J, nz), 5, ("huff", KIND_Z, lens, sym_end)))
  cands.append((4 + 2 * length, 6, ("raw",)))
  best = min(cands, key=lambda c: (c[0], c[1]))
  what = best[2]
  if what[0] == "raw":
    return bytes(4) + x.astype("<u2").tobytes(), True
  kind = what[1]
  sym, raw, counts = info[min(kind, 1)]
  raw_planes = pack_raw(z_raw(x, dcode), dcode, KIND_J) if kind == KIND_Z else pack_raw(raw, dcode, kind)
  if what[0] == "const":
    s = next(iter(counts))
    return bytes([1 | kind << 2, 0]) + s.to_bytes(2, "little") + raw_planes, False
  _, _, lens, sym_end = what
  codes = canonical(lens)
  bitstr, sizes = [], []
  for st in range(STREAMS):
    part = sym[st * STREAM_LEN:(st + 1) * STREAM_LEN]
    s_bits = "".join(format(codes[int(v)][0], f"0{codes[int(v)][1]}b") for v in part)
    sizes.append(len(s_bits))
    bitstr.append(s_bits)
  allbits = "".join(bitstr)
  allbits += "0" * (-len(allbits) % 8)
  area = bytes(int(allbits[i:i + 8], 2) for i in range(0, len(allbits), 8))
  head = bytes([2 | kind << 2, 0]) + sym_end.to_bytes(2, "little") + b"".join(
      v.to_bytes(2, "little") for v in sizes)
  return head + nibbles_of(lens, sym_end) + area + raw_planes, False


def encode_row(words: np.ndarray, dcode: int) -> tuple[bytes, int]:
  """-> (the row's first used_nbytes bytes, raw block count)."""
  words = np.asarray(words, np.uint16)
  n = words.size
  nb = -(-n // BLOCK)
  blocks, raws = [], 0
  for b in range(nb):
    data, is_raw = encode_block(words[b * BLOCK:(b + 1) * BLOCK], dcode)
    blocks.append(data)
    raws += is_raw
  directory = b"".join(len(d).to_bytes(2, "little") for d in blocks)
  directory += bytes(-len(directory) % 8)  # the first block at a multiple of 8
  data = b"".join(blocks)
  used = align128(56 + len(directory) + len(data))
  head = bytearray(56)
  head[0:4] = MAGIC.to_bytes(4, "little")
  head[4], head[5], head[6], head[7] = VERSION, dcode, 2, 0
  head[8:16] = n.to_bytes(8, "little")
  head[16:24] = used.to_bytes(8, "little")
  head[32], head[33], head[34] = 12, STREAMS, MAX_LEN
  head[36:40] = raws.to_bytes(4, "little")
  head[40:48] = nb.to_bytes(8, "little")
  head[48:56] = len(data).to_bytes(8, "little")
  row = bytes(head) + directory + data
  row += bytes(used - len(row))
  row = bytearray(row)
  row[24:32] = checksum(bytes(row)).to_bytes(8, "little")
  return bytes(row), raws


class _Bad(Exception):

  def __init__(self, status):
    self.status = status


def decode_block(blk: bytes, length: int, dcode: int) -> np.ndarray:
  cb, _ = coded_bits(dcode)
  if len(blk) < 4 or blk[1] != 0:
    raise _Bad(6)
  mode = blk[0]
  coding, kind = mode & 3, mode >> 2
  if coding == 0:
    if mode != 0 or blk[2:4] != bytes(2) or len(blk) != 4 + 2 * length:
      raise _Bad(6)
    return np.frombuffer(blk[4:], "<u2").astype(np.uint16)
  if kind > 2 or coding > 2:
    raise _Bad(6)
  zk = kind == KIND_Z
  ck = KIND_J if zk else kind  # the symbols' kind
  alphabet = 1 << (cb + ck)
  if coding == 1:
    s = int.from_bytes(blk[2:4], "little")
    if zk:  # CONST-Z: every element +0 (symbol 0) or -0 (symbol 1), no raw planes
      if s >= 2 or len(blk) != 4:
        raise _Bad(6)
      return np.full(length, s << 15, np.uint16)
    rawb = raw_nbytes(dcode, kind, length)
    if s >= alphabet or len(blk) != 4 + rawb:
      raise _Bad(6)
    return join(np.full(length, s), unpack_raw(blk[4:], length, dcode, kind), dcode, kind)
  # HUFF. Kind Z's raw-plane size r is what the block has left after the streams.
  rawb = 0 if zk else raw_nbytes(dcode, kind, length)
  if len(blk) < 20 + rawb:
    raise _Bad(6)
  sym_end = int.from_bytes(blk[2:4], "little")
  parsed = parse_nibbles(blk[20:len(blk) - rawb], sym_end, alphabet)
  if parsed is None:
    raise _Bad(6)
  lens, nib = parsed
  if sum(2.0**-l for l in lens.values()) != 1.0:
    raise _Bad(6)
  sizes = [int.from_bytes(blk[4 + 2 * i:6 + 2 * i], "little") for i in range(STREAMS)]
  counts = [max(0, min(STREAM_LEN, length - STREAM_LEN * i)) for i in range(STREAMS)]
  if any(not (c <= b <= MAX_LEN * c) for b, c in zip(sizes, counts)):
    raise _Bad(6)
  total = sum(sizes)
  ab = -(-total // 8)
  if zk:
    r = len(blk) - (20 + nib + ab)
    if r < 0 or r > raw_nbytes(dcode, KIND_J, length):
      raise _Bad(6)
  elif len(blk) != 20 + nib + ab + rawb:
    raise _Bad(6)
  area = blk[20 + nib:20 + nib + ab]
  bits = "".join(format(b, "08b") for b in area)
  if "1" in bits[total:]:
    raise _Bad(7)
  decode_map = {format(c, f"0{l}b"): s for s, (c, l) in canonical(lens).items()}
  sym = []
  pos = 0
  for b, c in zip(sizes, counts):
    end = pos + b
    for _ in range(c):
      cur = ""
      while cur not in decode_map:
        if pos >= end or len(cur) >= MAX_LEN:
          raise _Bad(7)
        cur += bits[pos]
        pos += 1
      sym.append(decode_map[cur])
    if pos != end:
      raise _Bad(7)
  sym = np.array(sym, np.int64)
  planes = blk[20 + nib + ab:]
  if not zk:
    return join(sym, unpack_raw(planes, length, dcode, kind), dcode, kind)
  nonzero = sym >= 2
  nz = int(nonzero.sum())
  if len(planes) != raw_nbytes(dcode, KIND_J, nz):
    raise _Bad(7)
  raw = np.zeros(length, np.int64)
  raw[nonzero] = unpack_raw(planes, nz, dcode, KIND_J)
  return join(sym, raw, dcode, KIND_J)


def decode_row(buf: bytes, n: int, dcode: int) -> tuple[np.ndarray, int]:
  """-> (words, status); words all 0xFFFF on error."""
  try:
    return _decode(bytes(buf), n, dcode), 0
  except _Bad as e:
    return np.full(n, 0xFFFF, np.uint16), e.status


def _decode(buf: bytes, n: int, dcode: int) -> np.ndarray:
  u64 = lambda o: int.from_bytes(buf[o:o + 8], "little")
  if len(buf) < 128:
    raise _Bad(3)
  if int.from_bytes(buf[0:4], "little") != MAGIC or buf[4] != VERSION or buf[6] != 2:
    raise _Bad(1)
  if buf[5] != dcode:
    raise _Bad(2)
  used = u64(16)
  nb = -(-n // BLOCK)
  doff = 56 + -(-2 * nb // 8) * 8
  eb, mb = DTYPES[dcode]

  lo = align128(doff + 4 * nb)  # every block CONST-Z (4 bytes)
  hi = align128(doff + 4 * nb + 2 * n)
  if u64(8) != n or used % 128 or used > len(buf) or not lo <= used <= hi:
    raise _Bad(3)
  if buf[7] == 1:
    raise _Bad(4)
  data_bytes = u64(48)
  raws = int.from_bytes(buf[36:40], "little")
  if (buf[7] != 0 or tuple(buf[32:36]) != (12, STREAMS, MAX_LEN, 0) or u64(40) != nb or raws > nb
      or data_bytes > used - doff or align128(doff + data_bytes) != used
      or any(buf[56 + 2 * nb:doff])):
    raise _Bad(5)
  sizes = [int.from_bytes(buf[56 + 2 * b:58 + 2 * b], "little") for b in range(nb)]
  offs = np.concatenate([[doff], doff + np.cumsum(sizes, dtype=np.int64)]).tolist()
  for b in range(nb):
    if not 4 <= sizes[b] <= 4 + 2 * min(BLOCK, n - BLOCK * b) or offs[b + 1] > doff + data_bytes:
      raise _Bad(6)
  if offs[-1] != doff + data_bytes or sum(buf[offs[b]] == 0 for b in range(nb)) != raws:
    raise _Bad(6)
  out = np.zeros(n, np.uint16)
  worst = 0
  for b in range(nb):
    try:
      out[b * BLOCK:(b + 1) * BLOCK] = decode_block(buf[offs[b]:offs[b + 1]],
                                                   min(BLOCK, n - BLOCK * b), dcode)
    except _Bad as e:
      worst = e.status if worst == 0 else min(worst, e.status)
  if worst:
    raise _Bad(worst)
  if checksum(buf[:used]) != u64(24):
    raise _Bad(8)
  return out
