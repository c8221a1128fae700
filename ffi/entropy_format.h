// "entropy" codec (codec id 2), format version 5: constants, per-dtype symbol
// traits, the static-size contract and the deterministic encoder choices (code
// lengths, canonical codes, the code-length nibble stream). docs/format.md
// ("Entropy codec (codec id 2)") is the normative text; this header is its
// executable form, shared by the CPU codec (ffi/entropy_cpu.cc) and a future
// CUDA port: everything is plain C++17 with fixed-size arrays, marked EZ_HD.
//
// One row, all integers little-endian:
//
//   [0, 56)                header (32 common bytes + entropy fields)
//   [56, data_off)         directory: u16 byte size of every block, zero padded,
//                          data_off = 56 + align8(2 * nb)
//   [data_off, +data_bytes) the blocks, back to back (no padding)
//   [.., used_nbytes)      zero, used_nbytes = align128(data_off + data_bytes)
//
// nb = ceil(n / 4096). A block is RAW (element words verbatim), CONST (one symbol
// value + raw planes) or HUFF (canonical Huffman over the block's symbols in 8
// independent MSB-first bit streams, then the raw planes). Version 3 added kind Z
// (zero elision): kind J's symbols, raw values only for elements with exponent != 0.
// Version 4: fp16 symbols code the exponent with the top mantissa bit (q = 1).
// Version 5: the directory follows the 56 header bytes (it was at 128, padded to a
// multiple of 128): a row of nb <= 36 blocks saves 128 + 56 bytes (4% of a 4 KiB
// bf16 row's encoding), which small shards (a CNN's per-device weights, MoE
// dispatch rows) pay on every call.
#pragma once

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define EZ_HD __host__ __device__ __forceinline__
#else
#define EZ_HD inline
#endif

namespace zipccl {
namespace ent {

// ---- constants -------------------------------------------------------------------

constexpr uint32_t kMagic = 0x4C43435Au;  // bytes 'Z' 'C' 'C' 'L'
constexpr uint8_t kVersion = 5;  // (the window codec's rows carry their own, 4)
constexpr uint8_t kCodecId = 2;
constexpr uint32_t kAlign = 128;
constexpr uint32_t kHeaderBytes = 128;  // the smallest row (and the workspace's counters)
constexpr uint32_t kBlockLog2 = 12;
constexpr uint32_t kBlock = 1u << kBlockLog2;   // elements per block (4096)
constexpr uint32_t kStreams = 8;                // bit streams per HUFF block
constexpr uint32_t kStreamLen = kBlock / kStreams;  // elements per stream (512)
constexpr uint32_t kMaxLen = 11;                // longest code (bits) = table index bits
constexpr uint32_t kTableSize = 1u << kMaxLen;  // decode table entries (2048)
constexpr uint32_t kMaxAlphabet = 512;          // largest symbol alphabet (bf16 joint)
constexpr uint32_t kBlockHead = 4;              // mode, 0, u16 (symbol / sym_end)
constexpr uint32_t kHuffHead = kBlockHead + 2 * kStreams;  // + u16 bits[8] = 20

// Common header (COMMON.md) and the entropy fields.
constexpr uint32_t kOffMagic = 0;       // u32
constexpr uint32_t kOffVersion = 4;     // u8 = 4
constexpr uint32_t kOffDtype = 5;       // u8 1 bf16, 2 fp16
constexpr uint32_t kOffCodec = 6;       // u8 = 2
constexpr uint32_t kOffStatus = 7;      // u8 0 OK, 1 DOES_NOT_FIT
constexpr uint32_t kOffN = 8;           // u64
constexpr uint32_t kOffUsed = 16;       // u64 used_nbytes
constexpr uint32_t kOffChecksum = 24;   // u64
constexpr uint32_t kOffBlockLog2 = 32;  // u8 = 12
constexpr uint32_t kOffStreams = 33;    // u8 = 8
constexpr uint32_t kOffMaxLen = 34;     // u8 = 11
// 35: u8 reserved (0)
constexpr uint32_t kOffRawBlocks = 36;  // u32 blocks stored RAW
constexpr uint32_t kOffNumBlocks = 40;  // u64 nb
constexpr uint32_t kOffDataBytes = 48;  // u64 sum of the block sizes
constexpr uint32_t kHeaderUsed = 56;    // the header's size
constexpr uint32_t kDirOff = kHeaderUsed;  // the directory: u16 per block

enum DtypeCode : uint8_t { kBF16 = 1, kF16 = 2 };
enum Coding : uint8_t { kRaw = 0, kConst = 1, kHuff = 2 };
// E: symbol = coded exponent c, raw = sign, low mantissa; J: symbol = c<<1 | sign,
// raw = low mantissa; Z: J's symbols, raw = the low mantissa of elements with c != 0 only
// (an element with exponent 0 decodes to +-0: a block may be Z only when it holds
// no subnormal, see z_valid).
enum Kind : uint8_t { kKindE = 0, kKindJ = 1, kKindZ = 2 };

// Decoder statuses (shared numbering, COMMON.md / docs/format.md).
enum DecodeStatus : int32_t {
  kDecOk = 0,
  kDecBadMagic = 1,
  kDecBadDtype = 2,
  kDecBadSize = 3,
  kDecNotDecodable = 4,
  kDecBadHeader = 5,
  kDecBadTable = 6,    // directory or a block header / code-length set invalid
  kDecBadStream = 7,   // a bit stream does not end exactly at its stored length
  kDecBadChecksum = 8,
};

// ---- little-endian helpers -----------------------------------------------------------

EZ_HD uint16_t ld16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }
EZ_HD uint32_t ld32(const uint8_t* p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
EZ_HD uint64_t ld64(const uint8_t* p) { return (uint64_t)ld32(p) | ((uint64_t)ld32(p + 4) << 32); }
EZ_HD void st16(uint8_t* p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
EZ_HD void st32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
EZ_HD void st64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (uint8_t)(v >> (8 * i));
}

EZ_HD uint64_t align128(uint64_t x) { return (x + (kAlign - 1)) / kAlign * kAlign; }
EZ_HD uint64_t align8(uint64_t x) { return (x + 7) / 8 * 8; }

// Checksum contribution of `count` u32 words at row word index j0 (COMMON.md:
// sum_j w_j * (2j + 1) mod 2^64), split as (2 j0 + 1) sum w + 2 sum i w.
EZ_HD uint64_t checksum_words(const uint8_t* p, uint64_t j0, uint64_t count) {
  uint64_t s0 = 0, s1 = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint32_t w = ld32(p + 4 * i);
    s0 += w;
    s1 += (uint64_t)w * i;
  }
  return (2 * j0 + 1) * s0 + 2 * s1;
}

// ---- per-dtype symbol traits -------------------------------------------------------------
//
// A 16-bit float v = s | e (E bits) | m (M bits). The symbols code the *coded
// exponent* c = e << q | m >> (M - q) (E + q bits: the exponent and the top q
// mantissa bits, adjacent in v), the raw values the low mantissa m_low = m &
// (2^(M-q) - 1) (L = M - q bits): bf16 q = 0, fp16 q = 1 (a density falling across
// a binade makes fp16's top mantissa bit non-uniform: +0.46% on Gaussian data).
// Kind E codes symbol c and keeps raw = s << L | m_low (L + 1 bits); kind J codes
// symbol c << 1 | s and keeps raw = m_low (L bits); kind Z is kind J (every helper
// below treats it so) except that only the nz elements with c != 0 (symbol >= 2)
// have a raw value: its planes are kind J's planes of those nz values,
// raw_bytes(kKindZ, nz) = raw_bytes(kKindJ, nz). In a Z-valid block (no subnormal)
// c == 0 exactly when e == 0. Raw bits are stored as a byte plane (raw & 0xFF, when
// the raw width is >= 8) and a packed plane of the remaining w bits per element (w
// = width - 8, or the whole width when it is < 8): every 8 elements fill w bytes.
//   bf16 (E 8, M 7, q 0):  E: 256 symbols, byte plane (s<<7 | m) + w 0;
//                          J: 512 symbols, w 7 only (m).
//   fp16 (E 5, M 10, q 1): E: 64 symbols, byte plane (m[7:0]) + w 2 (s<<1 | m8);
//                          J: 128 symbols, byte plane (m[7:0]) + w 1 (m8).

struct Traits {
  uint32_t ebits, mbits, q;
  // Coded exponent bits (E + q) and low mantissa bits (L = M - q).
  EZ_HD constexpr uint32_t cbits() const { return ebits + q; }
  EZ_HD constexpr uint32_t lbits() const { return mbits - q; }
  // The coded exponent's bits in v: ((2^(E+q) - 1) << L).
  EZ_HD constexpr uint32_t cmask() const { return ((1u << cbits()) - 1) << lbits(); }
  // The symbols' kind: Z codes J symbols.
  EZ_HD static constexpr uint32_t sym_kind(uint32_t kind) { return kind == kKindE ? kKindE : kKindJ; }
  EZ_HD constexpr uint32_t alphabet(uint32_t kind) const { return 1u << (cbits() + sym_kind(kind)); }
  EZ_HD constexpr uint32_t raw_width(uint32_t kind) const { return kind == kKindE ? lbits() + 1 : lbits(); }
  EZ_HD constexpr bool byte_plane(uint32_t kind) const { return raw_width(kind) >= 8; }
  EZ_HD constexpr uint32_t packed_width(uint32_t kind) const {
    return raw_width(kind) >= 8 ? raw_width(kind) - 8 : raw_width(kind);
  }
  // Bytes of the raw planes for a block of len elements.
  EZ_HD constexpr uint32_t raw_bytes(uint32_t kind, uint32_t len) const {
    return (byte_plane(kind) ? len : 0) + (len + 7) / 8 * packed_width(kind);
  }
  EZ_HD constexpr uint32_t symbol(uint32_t kind, uint32_t v) const {
    return kind == kKindE ? (v >> lbits()) & ((1u << cbits()) - 1)
                          : (((v >> lbits()) & ((1u << cbits()) - 1)) << 1) | (v >> 15);
  }
  EZ_HD constexpr uint32_t raw(uint32_t kind, uint32_t v) const {
    return kind == kKindE ? ((v >> 15) << lbits()) | (v & ((1u << lbits()) - 1)) : v & ((1u << lbits()) - 1);
  }
  // The bits of the value that the symbol carries (OR-ed with join_raw's).
  EZ_HD constexpr uint32_t sym_bits(uint32_t kind, uint32_t sym) const {
    return kind == kKindE ? sym << lbits() : ((sym & 1u) << 15) | ((sym >> 1) << lbits());
  }
  EZ_HD constexpr uint32_t raw_bits(uint32_t kind, uint32_t raw) const {
    return kind == kKindE ? ((raw >> lbits()) << 15) | (raw & ((1u << lbits()) - 1)) : raw;
  }
  // Exponent field 0 (+-0 or a subnormal).
  EZ_HD constexpr bool zero_exp(uint32_t v) const { return ((v >> mbits) & ((1u << ebits) - 1)) == 0; }
  // A subnormal: exponent 0, mantissa != 0, i.e. (v & 0x7FFF) in [1, 2^M). A block is
  // Z-valid when it has an element with exponent 0 and no subnormal.
  EZ_HD constexpr bool subnormal(uint32_t v) const {
    return (uint32_t)((v & 0x7FFFu) - 1u) < (1u << mbits) - 1u;
  }
};

EZ_HD constexpr Traits traits_of(DtypeCode d) { return d == kBF16 ? Traits{8, 7, 0} : Traits{5, 10, 1}; }

// ---- static size contract ----------------------------------------------------------------
// Mirrored by zipccl_jax/_src/entropy.py (a test checks that both agree).

EZ_HD uint64_t num_blocks(uint64_t n) { return (n + kBlock - 1) / kBlock; }
EZ_HD uint32_t block_len(uint64_t n, uint64_t b) {
  const uint64_t rest = n - b * kBlock;
  return (uint32_t)(rest < kBlock ? rest : kBlock);
}
// The first block's offset: header, directory, up to 6 zero bytes so that it is a
// multiple of 8 (the header and directory are then whole u32 words of the checksum).
EZ_HD uint64_t data_offset(uint64_t n) { return kDirOff + align8(2 * num_blocks(n)); }
// A RAW block: 4 header bytes + the 2-byte words. No block is ever larger.
EZ_HD uint32_t max_block_bytes(uint32_t len) { return kBlockHead + 2 * len; }
// The smallest block: CONST-Z (every element +0, or every one -0), 4 bytes.
EZ_HD uint32_t min_block_bytes(uint32_t len) { return (void)len, kBlockHead; }
EZ_HD uint64_t max_nbytes(DtypeCode d, uint64_t n) {
  const uint64_t nb = num_blocks(n);
  return align128(data_offset(n) + nb * kBlockHead + 2 * n);
}
// Workspace per row (the CUDA handlers' need; the CPU handlers accept any size):
// 128 bytes of row counters, then 8 bytes per block + 8 (look-back states in the
// encoder, block offsets in the decoder).
EZ_HD uint64_t workspace_nbytes(uint64_t n) { return kHeaderBytes + align128(8 * (num_blocks(n) + 1)); }
EZ_HD uint64_t min_nbytes(DtypeCode d, uint64_t n) {
  (void)d;
  return align128(data_offset(n) + num_blocks(n) * (uint64_t)min_block_bytes(kBlock));
}

// ---- code lengths: length-limited Huffman by package-merge ----------------------------
//
// Input: counts[0, A) (A <= 512). Output: len[s] in 0..kMaxLen (0 = absent), returns
// the number k of present symbols. k == 1 gives len 0 for all (the caller uses CONST).
// Deterministic (so every encoder produces identical bytes): leaves are ordered by
// (count, symbol) ascending; at each of the kMaxLen - 1 merge levels the packages
// (sums of consecutive pairs of the previous level's list) are merged with the leaves,
// a leaf before a package of equal weight. Taking t = 2k - 2 items of the last list,
// each level contributes +1 to the first c leaves (c = leaves among its first t
// items), and the level below is walked with t = 2 * (packages among them).

struct PMScratch {
  uint32_t leaf_w[kMaxAlphabet];
  uint16_t leaf_sym[kMaxAlphabet];
  // Per level: the list as (weight, is_leaf) of up to 2k - 1 items.
  uint32_t w[kMaxLen][2 * kMaxAlphabet];
  uint8_t leaf[kMaxLen][2 * kMaxAlphabet];
  uint32_t size[kMaxLen];
};

EZ_HD uint32_t code_lengths(const uint32_t* counts, uint32_t A, uint8_t* len, PMScratch* s) {
  uint32_t k = 0;
  for (uint32_t a = 0; a < A; ++a) {
    len[a] = 0;
    if (counts[a]) {
      // insertion into (count, symbol) order; symbols arrive ascending so ties keep order
      uint32_t i = k++;
      while (i > 0 && s->leaf_w[i - 1] > counts[a]) {
        s->leaf_w[i] = s->leaf_w[i - 1];
        s->leaf_sym[i] = s->leaf_sym[i - 1];
        --i;
      }
      s->leaf_w[i] = counts[a];
      s->leaf_sym[i] = (uint16_t)a;
    }
  }
  if (k < 2) return k;
  for (uint32_t i = 0; i < k; ++i) {
    s->w[0][i] = s->leaf_w[i];
    s->leaf[0][i] = 1;
  }
  s->size[0] = k;
  for (uint32_t L = 1; L < kMaxLen; ++L) {
    const uint32_t np = s->size[L - 1] / 2;
    // Branch-free merge (the leaf/package choice is data-dependent and mispredicts).
    const uint32_t* prev = s->w[L - 1];
    // Only the first 2k-2 items of the top list are read (k + np >= 2k - 2 there
    // whenever 2^kMaxLen >= k; the min keeps the reads inside the list regardless).
    const uint32_t total = (L == kMaxLen - 1 && 2 * k - 2 < k + np) ? 2 * k - 2 : k + np;
    uint32_t i = 0, j = 0;
    for (uint32_t o = 0; o < total; ++o) {
      const uint32_t lw = i < k ? s->leaf_w[i] : 0xFFFFFFFFu;
      const uint32_t pw = j < np ? prev[2 * j] + prev[2 * j + 1] : 0xFFFFFFFFu;
      const uint32_t take_leaf = lw <= pw;
      s->w[L][o] = take_leaf ? lw : pw;
      s->leaf[L][o] = (uint8_t)take_leaf;
      i += take_leaf;
      j += 1 - take_leaf;
    }
    s->size[L] = total;
  }
  uint8_t tmp[kMaxAlphabet];
  for (uint32_t i = 0; i < k; ++i) tmp[i] = 0;
  uint32_t t = 2 * k - 2;
  for (int L = (int)kMaxLen - 1; L >= 0 && t > 0; --L) {
    uint32_t c = 0;
    for (uint32_t i = 0; i < t; ++i) c += s->leaf[L][i];
    for (uint32_t i = 0; i < c; ++i) tmp[i]++;
    t = 2 * (t - c);
  }
  for (uint32_t i = 0; i < k; ++i) len[s->leaf_sym[i]] = tmp[i];
  return k;
}

// ---- canonical codes ------------------------------------------------------------------------
//
// Codes are assigned in (length, symbol) order: the first gets 0, each next one
// (previous + 1) << (its length - previous length). A code of length l is written
// MSB first. code[s] = the code value (l bits). Returns false when the lengths are
// not a complete code (Kraft sum != 1) or a length exceeds kMaxLen.

// scratch: 2 * (kMaxLen + 2) words (per-length counts and next codes); a GPU
// thread passes shared memory, so that no dynamically indexed local array lands
// in local memory.
EZ_HD bool canonical_codes(const uint8_t* len, uint32_t A, uint16_t* code, uint32_t* scratch) {
  uint32_t* nl = scratch;
  uint32_t* next = scratch + kMaxLen + 2;
  for (uint32_t l = 0; l <= kMaxLen; ++l) nl[l] = 0;
  for (uint32_t a = 0; a < A; ++a) {
    if (len[a] > kMaxLen) return false;
    nl[len[a]]++;
  }
  uint32_t kraft = 0;
  for (uint32_t l = 1; l <= kMaxLen; ++l) kraft += nl[l] << (kMaxLen - l);
  if (kraft != kTableSize) return false;
  uint32_t c = 0;
  next[1] = 0;
  for (uint32_t l = 1; l <= kMaxLen; ++l) {
    next[l] = c;
    c = (c + nl[l]) << 1;
  }
  for (uint32_t a = 0; a < A; ++a)
    if (len[a]) code[a] = (uint16_t)(next[len[a]]++);
  return true;
}

EZ_HD bool canonical_codes(const uint8_t* len, uint32_t A, uint16_t* code) {
  uint32_t scratch[2 * (kMaxLen + 2)];
  return canonical_codes(len, A, code, scratch);
}

// ---- code-length nibble stream -------------------------------------------------------------
//
// Lengths of symbols 0 .. sym_end-1 (sym_end = 1 + the largest present symbol), as
// 4-bit values, low nibble of each byte first: 1..11 = the symbol's code length, 0 =
// absent; 15, a, b = a run of (a | b << 4) + 3 absent symbols (3..258). 12..14 are
// invalid. The encoder codes every run of r >= 3 absent symbols as chunks of
// min(r, 258) while r >= 3, the rest (< 3) as zeros. An odd count ends with a zero
// high nibble.

// Writes the nibble stream; returns its byte count. out may be null (size only).
// len[0, a0) must be zero and is not read: the leading run of absent symbols then
// starts at a0 without a scan (the CPU encoder knows where a block's symbols start).
EZ_HD uint32_t write_lengths(const uint8_t* len, uint32_t sym_end, uint8_t* out, uint32_t a0 = 0) {
  uint32_t nn = 0;
  auto put = [&](uint32_t v) {
    if (out) {
      if (nn & 1) out[nn >> 1] |= (uint8_t)(v << 4);
      else out[nn >> 1] = (uint8_t)v;
    }
    ++nn;
  };
  uint32_t a = 0, r0 = a0 < sym_end ? a0 : sym_end;  // r0: absent symbols known before a
  while (a < sym_end) {
    if (!r0 && len[a]) {
      put(len[a++]);
      continue;
    }
    uint32_t r = r0;
    r0 = 0;
    while (a + r < sym_end && len[a + r] == 0) ++r;
    a += r;
    while (r >= 3) {
      const uint32_t c = r < 258 ? r : 258;
      put(15);
      put((c - 3) & 15);
      put((c - 3) >> 4);
      r -= c;
    }
    while (r--) put(0);
  }
  return (nn + 1) / 2;
}

// Parses a nibble stream from p[0, avail) into len[0, sym_end) (zeroed first). Returns
// the bytes used, or -1 when invalid: a nibble 12..14, a run past sym_end, sym_end
// not reached within avail bytes, or the last symbol (sym_end - 1) absent.
EZ_HD int32_t read_lengths(const uint8_t* p, uint32_t avail, uint32_t sym_end, uint32_t A,
                           uint8_t* len) {
  if (sym_end == 0 || sym_end > A) return -1;
  for (uint32_t a = 0; a < sym_end; ++a) len[a] = 0;  // callers read len[0, sym_end) only
  uint32_t nn = 0, a = 0;
  const uint32_t max_nn = 2 * avail;
  auto get = [&](uint32_t* v) -> bool {
    if (nn >= max_nn) return false;
    *v = (p[nn >> 1] >> (4 * (nn & 1))) & 15;
    ++nn;
    return true;
  };
  while (a < sym_end) {
    uint32_t v;
    if (!get(&v)) return -1;
    if (v <= kMaxLen) {
      len[a++] = (uint8_t)v;
    } else if (v == 15) {
      uint32_t lo, hi;
      if (!get(&lo) || !get(&hi)) return -1;
      a += (lo | (hi << 4)) + 3;
    } else {
      return -1;
    }
  }
  if (a != sym_end || len[sym_end - 1] == 0) return -1;
  if ((nn & 1) && ((p[nn >> 1] >> 4) != 0)) return -1;  // padding nibble must be zero
  return (int32_t)((nn + 1) / 2);
}

// ---- raw planes ----------------------------------------------------------------------------
// Packed plane, group g of 8 elements: w bytes at g * w, the little-endian 8w-bit
// integer holding element 8g + k's packed value at bits [k w, k w + w).

}  // namespace ent
}  // namespace zipccl
