// Per-thread building blocks of the CUDA codec (cuda/window.cu), written so that
// they also compile as plain host C++: tests/cuda/emulate_window.cc runs them over whole
// rows in the kernels' own decomposition and compares the bytes with the CPU
// codec, which checks everything except the warp/block glue on a machine
// without a GPU.
//
// Decomposition (docs/cuda.md): a CTA works on one block (a "tile") at a time. The
// unit of the bit work is a group of 8 elements, j = 8g .. 8g+7 of the block, i.e.
// byte g of each of the block's bit planes; a thread owns G adjacent groups (the
// kernels' template parameter, 1, 2 or 4: kPlaneBytes / G threads per CTA). A
// group's 8 elements are held as u32 words: 4 words for 16-bit types (element 2i
// in the low half of word i), 8 words for fp32. The functions below work on one
// group; `grp` arguments are group indices within the block.
//
// The bit work is SWAR over bytes: the 8 exponent fields become two u32 of four
// exponent bytes each, codes are computed four at a time, and bit planes are
// gathered from bytes with one multiply. All helpers below are exact integer
// functions of their inputs, so the host build computes the same bits as the GPU.
#pragma once

#include <stdint.h>

#include "window_format.h"

#if defined(__CUDACC__)
#define ZC_TD __host__ __device__ __forceinline__
#else
#define ZC_TD inline
#endif

namespace zipccl {
namespace tile {

constexpr int kThreads = 256;  // threads per CTA of the finalize kernels (tile kernels: kPlaneBytes / G)
constexpr int kWarps = kThreads / 32;
static_assert(kThreads == (int)kPlaneBytes, "256 groups of 8 elements per 2048-element block");

// ---- SWAR primitives ------------------------------------------------------------

// __byte_perm(a, b, s): byte i of the result is byte (s >> 4i) & 7 of b:a. Only
// selectors with bit 3 of every nibble clear are used here (no sign replication).
ZC_TD uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, s);
#else
  const uint64_t v = ((uint64_t)b << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= (uint32_t)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
#endif
}

ZC_TD uint32_t popc(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return (uint32_t)__popc(x);
#else
  return (uint32_t)__builtin_popcount(x);
#endif
}

// c + sum over bytes i of a.byte[i] * b.byte[i] (unsigned).
ZC_TD uint32_t dp4a(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(a, b, c);
#else
  for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 0xFF) * ((b >> (8 * i)) & 0xFF);
  return c;
#endif
}

// 0x80 in every byte of x that is zero, 0x00 elsewhere.
ZC_TD uint32_t zbytes(uint32_t x) {
  return ~(((x & 0x7F7F7F7Fu) + 0x7F7F7F7Fu) | x) & 0x80808080u;
}

// 0x80 per byte -> 0xFF per byte.
ZC_TD uint32_t expand80(uint32_t x80) { return (x80 >> 7) * 0xFFu; }

// Bytewise a + b (mod 256 per byte, no carries between bytes).
ZC_TD uint32_t badd(uint32_t a, uint32_t b) {
  return ((a & 0x7F7F7F7Fu) + (b & 0x7F7F7F7Fu)) ^ ((a ^ b) & 0x80808080u);
}

// Four 0/1 bytes -> four bits (byte i -> bit i). Cross terms of the multiply land
// at distinct bits below 24 or above 31, so nothing carries into bits 24..27.
ZC_TD uint32_t gather4(uint32_t x01) { return (x01 * 0x01020408u) >> 24; }

// Four bits -> four 0/1 bytes (bit i -> byte i); the partial products land on
// distinct bits, so there are no carries.
ZC_TD uint32_t spread4(uint32_t bits) { return ((bits & 0xFu) * 0x00204081u) & 0x01010101u; }

// Eight bits -> eight 0/1 nibbles (bit i -> bit 4i).
ZC_TD uint32_t nspread8(uint32_t b) {
  uint32_t x = b & 0xFFu;
  x = (x | (x << 12)) & 0x000F000Fu;
  x = (x | (x << 6)) & 0x03030303u;
  x = (x | (x << 3)) & 0x11111111u;
  return x;
}

// Valid-element mask (8 bits) of group grp in a block of len elements.
ZC_TD uint32_t valid_mask(uint32_t len, uint32_t grp) {
  const uint32_t j0 = 8 * grp;
  if (len <= j0) return 0u;
  const uint32_t nv = len - j0;
  return nv >= 8 ? 0xFFu : (1u << nv) - 1u;
}

// block_len(n, b): window_format.h.

// ---- per-dtype tile configuration ----------------------------------------------

template <typename T>
struct Cfg {
  static constexpr int kBits = (int)sizeof(typename T::bits_t) * 8;
  static constexpr int kBPT = 1;                          // blocks per tile
  static constexpr int kGW = kBits == 16 ? 4 : 8;         // u32 words per 8-element group
  static constexpr int kWPT = kBPT * kGW;                 // u32 words per thread per tile
  // cp.async ring depth of the kernels: S tiles in shared memory, S - 1 of them
  // loading while one is processed (8 KiB of input in flight per CTA).
  static constexpr int kStages = kBits == 16 ? 3 : 2;
  static constexpr int kRB = T::kRawBytes;                // raw bytes per element
  static constexpr int kRW = 2 * kRB;                     // raw u32 words per group
  static constexpr int kEsize = kBits / 8;                // bytes per element
  static constexpr uint32_t kEmax4 = T::kExpMax * 0x01010101u;
};

// Element k (0..7) of a group.
template <typename T>
ZC_TD uint32_t elem(const uint32_t* w, int k) {
  if (Cfg<T>::kBits == 16) return (w[k >> 1] >> (16 * (k & 1))) & 0xFFFFu;
  return w[k];
}

template <typename T>
ZC_TD void set_elem(uint32_t* w, int k, uint32_t v) {
  if (Cfg<T>::kBits == 16) {
    const int s = 16 * (k & 1);
    w[k >> 1] = (w[k >> 1] & ~(0xFFFFu << s)) | ((v & 0xFFFFu) << s);
  } else {
    w[k] = v;
  }
}

// ---- encoder: split a group into exponent bytes, raw bytes, raw plane bits ------

struct Split {
  uint32_t E[2];  // exponent fields of elements 0..3 and 4..7, one byte each
  uint32_t R[6];  // the group's raw section bytes, little-endian words (2 or 6 used)
  uint32_t rp;    // fp16 only: raw plane bytes m8 | m9 << 8 | sign << 16
};

template <typename T>
ZC_TD Split split(const uint32_t* w) {
  Split s;
  s.rp = 0;
  if (T::kCode == kF32) {
    for (int h = 0; h < 2; ++h) {
      const uint32_t* v = w + 4 * h;
      const uint32_t e01 = prmt(v[0] << 1, v[1] << 1, 0x0073u);
      const uint32_t e23 = prmt(v[2] << 1, v[3] << 1, 0x0073u);
      s.E[h] = prmt(e01, e23, 0x5410u);
      uint32_t r[4];
      for (int k = 0; k < 4; ++k) r[k] = (v[k] & 0x7FFFFFu) | ((v[k] >> 8) & 0x800000u);
      s.R[3 * h + 0] = prmt(r[0], r[1], 0x4210u);
      s.R[3 * h + 1] = prmt(r[1], r[2], 0x5421u);
      s.R[3 * h + 2] = prmt(r[2], r[3], 0x6542u);
    }
  } else {
    uint32_t m8 = 0, m9 = 0, sg = 0;
    for (int h = 0; h < 2; ++h) {
      const uint32_t H = prmt(w[2 * h], w[2 * h + 1], 0x7531u);  // high bytes of 4 elements
      const uint32_t L = prmt(w[2 * h], w[2 * h + 1], 0x6420u);  // low bytes
      if (T::kCode == kBF16) {
        s.E[h] = ((H << 1) & 0xFEFEFEFEu) | ((L >> 7) & 0x01010101u);
        s.R[h] = (H & 0x80808080u) | (L & 0x7F7F7F7Fu);
      } else {  // fp16: H = sign | e[4:0] | m9 | m8
        s.E[h] = (H >> 2) & 0x1F1F1F1Fu;
        s.R[h] = L;
        m8 |= gather4(H & 0x01010101u) << (4 * h);
        m9 |= gather4((H >> 1) & 0x01010101u) << (4 * h);
        sg |= gather4((H >> 7) & 0x01010101u) << (4 * h);
      }
    }
    s.R[2] = s.R[3] = s.R[4] = s.R[5] = 0;
    s.rp = m8 | (m9 << 8) | (sg << 16);
  }
  return s;
}

// Window statistics of the valid elements of a group (see choose_window).
struct Stats {
  uint32_t S, N, Z;
};

template <typename T>
ZC_TD Stats group_stats(const Split& s, uint32_t vmask) {
  Stats st{0, 0, 0};
  for (int h = 0; h < 2; ++h) {
    const uint32_t vm = spread4(vmask >> (4 * h)) << 7;  // 0x80 per valid byte
    const uint32_t z = zbytes(s.E[h]) & vm;
    const uint32_t mx = zbytes(s.E[h] ^ Cfg<T>::kEmax4) & vm;
    const uint32_t nm = vm & ~(z | mx);
    st.Z += popc(z);
    st.N += popc(nm);
    st.S = dp4a(s.E[h], nm >> 7, st.S);
  }
  return st;
}

// choose_window() with 32-bit arithmetic (a 64-bit division is a long software
// routine on the GPU and costs registers). Exact for block statistics, where
// N, Z <= len <= 2048 and S <= 254 N, so 4S - 13N and 4N fit easily in int32;
// tests/cuda/emulate_window.cc checks it against choose_window on every block it encodes.
template <typename T>
ZC_TD Window choose_window32(uint32_t S, uint32_t N, uint32_t Z, uint32_t len) {
  const int32_t hi0 = (int32_t)T::kExpMax - 6;
  int32_t t = 0;
  if (N) {
    const int32_t a = 4 * (int32_t)S - 13 * (int32_t)N, b = 4 * (int32_t)N;
    const int32_t q = a / b;
    t = (q * b > a) ? q - 1 : q;  // floor
  }
  Window w;
  if (Z * 32 > len) {
    const int32_t b = t + 1;
    w.base = (uint32_t)(b < 1 ? 1 : (b > hi0 + 1 ? hi0 + 1 : b));
    w.mode = 1;
  } else {
    w.base = (uint32_t)(t < 0 ? 0 : (t > hi0 ? hi0 : t));
    w.mode = 0;
  }
  return w;
}

// Valid elements of the group whose exponent field equals v (refine_window's
// probes; a probe outside 0..kExpMax counts nothing, as on the CPU).
template <typename T>
ZC_TD uint32_t group_count_eq(const Split& s, uint32_t vmask, int32_t v) {
  if (v < 0 || v > (int32_t)T::kExpMax) return 0u;
  const uint32_t rep = (uint32_t)v * 0x01010101u;
  uint32_t c = 0;
  for (int h = 0; h < 2; ++h) c += popc(zbytes(s.E[h] ^ rep) & (spread4(vmask >> (4 * h)) << 7));
  return c;
}

// Codes (one byte each, 0..7) of four exponent bytes; = code_of() bytewise.
ZC_TD uint32_t codes4(uint32_t E, Window w) {
  if (w.mode == 0) {
    // c = e - base + 1 (mod 256); in the window exactly when c is 1..7, and c = 0 is
    // an escape anyway, so keeping every c <= 7 is exact.
    const uint32_t c = badd(E, ((1u - w.base) & 0xFFu) * 0x01010101u);
    return c & expand80(zbytes(c & 0xF8F8F8F8u));
  }
  // c = e - base + 2: in the window when 2..7; c = 1 is e = base - 1 (an escape
  // unless e = 0); e = 0 always gets code 1 (its c is 0, 1 or >= 8 for a valid base).
  const uint32_t c = badd(E, ((2u - w.base) & 0xFFu) * 0x01010101u);
  uint32_t code = c & expand80(zbytes(c & 0xF8F8F8F8u));
  code ^= zbytes(code ^ 0x01010101u) >> 7;
  return code | (zbytes(E) >> 7);
}

// The group's plane bytes and escape mask.
struct Planes {
  uint32_t p[6];  // planes 0..2 = code bits, 3..5 = fp16 raw planes (8 bits each)
  uint32_t esc;   // bit k: element k is an escape
};

template <typename T>
ZC_TD Planes group_planes(const Split& s, Window w, uint32_t vmask) {
  const uint32_t c0 = codes4(s.E[0], w), c1 = codes4(s.E[1], w);
  Planes pl;
  for (int i = 0; i < 3; ++i)
    pl.p[i] = (gather4((c0 >> i) & 0x01010101u) | (gather4((c1 >> i) & 0x01010101u) << 4)) & vmask;
  pl.p[3] = s.rp & vmask;
  pl.p[4] = (s.rp >> 8) & vmask;
  pl.p[5] = (s.rp >> 16) & vmask;
  pl.esc = ~(pl.p[0] | pl.p[1] | pl.p[2]) & vmask;
  return pl;
}

// ---- decoder ------------------------------------------------------------------------

// Eight exponent bytes from the code planes through an 8-entry byte table
// (prmt with the codes as selector nibbles); escapes (code 0) give 0 here.
ZC_TD void decode_exps(uint32_t p0, uint32_t p1, uint32_t p2, Window w, uint32_t E[2]) {
  uint32_t lut[8];
  lut[0] = 0;
  for (uint32_t c = 1; c < 8; ++c) lut[c] = exp_of(c, w) & 0xFFu;
  const uint32_t L0 = lut[0] | (lut[1] << 8) | (lut[2] << 16) | (lut[3] << 24);
  const uint32_t L1 = lut[4] | (lut[5] << 8) | (lut[6] << 16) | (lut[7] << 24);
  const uint32_t sel = nspread8(p0) | (nspread8(p1) << 1) | (nspread8(p2) << 2);
  E[0] = prmt(L0, L1, sel & 0xFFFFu);
  E[1] = prmt(L0, L1, sel >> 16);
}

// Joins raw bytes (R: the group's raw section words), raw planes (fp16: p3..p5)
// and exponent bytes into the 8 elements; = T::join() elementwise, including its
// truncation to the element width (an fp16 exponent byte > 31 from a corrupt
// payload spills into the sign exactly as on the CPU).
template <typename T>
ZC_TD void join_group(const uint32_t* R, uint32_t p3, uint32_t p4, uint32_t p5, const uint32_t E[2],
                      uint32_t* w) {
  if (T::kCode == kF32) {
    for (int h = 0; h < 2; ++h) {
      const uint32_t* o = R + 3 * h;
      uint32_t r[4];
      r[0] = o[0];
      r[1] = prmt(o[0], o[1], 0x0543u);
      r[2] = prmt(o[1], o[2], 0x0432u);
      r[3] = o[2] >> 8;
      for (int k = 0; k < 4; ++k) {
        const uint32_t e = (E[h] >> (8 * k)) & 0xFFu;
        w[4 * h + k] = (r[k] & 0x7FFFFFu) | ((r[k] & 0x800000u) << 8) | (e << 23);
      }
    }
  } else {
    for (int h = 0; h < 2; ++h) {
      uint32_t H, L;
      if (T::kCode == kBF16) {
        H = (R[h] & 0x80808080u) | ((E[h] >> 1) & 0x7F7F7F7Fu);
        L = ((E[h] << 7) & 0x80808080u) | (R[h] & 0x7F7F7F7Fu);
      } else {
        H = (spread4(p5 >> (4 * h)) << 7) | ((E[h] << 2) & 0xFCFCFCFCu) |
            (spread4(p4 >> (4 * h)) << 1) | spread4(p3 >> (4 * h));
        L = R[h];
      }
      w[2 * h] = prmt(L, H, 0x5140u);
      w[2 * h + 1] = prmt(L, H, 0x7362u);
    }
  }
}

// ---- row geometry shared by kernels, handlers and the host emulation -----------------

struct Geom {
  uint64_t n, cap;
  uint64_t table_off, raw_off, plane_off, esc_off, total;  // layout_of()
  uint64_t raw_size;    // align_up(n * RB): raw section incl. padding
  uint64_t table_size;  // align_up(8 * nb)
  uint64_t esc_size;    // align_up(cap)
  uint64_t plane_end;   // plane_off + plane_section_bytes: the plane section's padding is [plane_end, esc_off)
  uint32_t nb;          // blocks
  uint32_t tiles;       // tiles per row = ceil(nb / kBPT)
};

template <typename T>
ZC_TD Geom geom_of(uint64_t n, uint64_t cap) {
  const Layout L = layout_of(T::kCode, n, cap);
  Geom g;
  g.n = n;
  g.cap = cap;
  g.table_off = L.table_off;
  g.raw_off = L.raw_off;
  g.plane_off = L.plane_off;
  g.esc_off = L.esc_off;
  g.total = L.total;
  g.raw_size = L.plane_off - L.raw_off;
  g.table_size = L.raw_off - L.table_off;
  g.esc_size = L.total - L.esc_off;
  g.plane_end = L.plane_off + plane_section_bytes(T::kCode, n);
  g.nb = (uint32_t)num_blocks(n);
  g.tiles = (g.nb + Cfg<T>::kBPT - 1) / Cfg<T>::kBPT;
  return g;
}

// Row offset of raw word q (8 bytes) counted from group grp of block b (q may run
// past the group's own RB words into the next groups'); the word is part of the
// row (data or raw padding) when it is < raw_size.
template <typename T>
ZC_TD uint64_t raw_word_off(uint64_t b, uint32_t grp, int q) {
  return (b * kBlock + 8ull * grp) * (uint64_t)Cfg<T>::kRB + 8ull * (uint64_t)q;
}

// The record as the little-endian u64 of its 8 bytes (window_format.h store_record).
ZC_TD uint64_t record_word(Record r) {
  const uint64_t cw = (r.esc_count & 0xFFFu) | ((r.width & 0xFu) << 12);
  return (uint64_t)r.esc_offset | (cw << 32) | ((uint64_t)(r.base & 0xFFu) << 48) |
         ((uint64_t)((r.mode & 1u) | (r.split << 1)) << 56);
}

ZC_TD Record record_of_word(uint64_t v) {
  Record r;
  r.esc_offset = (uint32_t)v;
  r.esc_count = (uint32_t)(v >> 32) & 0xFFFu;
  r.width = (uint32_t)(v >> 44) & 0xFu;
  r.base = (uint32_t)(v >> 48) & 0xFFu;
  r.mode = (uint32_t)(v >> 56) & 1u;
  r.split = (uint32_t)(v >> 57) & 0x7Fu;
  return r;
}

// Decoder check of one block record (the CPU's sequential table check, made local:
// the record's own fields, offset(0) = 0, offset(b) + stream_bytes(b) = offset(b + 1),
// and for the last block offset + stream_bytes = the header's escape_bytes; together
// these hold exactly when the CPU's running sum matches every offset and the header.
// The CPU's count sum is checked apart: the tiles add the counts, decode_finalize
// compares).
template <typename T>
ZC_TD bool record_ok(Record r, uint64_t b, uint32_t nb, uint32_t len, bool have_next, uint32_t next_off,
                     uint64_t esc_total) {
  if (!window_valid<T>(r.base, r.mode) || !record_codes_ok(r, len)) return false;
  if (b == 0 && r.esc_offset != 0) return false;
  const uint64_t end = (uint64_t)r.esc_offset + stream_bytes(r.esc_count, r.width);
  if (b + 1 < nb) return have_next && end == (uint64_t)next_off;
  return end == esc_total;
}

// ---- checksum terms ---------------------------------------------------------------------
// checksum = sum over the row's u32 words w_j of w_j * (2j + 1) mod 2^64, j = byte
// offset / 4 (window_format.h: checksum_span). Being a sum, it is accumulated per
// thread in any order and reduced with integer adds; a byte b at offset o is the
// word b << 8 (o mod 4) at j = o / 4.
ZC_TD uint64_t cs_word(uint64_t off, uint32_t w) { return (uint64_t)w * (2 * (off >> 2) + 1); }
ZC_TD uint64_t cs_u64(uint64_t off, uint64_t v) {  // off % 8 == 0
  return cs_word(off, (uint32_t)v) + cs_word(off + 4, (uint32_t)(v >> 32));
}
ZC_TD uint64_t cs_byte(uint64_t off, uint32_t b) { return cs_word(off, (b & 0xFFu) << (8 * (off & 3))); }

// The header's first 64 bytes as eight u64 words (word 3, the checksum, is 0 here;
// words 8..15 are reserved, 0).
ZC_TD uint64_t header_word(int i, const Header& f) {
  switch (i) {
    case 0:
      return (uint64_t)kMagic | ((uint64_t)kVersion << 32) | ((uint64_t)f.dtype << 40) |
             ((uint64_t)kCodecWindow << 48) | ((uint64_t)f.status << 56);
    case 1: return f.n;
    case 2: return f.used;
    case 4: return (uint64_t)kBlockLog2;
    case 5: return f.capacity;
    case 6: return f.esc_count;
    case 7: return f.esc_bytes;
    default: return 0;
  }
}

// = header_checksum() of window_format.h, without a byte array (no local memory).
ZC_TD uint64_t header_cs(const Header& f) {
  uint64_t s = 0;
  for (int i = 0; i < (int)(kHeaderUsed / 8); ++i) s += cs_u64(8ull * i, header_word(i, f));
  return s;
}

// Decoder: the escape bytes of a row that the checksum covers, [esc_off, esc_off +
// span): used_nbytes - esc_off when the header's used_nbytes is one a valid row can
// have in an L-byte buffer (a multiple of 128 in [esc_off, L]), else 0 (the header
// check then reports the row). Never reaches past the buffer.
ZC_TD uint64_t esc_span(const uint8_t* in, uint64_t esc_off, uint64_t L) {
  const uint64_t used = load_u64(in + kOffUsed);
  return (used % kAlign == 0 && used >= esc_off && used <= L) ? used - esc_off : 0;
}

// Decoder: escape-section bytes that each tile of a row folds into the checksum
// (a multiple of 16; tiles * chunk >= esc_size).
ZC_TD uint64_t esc_chunk_of(uint64_t esc_size, uint32_t tiles) {
  const uint64_t t = tiles ? tiles : 1;
  return ((esc_size + t - 1) / t + 15) & ~15ull;
}

// Encoder: escape-section bytes zeroed per CTA before the tiles OR their streams in
// (a multiple of 16).
constexpr uint64_t kZeroChunk = 32768;

// Workspace layout per row (workspace_nbytes(n) bytes; memset to 0 by the handler).
constexpr uint32_t kWsTicket = 0;   // u32, row 0 only: tile tickets of the encoder (all rows)
constexpr uint32_t kWsSum = 8;      // u64: checksum terms of the row's words written/read by tiles
constexpr uint32_t kWsTotal = 16;   // u64: encoder, escape-section bytes of the row (set by its last tile)
constexpr uint32_t kWsBad = 24;     // u32: decoder, bit s set when a tile found status s (6, 7)
constexpr uint32_t kWsCount = 32;   // u64: escapes of the row (encoder: found; decoder: the records' sum)
constexpr uint32_t kWsStates = 128; // u64 per tile: encoder look-back state (flag << 32 | stream bytes)
constexpr uint64_t kFlagAggregate = 1ull << 32;
constexpr uint64_t kFlagPrefix = 2ull << 32;

}  // namespace tile
}  // namespace zipccl
