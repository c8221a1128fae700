// zipccl encoded format, version 4 (the window codec, codec id 1): layout
// constants, per-dtype traits and the static-size contract, shared by the CPU codec
// (ffi/window_cpu.cc) and the CUDA codec (cuda/window.cu). docs/format.md is the
// normative text; this header is its executable form. Everything here is
// __host__ __device__ so that the CPU output is the bit-exact reference for the GPU.
//
// One encoded row (one tensor of n elements), all integers little-endian, every
// section starting on a 128-byte boundary:
//
//   [0]            header            128 bytes (56 used, the rest reserved = 0)
//   [128]          block table       nb records of 8 bytes, padded to 128
//   [..]           raw section       n * kRawBytes bytes, padded to 128
//   [..]           plane section     kPlanes planes per block, padded to 128
//   [esc_off]      escape section    escape_bytes bytes, padded to 128   <- last
//
// with nb = ceil(n / 2048). A block of len elements has planes of
// plane_bytes_of(len) = 16 * ceil(len / 128) bytes (256 for a full block), so a short
// last block costs what its elements need, not a full block's 768 / 1536 bytes
// (version 3; version 2 gave every block 256-byte planes). Each block's escapes take
// w bits each (version 4; 8 before), w the block's own width: see "escape coding".
// The escape section is last and its size is recorded in
// the header (used_nbytes = esc_off + align128(escape_bytes)), so the first
// used_nbytes bytes of a row decode on their own ("prefix-decodable"): the encoder
// writes into a max_nbytes(d, n) buffer and a transport may send any prefix of at
// least used_nbytes bytes. See docs/format.md for every field and bit.
#pragma once

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define ZC_HD __host__ __device__ __forceinline__
#else
#define ZC_HD inline
#endif

namespace zipccl {

// ---- constants of format version 4 -------------------------------------------

constexpr uint32_t kMagic = 0x4C43435Au;  // bytes 'Z' 'C' 'C' 'L'
constexpr uint8_t kVersion = 4;
constexpr uint8_t kCodecWindow = 1;                 // codec id of this (window) codec
constexpr uint32_t kBlockLog2 = 11;
constexpr uint32_t kBlock = 1u << kBlockLog2;       // elements per block (2048)
constexpr uint32_t kPlaneBytes = kBlock / 8;        // bytes per bit plane of a full block (256)
constexpr uint32_t kPlaneAlign = 16;                // a short block's planes: multiples of 16 bytes
constexpr uint32_t kAlign = 128;                    // section alignment (bytes)
constexpr uint32_t kHeaderBytes = 128;              // header section size (bytes)
constexpr uint32_t kRecordBytes = 8;                // block-table record size (bytes)
constexpr uint32_t kCodePlanes = 3;                 // exponent code: 3 bit planes

// Header byte offsets. Bytes 0..31 are the prefix common to every codec of the
// project (docs/format.md, "Common row header"); 32..55 are this codec's.
constexpr uint32_t kOffMagic = 0;        // u32
constexpr uint32_t kOffVersion = 4;      // u8  = kVersion
constexpr uint32_t kOffDtype = 5;        // u8  (DtypeCode)
constexpr uint32_t kOffCodec = 6;        // u8  = kCodecWindow
constexpr uint32_t kOffStatus = 7;       // u8  (EncodeStatus)
constexpr uint32_t kOffN = 8;            // u64 element count
constexpr uint32_t kOffUsed = 16;        // u64 used_nbytes: the decodable prefix (multiple of 128)
constexpr uint32_t kOffChecksum = 24;    // u64 position-weighted word sum over [0, used_nbytes)
constexpr uint32_t kOffBlockLog2 = 32;   // u8  = kBlockLog2 (bytes 33..39 reserved, zero)
constexpr uint32_t kOffCapacity = 40;    // u64 escape bytes the encoder's buffer had room for
constexpr uint32_t kOffEscCount = 48;    // u64 escapes found
constexpr uint32_t kOffEscBytes = 56;    // u64 escape-section bytes used (exceeds the capacity when status = 1)
constexpr uint32_t kHeaderUsed = 64;     // bytes [64, 128) are reserved, zero

// Largest n and escape capacity the layout arithmetic accepts: below these every
// offset fits in 63 bits (n * 3 + nb * 1536 < 2^59, align128(capacity) <= 2^62), so
// no size computation can wrap (layout_checked).
constexpr uint64_t kMaxElems = 1ull << 56;
constexpr uint64_t kMaxCapacity = 1ull << 62;

enum DtypeCode : uint8_t { kBF16 = 1, kF16 = 2, kF32 = 3 };

// Status written by the encoder into the header and its stats output.
// kEncDoesNotFit: the row needs more escape bytes than its buffer has (the row is
// not decodable; a transport sends such data uncompressed).
enum EncodeStatus : uint8_t { kEncOk = 0, kEncDoesNotFit = 1 };

// Status returned by the decoder (one int32 per row). Keep in sync with
// zipccl_jax/_src/codec.py (_DECODE_ERRORS) and docs/format.md.
enum DecodeStatus : int32_t {
  kDecOk = 0,
  kDecBadMagic = 1,        // magic, version or codec id wrong
  kDecBadDtype = 2,        // dtype or block size differ from what the caller expects
  kDecBadSize = 3,         // n differs; used_nbytes > buffer, not a multiple of 128 or < min
  kDecNotDecodable = 4,    // status byte 1: the encoder reported DOES_NOT_FIT
  kDecBadHeader = 5,       // status byte, escape count/capacity/used_nbytes or reserved bytes
  kDecBadTable = 6,        // a block record is inconsistent (base, mode, offset, count)
  kDecBadEscapes = 7,      // planes disagree with the table, an escape value outside [0, emax], stream padding bits
  kDecBadChecksum = 8,     // checksum mismatch (corrupted bytes)
  kDecBadPadding = 9,      // checksum fine, but a padding byte of a section is not zero
};

// ---- per-dtype traits ----------------------------------------------------------
//
// A float is sign | exponent (kExpBits) | mantissa (kManBits). The exponent is
// coded; sign and mantissa ("raw" bits) are stored verbatim:
//   bf16: raw byte  = sign<<7 | mantissa[6:0]                  (1 byte, 0 planes)
//   fp16: raw byte  = mantissa[7:0]; raw planes = m8, m9, sign  (1 byte, 3 planes)
//   fp32: raw 24bit = sign<<23 | mantissa[22:0], 3 bytes LE     (3 bytes, 0 planes)

template <typename Bits, int ExpBits, int ManBits, int RawBytes, int RawPlanes, DtypeCode Code>
struct TraitsBase {
  using bits_t = Bits;
  static constexpr int kExpBits = ExpBits;
  static constexpr int kManBits = ManBits;
  static constexpr uint32_t kExpMax = (1u << ExpBits) - 1;  // Inf/NaN exponent field
  static constexpr int kRawBytes = RawBytes;
  static constexpr int kRawPlanes = RawPlanes;
  static constexpr int kPlanes = kCodePlanes + RawPlanes;
  static constexpr DtypeCode kCode = Code;
  static ZC_HD uint32_t exponent(Bits v) { return (uint32_t)(v >> ManBits) & kExpMax; }
};

struct BF16Traits : TraitsBase<uint16_t, 8, 7, 1, 0, kBF16> {
  static ZC_HD uint32_t raw(uint16_t v) { return ((v >> 8) & 0x80u) | (v & 0x7Fu); }
  static ZC_HD uint16_t join(uint32_t raw, uint32_t e) {
    return (uint16_t)(((raw & 0x80u) << 8) | (e << 7) | (raw & 0x7Fu));
  }
};

struct F16Traits : TraitsBase<uint16_t, 5, 10, 1, 3, kF16> {
  // raw = 11 bits: [7:0] -> raw byte, bit 8 -> plane 3, bit 9 -> plane 4, bit 10 (sign) -> plane 5
  static ZC_HD uint32_t raw(uint16_t v) { return ((v >> 5) & 0x400u) | (v & 0x3FFu); }
  static ZC_HD uint16_t join(uint32_t raw, uint32_t e) {
    return (uint16_t)(((raw & 0x400u) << 5) | (e << 10) | (raw & 0x3FFu));
  }
};

struct F32Traits : TraitsBase<uint32_t, 8, 23, 3, 0, kF32> {
  static ZC_HD uint32_t raw(uint32_t v) { return ((v >> 8) & 0x800000u) | (v & 0x7FFFFFu); }
  static ZC_HD uint32_t join(uint32_t raw, uint32_t e) {
    return ((raw & 0x800000u) << 8) | (e << 23) | (raw & 0x7FFFFFu);
  }
};

ZC_HD int raw_bytes_of(DtypeCode d) { return d == kF32 ? 3 : 1; }
ZC_HD int planes_of(DtypeCode d) { return d == kF16 ? 6 : 3; }
ZC_HD int elem_bytes_of(DtypeCode d) { return d == kF32 ? 4 : 2; }

// ---- static size contract -----------------------------------------------------
// Mirrored exactly by zipccl_jax/_src/codec.py:max_nbytes / min_nbytes (tested to agree).

ZC_HD uint64_t align_up(uint64_t x) { return (x + (kAlign - 1)) / kAlign * kAlign; }
ZC_HD uint64_t num_blocks(uint64_t n) { return (n + kBlock - 1) / kBlock; }

// Bytes of each bit plane of a block of len (1..2048) elements: 16 * ceil(len / 128),
// 256 for a full block. Multiples of 16 keep every plane 16-byte aligned (the CUDA
// decoder copies planes in 16-byte chunks).
ZC_HD uint32_t plane_bytes_of(uint32_t len) {
  return (len + 8 * kPlaneAlign - 1) / (8 * kPlaneAlign) * kPlaneAlign;
}

// Elements in block b of a row of n elements (0 past the last block).
ZC_HD uint32_t block_len(uint64_t n, uint64_t b) {
  const uint64_t i0 = b * kBlock;
  if (i0 >= n) return 0u;
  const uint64_t rest = n - i0;
  return rest < kBlock ? (uint32_t)rest : kBlock;
}

// Bytes of the plane section before padding: full blocks' P * 256 each, the last
// block's P * plane_bytes_of(its len). Block b's planes start at plane_off +
// b * P * 256 (every block before the last is full).
ZC_HD uint64_t plane_section_bytes(DtypeCode d, uint64_t n) {
  const uint64_t nb = num_blocks(n);
  if (nb == 0) return 0;
  return (uint64_t)planes_of(d) * ((nb - 1) * kPlaneBytes + plane_bytes_of(block_len(n, nb - 1)));
}

// Section offsets of a row of n elements whose escape section has room for
// `capacity` escape bytes; total = esc_off + align128(capacity) is the buffer size.
struct Layout {
  uint64_t table_off, raw_off, plane_off, esc_off, total;
};

ZC_HD Layout layout_of(DtypeCode d, uint64_t n, uint64_t capacity) {
  const uint64_t nb = num_blocks(n);
  Layout l;
  l.table_off = kHeaderBytes;
  l.raw_off = l.table_off + align_up(nb * kRecordBytes);
  l.plane_off = l.raw_off + align_up(n * (uint64_t)raw_bytes_of(d));
  l.esc_off = l.plane_off + align_up(plane_section_bytes(d, n));
  l.total = l.esc_off + align_up(capacity);
  return l;
}

// layout_of for untrusted sizes: false (and *l untouched) when n or capacity is so
// large that an offset would wrap around 2^64.
ZC_HD bool layout_checked(DtypeCode d, uint64_t n, uint64_t capacity, Layout* l) {
  if (n > kMaxElems || capacity > kMaxCapacity) return false;
  *l = layout_of(d, n, capacity);
  return true;
}

// The fixed part of a row (header, table, raw, planes): the smallest used_nbytes.
ZC_HD uint64_t min_nbytes(DtypeCode d, uint64_t n) { return layout_of(d, n, 0).esc_off; }

// Escape bytes of the encoder's buffer: what brings the row to align128(raw bytes),
// at least one 128-byte unit when n > 0 (so that a small row with a few specials,
// e.g. one Inf, still fits). A row that needs more is DOES_NOT_FIT: sending it raw
// is cheaper anyway.
ZC_HD uint64_t max_escape_capacity(DtypeCode d, uint64_t n) {
  const uint64_t raw = align_up(n * (uint64_t)elem_bytes_of(d));
  const uint64_t fixed = min_nbytes(d, n);
  const uint64_t area = raw > fixed ? raw - fixed : 0;
  return (n > 0 && area < kAlign) ? kAlign : area;
}

// The static payload row size of the FFI encoder (= layout total at the max capacity).
ZC_HD uint64_t max_nbytes(DtypeCode d, uint64_t n) { return min_nbytes(d, n) + max_escape_capacity(d, n); }

// used_nbytes of a row whose escape streams take esc_bytes bytes and fit.
ZC_HD uint64_t used_nbytes_of(DtypeCode d, uint64_t n, uint64_t esc_bytes) {
  return min_nbytes(d, n) + align_up(esc_bytes);
}

// The encoder's stats row (s32 x 4): status, escapes (saturated at INT32_MAX),
// used_units = used_nbytes / 128, 0. For a row that does not fit, used_units is
// max_nbytes / 128 + 1, so that a max over rows also detects it.
ZC_HD void store_row_stats(int32_t* st, uint8_t status, uint64_t escapes, uint64_t used, uint64_t max_bytes) {
  const uint64_t units = status == kEncOk ? used / kAlign : max_bytes / kAlign + 1;
  st[0] = status;
  st[1] = (int32_t)(escapes < 0x7FFFFFFFull ? escapes : 0x7FFFFFFFull);
  st[2] = (int32_t)(units < 0x7FFFFFFFull ? units : 0x7FFFFFFFull);
  st[3] = 0;
}

// ---- block window ---------------------------------------------------------------
//
// Each block codes exponents through a window chosen from integer statistics of
// the block's own exponent fields (so CPU and GPU choose identically, in any
// summation order):
//   S = sum of e over elements with 0 < e < kExpMax (normal numbers),
//   N = count of those, Z = count of elements with e == 0 (zeros, subnormals).
// The mean biased exponent S/N estimates log2(sigma) - 1.42 for a Gaussian
// block, and the coverage-optimal 7-exponent window starts at
// log2(sigma) - 5.35 (docs/jax-notes.md, "The method"), so base = round(S/N - 3.75) =
// floor((4S - 13N) / 4N). Unlike the paper's RMS, the mean exponent is not
// dragged by a single huge outlier (one 1e30 in a block of N(0,1) moves RMS by
// 2^94 but S/N by 0.06); benchmarks/results/window_calibration.md has the
// escape rates of both against the coverage-optimal window.
//
// choose_window gives the first guess; refine_window (below) the final window.
//
// mode 0: code c in 1..7 <-> e = base + c - 1; code 0 = escape.
// mode 1 ("zero mode", chosen when more than 1/32 of the block has e == 0, e.g.
//         ReLU outputs): code 1 <-> e == 0; c in 2..7 <-> e = base + c - 2.

struct Window {
  uint32_t base;
  uint32_t mode;
};

ZC_HD int64_t floor_div(int64_t a, int64_t b) {  // b > 0
  int64_t q = a / b;
  return (q * b > a) ? q - 1 : q;
}

template <typename T>
ZC_HD Window choose_window(uint64_t S, uint32_t N, uint32_t Z, uint32_t len) {
  const int64_t hi0 = (int64_t)T::kExpMax - 6;  // last base of a 7-wide window
  int64_t t = N ? floor_div(4 * (int64_t)S - 13 * (int64_t)N, 4 * (int64_t)N) : 0;
  Window w;
  if ((uint64_t)Z * 32 > len) {
    // 6-wide window: drop its lowest exponent (the Gaussian's thin low tail).
    int64_t b = t + 1;
    b = b < 1 ? 1 : (b > hi0 + 1 ? hi0 + 1 : b);
    w.base = (uint32_t)b;
    w.mode = 1;
  } else {
    int64_t b = t < 0 ? 0 : (t > hi0 ? hi0 : t);
    w.base = (uint32_t)b;
    w.mode = 0;
  }
  return w;
}

// Refinement ("best of three"): the mean-exponent guess is the coverage-optimal
// base on Gaussian data, but on heavier tails (Laplace, Student-t, many pretrained
// matrices) the optimum sits one exponent lower or higher. Moving the window by one
// changes its coverage by two counts only:
//   cov(base-1) - cov(base) = #(e = base-1) - #(e = base+W-1)
//   cov(base+1) - cov(base) = #(e = base+W) - #(e = base)
// (W = 7, or 6 in zero mode), so counting four exponent values over the block
// decides among base-1, base, base+1. Ties keep base, then prefer base-1.
// window_probes gives the four values (as int: -1 or > kExpMax count nothing).
ZC_HD void window_probes(Window w, int32_t probe[4]) {
  const int32_t W = w.mode ? 6 : 7;
  const int32_t b = (int32_t)w.base;
  probe[0] = b - 1;
  probe[1] = b;
  probe[2] = b + W - 1;
  probe[3] = b + W;
}

template <typename T>
ZC_HD Window refine_window(Window w, const uint32_t cnt[4]) {
  const uint32_t lo = w.mode ? 1u : 0u;
  const uint32_t hi = w.mode ? T::kExpMax - 5 : T::kExpMax - 6;
  int64_t best = 0;
  uint32_t base = w.base;
  if (w.base > lo) {
    const int64_t gain = (int64_t)cnt[0] - (int64_t)cnt[2];
    if (gain > best) {
      best = gain;
      base = w.base - 1;
    }
  }
  if (w.base < hi) {
    const int64_t gain = (int64_t)cnt[3] - (int64_t)cnt[1];
    if (gain > best) base = w.base + 1;
  }
  Window r;
  r.base = base;
  r.mode = w.mode;
  return r;
}

// Exponent field -> 3-bit code (0 = escape).
ZC_HD uint32_t code_of(uint32_t e, Window w) {
  if (w.mode == 0) {
    uint32_t d = e - w.base;  // wraps for e < base
    return d < 7u ? d + 1 : 0u;
  }
  if (e == 0) return 1u;
  uint32_t d = e - w.base;
  return d < 6u ? d + 2 : 0u;
}

// 3-bit code (non-zero) -> exponent field.
ZC_HD uint32_t exp_of(uint32_t code, Window w) {
  if (w.mode == 0) return w.base + code - 1;
  return code == 1 ? 0u : w.base + code - 2;
}

// Valid (base, mode) pairs for a dtype: the decoder rejects anything else.
template <typename T>
ZC_HD bool window_valid(uint32_t base, uint32_t mode) {
  if (mode == 0) return base <= T::kExpMax - 6;
  if (mode == 1) return base >= 1 && base <= T::kExpMax - 5;
  return false;
}

// ---- little-endian helpers ------------------------------------------------------

ZC_HD void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
ZC_HD void store_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
ZC_HD uint32_t load_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
ZC_HD uint64_t load_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

// Block-table record (8 bytes):
//   [0..3]  u32 esc_offset: byte offset of the block's escape stream in the escape
//           section (the stream bytes of all earlier blocks)
//   [4..5]  u16 esc_count (bits 0..11, <= block length) | width << 12 (bits 12..15)
//   [6]     u8  base
//   [7]     u8  mode (bit 0) | split << 1 (bits 1..7)
struct Record {
  uint32_t esc_offset;  // stream bytes of all earlier blocks
  uint32_t esc_count;   // escapes in this block, <= block length
  uint32_t base;
  uint32_t mode;
  uint32_t width;       // bits per escape: 0 (no escapes), 1..7 (mapped), 8 (the exponent byte)
  uint32_t split;       // mapped values below it lie below the window (0..127)
};

ZC_HD void store_record(uint8_t* p, Record r) {
  store_u32(p, r.esc_offset);
  const uint32_t cw = (r.esc_count & 0xFFFu) | ((r.width & 0xFu) << 12);
  p[4] = (uint8_t)(cw & 0xFF);
  p[5] = (uint8_t)(cw >> 8);
  p[6] = (uint8_t)r.base;
  p[7] = (uint8_t)((r.mode & 1u) | (r.split << 1));
}
ZC_HD Record load_record(const uint8_t* p) {
  Record r;
  r.esc_offset = load_u32(p);
  const uint32_t cw = (uint32_t)p[4] | ((uint32_t)p[5] << 8);
  r.esc_count = cw & 0xFFFu;
  r.width = cw >> 12;
  r.base = p[6];
  r.mode = p[7] & 1u;
  r.split = p[7] >> 1;
  return r;
}

// ---- escape coding (version 4) -------------------------------------------------------
//
// An escape is an exponent outside the block's window [lo, hi] (lo = base, hi =
// base + 6, or base + 5 in zero mode, where e = 0 is inside too). Escapes sit near
// the window (a Gaussian's tail a few binades below it, a gradient's mixed scales
// on both sides), so each block stores them as w-bit values, w its own:
//   below the window, distance d = lo - e >= 1:  v = d - 1          (v < split)
//   above the window, distance d = e - hi >= 1:  v = split + d - 1  (v < 2^w)
// with split = the block's largest below-distance. w = 8 stores e itself (split 0)
// when 7 bits do not reach (below-distance > 127, or both sides over 128 values).
// The encoder's rule (part of the format, so that every encoder writes the same
// bytes): no escape -> w = 0; else D_b / D_a = the largest below / above distance
// (0 if none); D_b <= 127 and D_b + D_a <= 128 -> w = max(1, ceil(log2(D_b + D_a))),
// split = D_b; else w = 8, split = 0. Stream: escape r of the block occupies bits
// r*w .. r*w + w - 1 (value bit 0 first) of its stream, bit i of the stream being
// bit i % 8 of stream byte i / 8; stream_bytes = ceil(count * w / 8), the bits past
// count * w zero.

ZC_HD uint32_t window_hi(uint32_t base, uint32_t mode) { return base + (mode ? 5u : 6u); }

ZC_HD uint32_t stream_bytes(uint32_t count, uint32_t width) { return (count * width + 7) / 8; }

// The encoder's width and split for a block whose escapes lie at most db below and
// da above its window (db, da: the largest distances, 0 if none).
ZC_HD void escape_width(uint32_t count, uint32_t db, uint32_t da, uint32_t* width, uint32_t* split) {
  *width = 0;
  *split = 0;
  if (count == 0) return;
  const uint32_t need = db + da;
  if (db > 127 || need > 128) {
    *width = 8;
    return;
  }
  uint32_t w = 1;
  while ((1u << w) < need) ++w;
  *width = w;
  *split = db;
}

// The w-bit value of escaped exponent e (outside the window) in a block coded with
// (width, split).
ZC_HD uint32_t escape_value(uint32_t e, uint32_t lo, uint32_t hi, uint32_t width, uint32_t split) {
  if (width == 8) return e;
  return e < lo ? lo - e - 1 : split + (e - hi) - 1;
}

// The exponent of value v; false when v names no exponent of the dtype (a mapped
// value below 0, or in zero mode below 1, or above kExpMax; a raw one above kExpMax).
template <typename T>
ZC_HD bool escape_exponent(uint32_t v, uint32_t lo, uint32_t hi, uint32_t mode, uint32_t width,
                           uint32_t split, uint32_t* e) {
  if (width == 8) {
    *e = v;
    return v <= T::kExpMax;
  }
  if (v < split) {
    const uint32_t floor = mode ? 1u : 0u;
    if (lo < floor + 1 + v) return false;  // lo - 1 - v < floor
    *e = lo - 1 - v;
    return true;
  }
  const uint32_t x = hi + 1 + (v - split);
  *e = x;
  return x <= T::kExpMax;
}

// A record's own consistency (the decoder's table check, besides the window and the
// offsets): count <= len, width <= 8, width = 0 exactly when count = 0, split = 0
// unless 1 <= width <= 7, split <= 2^width.
ZC_HD bool record_codes_ok(const Record& r, uint32_t len) {
  if (r.esc_count > len || r.width > 8) return false;
  if ((r.esc_count == 0) != (r.width == 0)) return false;
  if (r.width == 0 || r.width == 8) return r.split == 0;
  return r.split <= (1u << r.width);
}

// ---- checksum ----------------------------------------------------------------------
// checksum = sum over the little-endian u32 words w_j (j = byte offset / 4) of the
// row's first used_nbytes bytes of w_j * (2j + 1), modulo 2^64, with the header's
// checksum field (bytes 24..31, words 6 and 7) read as zero. Integer addition is
// order-independent, so any split across threads or CTAs gives the same value; the
// odd position weights make every single-bit and every double-bit error change the sum.
// Span helper: words w[0..count) starting at row word index j0:
//   sum (2(j0+i)+1) w_i = (2 j0 + 1) * sum w_i + 2 * sum i w_i   (mod 2^64)
ZC_HD uint64_t checksum_span(const uint8_t* p, uint64_t j0, uint64_t count) {
  uint64_t s0 = 0, s1 = 0;
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t w = load_u32(p + 4 * i);
    s0 += w;
    s1 += (uint64_t)w * i;
  }
  return (2 * j0 + 1) * s0 + 2 * s1;
}

// Header fields of one row (everything the header holds besides magic/version).
struct Header {
  DtypeCode dtype;
  uint8_t status;
  uint64_t n, used, capacity, esc_count, esc_bytes;
};

// The header's first kHeaderUsed bytes (bytes [kHeaderUsed, 128) are the caller's:
// zero). checksum: see checksum_span.
ZC_HD void store_header(uint8_t* h, const Header& f, uint64_t checksum) {
  for (uint32_t i = 0; i < kHeaderUsed; ++i) h[i] = 0;
  store_u32(h + kOffMagic, kMagic);
  h[kOffVersion] = kVersion;
  h[kOffDtype] = (uint8_t)f.dtype;
  h[kOffCodec] = kCodecWindow;
  h[kOffStatus] = f.status;
  store_u64(h + kOffN, f.n);
  store_u64(h + kOffUsed, f.used);
  store_u64(h + kOffChecksum, checksum);
  h[kOffBlockLog2] = (uint8_t)kBlockLog2;
  store_u64(h + kOffCapacity, f.capacity);
  store_u64(h + kOffEscCount, f.esc_count);
  store_u64(h + kOffEscBytes, f.esc_bytes);
}

// Checksum contribution of the header (its checksum field as zero).
ZC_HD uint64_t header_checksum(const Header& f) {
  uint8_t h[kHeaderUsed];
  store_header(h, f, 0);
  return checksum_span(h, 0, kHeaderUsed / 4);
}

// What the decoder learns from a header that passed check_header.
struct HeaderInfo {
  uint64_t used;       // used_nbytes (<= the buffer, >= min_nbytes, multiple of 128)
  uint64_t esc_count;  // escapes (<= n)
  uint64_t esc_bytes;  // escape-section bytes (used = min_nbytes + align128(esc_bytes))
};

// Decoder checks 1-5 (docs/format.md, "Decoding") on a row buffer of L >= 128
// bytes that is expected to hold n elements of T, in the normative order. Fills
// *info when the result is kDecOk. Shared by the CPU decoder, the CUDA decoder and
// its host emulation. Every size comparison is written so that no field value
// (up to 2^64 - 1) can wrap.
template <typename T>
ZC_HD int32_t check_header(const uint8_t* in, uint64_t n, uint64_t L, HeaderInfo* info) {
  if (load_u32(in + kOffMagic) != kMagic || in[kOffVersion] != kVersion || in[kOffCodec] != kCodecWindow)
    return kDecBadMagic;
  if (in[kOffDtype] != (uint8_t)T::kCode || in[kOffBlockLog2] != kBlockLog2) return kDecBadDtype;
  const uint64_t used = load_u64(in + kOffUsed);
  const uint64_t fixed = min_nbytes(T::kCode, n);  // the caller checked n <= kMaxElems
  if (load_u64(in + kOffN) != n || used > L || used % kAlign != 0 || used < fixed) return kDecBadSize;
  const uint8_t st = in[kOffStatus];
  if (st == kEncDoesNotFit) return kDecNotDecodable;
  if (st != kEncOk) return kDecBadHeader;
  const uint64_t esc = load_u64(in + kOffEscBytes), area = used - fixed;
  const uint64_t count = load_u64(in + kOffEscCount);
  // used = fixed + align128(esc) <=> esc <= area < esc + 128 (area is a multiple of 128)
  if (esc > load_u64(in + kOffCapacity) || esc > area || area - esc >= kAlign) return kDecBadHeader;
  if (count > n) return kDecBadHeader;
  for (uint32_t i = kOffBlockLog2 + 1; i < kOffCapacity; ++i)
    if (in[i]) return kDecBadHeader;
  for (uint32_t i = kHeaderUsed; i < kHeaderBytes; ++i)
    if (in[i]) return kDecBadHeader;
  info->used = used;
  info->esc_count = count;
  info->esc_bytes = esc;
  return kDecOk;
}

}  // namespace zipccl

namespace zipccl {
// Scratch bytes per row that the codec handlers receive as an extra result (XLA
// allocates it; the CUDA kernels use it for per-block look-back state and the
// decoder's reductions; the CPU handlers leave it untouched). Mirrored in
// zipccl_jax/_src/codec.py:workspace_nbytes.
ZC_HD uint64_t workspace_nbytes(uint64_t n) { return align_up(16 * num_blocks(n) + 128); }
}  // namespace zipccl
