// "entropy" codec on the CPU: block encoder/decoder, rows, and the XLA FFI handlers
// (targets "zipccl_entropy_encode" / "zipccl_entropy_decode", platform "cpu").
//
// Format: docs/format.md ("Entropy codec (codec id 2)") and entropy_format.h. This
// file is the reference a CUDA port must reproduce byte for byte.
//
// Speed: a block's 8 bit streams are decoded interleaved (5 symbols per 64-bit
// refill, one 2048-entry table lookup per symbol), so the latency of one stream's
// lookup chain hides behind the others. Rows of >= kParallelMinElems elements are
// split across threads by whole blocks.
#include "entropy_cpu.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "cpu_parallel.h"

namespace zipccl {
namespace ent {
namespace cpu {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the CPU codec assumes a little-endian host");

// The block codecs are compiled twice: for the baseline ISA and with AVX2/BMI2
// (shlx/shrx instead of 3-uop variable shifts, wider vectors for the byte planes),
// chosen at run time (no -march flags: the module runs on any x86-64 or aarch64).
#define EZ_INLINE inline __attribute__((always_inline))
#if defined(__x86_64__)
#define EZ_X86 1
#define EZ_TARGET_FAST __attribute__((target("avx2,bmi,bmi2,lzcnt,popcnt")))
inline bool have_fast_isa() {
  static const bool v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") &&
                        std::getenv("ZIPCCL_DISABLE_SIMD") == nullptr;
  return v;
}
#endif

constexpr uint64_t kParallelMinElems = 1u << 20;  // below this one thread is faster
constexpr uint64_t kMinBlocksPerThread = 32;       // 128 K elements
constexpr uint32_t kMaxAreaBytes = kBlock * kMaxLen / 8;  // largest bit area of a block (5632)
constexpr uint32_t kSymsPerRefill = 5;  // 5 * 11 = 55 <= 57 bits valid after a refill

// A 16-bit store the compiler cannot merge with its neighbours (GCC otherwise
// assembles a refill's 5 stores into one 64-bit word with shifts and ORs: 4 extra
// instructions a symbol in the hottest loop).
inline void store16(uint16_t* p, uint32_t v) {
#if defined(__x86_64__) && defined(__GNUC__)
  asm("movw %w1, %0" : "=m"(*p) : "r"(v));
#else
  *p = (uint16_t)v;
#endif
}

// Hides a value's constness from the optimizer (keeps it in a register).
inline void opaque(uint32_t& v) {
#if defined(__GNUC__)
  asm("" : "+r"(v));
#endif
}

inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline void store_be64(uint8_t* p, uint64_t v) {
  v = __builtin_bswap64(v);
  std::memcpy(p, &v, 8);
}

// Checksum of the u32 words [w0, w1) of the row (byte offset 4 w).
inline uint64_t cs_words(const uint8_t* row, uint64_t w0, uint64_t w1) {
  uint64_t acc = 0;
  constexpr uint64_t kChunk = 1ull << 28;  // keeps i * w within 64 bits per chunk
  for (uint64_t a = w0; a < w1; a += kChunk) {
    const uint64_t c = std::min(kChunk, w1 - a);
    uint64_t s0 = 0, s1 = 0;
    const uint8_t* p = row + 4 * a;
    for (uint32_t i = 0; i < (uint32_t)c; ++i) {
      uint32_t w;
      std::memcpy(&w, p + 4 * (uint64_t)i, 4);
      s0 += w;
      s1 += (uint64_t)w * i;
    }
    acc += (2 * a + 1) * s0 + 2 * s1;
  }
  return acc;
}

template <DtypeCode D>
constexpr Traits traits() {
  return D == kBF16 ? Traits{8, 7} : Traits{5, 10};
}

// ---------------------------------------------------------------------------------
// Raw planes (entropy_format.h: byte plane, then the packed plane).

template <DtypeCode D, uint32_t K>
EZ_INLINE void write_raw(const uint16_t* x, uint32_t len, uint8_t* out) {
  constexpr Traits t = traits<D>();
  constexpr bool bp = (K == kKindE ? t.mbits + 1 : t.mbits) >= 8;
  constexpr uint32_t rw = K == kKindE ? t.mbits + 1 : t.mbits;
  constexpr uint32_t w = bp ? rw - 8 : rw;
  if (bp) {
    for (uint32_t j = 0; j < len; ++j) out[j] = (uint8_t)t.raw(K, x[j]);
    out += len;
  }
  if (w) {
    const uint32_t groups = (len + 7) / 8;
    for (uint32_t g = 0; g < groups; ++g) {
      uint64_t acc = 0;
      const uint32_t kend = std::min<uint32_t>(8, len - 8 * g);
      for (uint32_t k = 0; k < kend; ++k)
        acc |= (uint64_t)(t.raw(K, x[8 * g + k]) >> (bp ? 8 : 0)) << (k * w);
      for (uint32_t i = 0; i < w; ++i) out[g * w + i] = (uint8_t)(acc >> (8 * i));
    }
  }
}

// y[j] = sv[j] | the raw bits of element j, for j < len (sv may be y).
template <DtypeCode D, uint32_t K>
EZ_INLINE void or_raw(const uint8_t* in, uint32_t len, const uint16_t* sv, uint16_t* y) {
  constexpr Traits t = traits<D>();
  constexpr uint32_t rw = K == kKindE ? t.mbits + 1 : t.mbits;
  constexpr bool bp = rw >= 8;
  constexpr uint32_t w = bp ? rw - 8 : rw;
  const uint8_t* packed = in + (bp ? len : 0);
  if (!w) {
    for (uint32_t j = 0; j < len; ++j) y[j] = (uint16_t)(sv[j] | t.raw_bits(K, in[j]));
    return;
  }
  constexpr uint64_t mask = (1ull << w) - 1;
  const uint32_t groups = (len + 7) / 8;
  for (uint32_t g = 0; g < groups; ++g) {
    uint64_t acc = 0;
    std::memcpy(&acc, packed + g * w, w);
    const uint32_t kend = g + 1 < groups ? 8 : len - 8 * g;
    for (uint32_t k = 0; k < kend; ++k) {
      const uint32_t j = 8 * g + k;
      const uint32_t pv = (uint32_t)((acc >> (k * w)) & mask);
      const uint32_t r = bp ? (uint32_t)in[j] | (pv << 8) : pv;
      y[j] = (uint16_t)(sv[j] | t.raw_bits(K, r));
    }
  }
}

template <DtypeCode D>
EZ_INLINE void write_raw_kind(uint32_t kind, const uint16_t* x, uint32_t len, uint8_t* out) {
  if (kind == kKindE) write_raw<D, kKindE>(x, len, out);
  else write_raw<D, kKindJ>(x, len, out);
}

template <DtypeCode D>
EZ_INLINE void or_raw_kind(uint32_t kind, const uint8_t* in, uint32_t len, const uint16_t* sv,
                           uint16_t* y) {
  if (kind == kKindE) or_raw<D, kKindE>(in, len, sv, y);
  else or_raw<D, kKindJ>(in, len, sv, y);
}

// ---------------------------------------------------------------------------------
// Block encoder.

struct EncScratch {
  PMScratch pm;
  uint16_t sym[kBlock];              // J symbols (exponent << 1 | sign) of the block
  uint16_t cnt[4][kMaxAlphabet];     // histogram lanes (<= 1024 per lane)
  uint32_t c[2][kMaxAlphabet];       // [kind] counts
  uint8_t len[2][kMaxAlphabet];      // [kind] code lengths
  uint16_t code[kMaxAlphabet];
  uint32_t ccode[kMaxAlphabet];      // [J symbol] code (separate arrays: no unpacking
  uint8_t clen[kMaxAlphabet];        //  shifts in the writer's loop)
  uint8_t bits[kMaxAreaBytes + 64];  // bit streams before they are copied into place
};

// Encodes one block into out (at most max_block_bytes(len) bytes, exactly the
// returned size written). *raw = the block was stored RAW.
template <DtypeCode D>
EZ_INLINE uint32_t encode_block_impl(const uint16_t* x, uint32_t len, uint8_t* out, EncScratch& s,
                                     bool* raw) {
  constexpr Traits t = traits<D>();
  constexpr uint32_t AJ = 1u << (t.ebits + 1), AE = 1u << t.ebits;
  for (int l = 0; l < 4; ++l) std::memset(s.cnt[l], 0, sizeof(uint16_t) * AJ);
  // Symbols first (a vectorizable pass), then counts in 4 lanes (a run of equal
  // symbols would otherwise serialize on one counter's store-to-load latency).
  for (uint32_t j = 0; j < len; ++j) s.sym[j] = (uint16_t)t.symbol(kKindJ, x[j]);
  uint32_t j = 0;
  for (; j + 4 <= len; j += 4) {
    s.cnt[0][s.sym[j]]++;
    s.cnt[1][s.sym[j + 1]]++;
    s.cnt[2][s.sym[j + 2]]++;
    s.cnt[3][s.sym[j + 3]]++;
  }
  for (; j < len; ++j) s.cnt[0][s.sym[j]]++;
  for (uint32_t a = 0; a < AJ; ++a) s.c[kKindJ][a] = (uint32_t)s.cnt[0][a] + s.cnt[1][a] + s.cnt[2][a] + s.cnt[3][a];
  for (uint32_t e = 0; e < AE; ++e) s.c[kKindE][e] = s.c[kKindJ][2 * e] + s.c[kKindJ][2 * e + 1];

  // Candidate sizes in the tie order CONST-E, CONST-J, HUFF-E, HUFF-J, RAW.
  uint32_t best = max_block_bytes(len);
  int best_kind = -1;  // -1 = RAW
  bool best_const = false;
  uint32_t sym_end[2] = {0, 0}, nib[2] = {0, 0}, area[2] = {0, 0}, one_sym[2] = {0, 0};
  for (uint32_t kind = 0; kind < 2; ++kind) {
    const uint32_t A = kind == kKindE ? AE : AJ;
    for (uint32_t a = A; a-- > 0;)
      if (s.c[kind][a]) {
        sym_end[kind] = a + 1;
        break;
      }
    one_sym[kind] = sym_end[kind] - 1;
  }
  // Kind J can only pay when the sign is predictable from the exponent: the sign
  // costs at least 1 - |1 - 2p| bits, so J saves at most sum_e |c+ - c-| bits. It
  // is tried when 16 * that imbalance >= len (format rule; skipping package-merge
  // for J halves the code-length work on symmetric data).
  uint32_t imb = 0;
  for (uint32_t e = 0; e < AE; ++e) {
    const int32_t d = (int32_t)s.c[kKindJ][2 * e] - (int32_t)s.c[kKindJ][2 * e + 1];
    imb += (uint32_t)(d < 0 ? -d : d);
  }
  uint32_t k[2];
  k[kKindE] = code_lengths(s.c[kKindE], sym_end[kKindE], s.len[kKindE], &s.pm);
  if (16 * imb >= len) {
    k[kKindJ] = code_lengths(s.c[kKindJ], sym_end[kKindJ], s.len[kKindJ], &s.pm);
  } else {
    k[kKindJ] = 0;
    for (uint32_t a = 0; a < sym_end[kKindJ]; ++a) k[kKindJ] += s.c[kKindJ][a] != 0;
    if (k[kKindJ] >= 2) k[kKindJ] = 0;  // not a HUFF-J candidate (and not CONST-J)
  }
  uint32_t size[4] = {~0u, ~0u, ~0u, ~0u};
  for (uint32_t kind = 0; kind < 2; ++kind)
    if (k[kind] == 1) size[kind] = kBlockHead + t.raw_bytes(kind, len);
  for (uint32_t kind = 0; kind < 2; ++kind) {
    if (k[kind] < 2) continue;
    uint64_t bits = 0;
    for (uint32_t a = 0; a < sym_end[kind]; ++a) bits += (uint64_t)s.c[kind][a] * s.len[kind][a];
    nib[kind] = write_lengths(s.len[kind], sym_end[kind], nullptr);
    area[kind] = (uint32_t)((bits + 7) / 8);
    size[2 + kind] = kHuffHead + nib[kind] + area[kind] + t.raw_bytes(kind, len);
  }
  for (int c = 0; c < 4; ++c)
    if (size[c] < best) {
      best = size[c];
      best_kind = c & 1;
      best_const = c < 2;
    }

  if (best_kind < 0) {  // RAW: the words verbatim
    *raw = true;
    std::memset(out, 0, kBlockHead);
    std::memcpy(out + kBlockHead, x, 2 * (size_t)len);
    return best;
  }
  *raw = false;
  const uint32_t kind = (uint32_t)best_kind;
  if (best_const) {
    out[0] = (uint8_t)(kConst | (kind << 2));
    out[1] = 0;
    st16(out + 2, one_sym[kind]);
    write_raw_kind<D>(kind, x, len, out + kBlockHead);
    return best;
  }
  out[0] = (uint8_t)(kHuff | (kind << 2));
  out[1] = 0;
  st16(out + 2, sym_end[kind]);
  uint8_t* nib_out = out + kHuffHead;
  write_lengths(s.len[kind], sym_end[kind], nib_out);
  canonical_codes(s.len[kind], sym_end[kind], s.code);
  // Indexed by the J symbol (s.sym) for both kinds (entries of absent symbols are
  // never read).
  const uint32_t jend = kind == kKindE ? 2 * sym_end[kind] : sym_end[kind];
  for (uint32_t a = 0; a < jend; ++a) {
    const uint32_t c = kind == kKindE ? a >> 1 : a;
    s.ccode[a] = s.code[c];
    s.clen[a] = s.len[kind][c];
  }

  // One MSB-first writer for the 8 streams back to back; a flush after every <= 5
  // codes (<= 55 bits + < 8 pending bits fit the 64-bit accumulator).
  uint8_t* bp = s.bits;
  uint64_t acc = 0;
  uint32_t nacc = 0;
  uint32_t before = 0;
  for (uint32_t st = 0; st < kStreams; ++st) {
    const uint32_t j0 = std::min(st * kStreamLen, len), j1 = std::min(j0 + kStreamLen, len);
    uint32_t jj = j0;
    auto push = [&](uint32_t idx) {
      const uint32_t a = s.sym[idx];
      const uint32_t l = s.clen[a];
      acc = (acc << l) | s.ccode[a];
      nacc += l;
    };
    auto flush = [&]() {
      store_be64(bp, acc << (64 - nacc));
      bp += nacc >> 3;
      nacc &= 7;
    };
    for (; jj + kSymsPerRefill <= j1; jj += kSymsPerRefill) {
      for (uint32_t i = 0; i < kSymsPerRefill; ++i) push(jj + i);
      flush();
    }
    for (; jj < j1; ++jj) {
      push(jj);
      flush();
    }
    const uint32_t now = (uint32_t)(bp - s.bits) * 8 + nacc;
    st16(out + kBlockHead + 2 * st, now - before);
    before = now;
  }
  if (nacc) store_be64(bp, acc << (64 - nacc));
  uint8_t* area_out = nib_out + nib[kind];
  std::memcpy(area_out, s.bits, area[kind]);
  write_raw_kind<D>(kind, x, len, area_out + area[kind]);
  return best;
}

// ---------------------------------------------------------------------------------
// Block decoder.

struct DecScratch {
  uint8_t len[kMaxAlphabet];
  uint16_t code[kMaxAlphabet];
  uint32_t tab[kTableSize];  // sym_bits << 16 | code length
  uint8_t area[kMaxAreaBytes + kStreamLen * kMaxLen / 8 + 8];
  uint16_t sv[kBlock];       // decoded symbol values (L1), merged with the raw planes into y
};

// Decodes one block of `size` bytes at blk (avail = readable bytes from blk on,
// >= size) into y[0, len). Returns a DecodeStatus (6 or 7 on a bad block).
template <DtypeCode D, bool Fast>
EZ_INLINE int32_t decode_block_impl(const uint8_t* blk, uint32_t size, uint64_t avail, uint32_t len,
                                    uint16_t* y, DecScratch& s) {
  constexpr Traits t = traits<D>();
  if (size < kBlockHead || blk[1] != 0) return kDecBadTable;
  const uint32_t mode = blk[0];
  const uint32_t coding = mode & 3, kind = mode >> 2;
  if (coding == kRaw) {
    if (mode != 0 || ld16(blk + 2) != 0 || size != max_block_bytes(len)) return kDecBadTable;
    std::memcpy(y, blk + kBlockHead, 2 * (size_t)len);
    return kDecOk;
  }
  if (kind > 1 || coding > kHuff) return kDecBadTable;
  const uint32_t A = t.alphabet(kind);
  const uint32_t rawb = t.raw_bytes(kind, len);
  if (coding == kConst) {
    const uint32_t sym = ld16(blk + 2);
    if (sym >= A || size != kBlockHead + rawb) return kDecBadTable;
    const uint16_t v = (uint16_t)t.sym_bits(kind, sym);
    for (uint32_t j = 0; j < len; ++j) y[j] = v;
    or_raw_kind<D>(kind, blk + kBlockHead, len, y, y);
    return kDecOk;
  }
  // HUFF.
  if (size < kHuffHead + rawb) return kDecBadTable;
  const uint32_t sym_end = ld16(blk + 2);
  const int32_t nib = read_lengths(blk + kHuffHead, size - kHuffHead - rawb, sym_end, A, s.len);
  if (nib < 0 || !canonical_codes(s.len, sym_end, s.code)) return kDecBadTable;
  uint32_t start[kStreams + 1];
  start[0] = 0;
  for (uint32_t st = 0; st < kStreams; ++st) {
    const uint32_t j0 = std::min(st * kStreamLen, len), j1 = std::min(j0 + kStreamLen, len);
    const uint32_t cnt = j1 - j0, b = ld16(blk + kBlockHead + 2 * st);
    if (b < cnt || b > kMaxLen * cnt) return kDecBadTable;
    start[st + 1] = start[st] + b;
  }
  const uint32_t total = start[kStreams];
  const uint32_t ab = (total + 7) / 8;
  const uint32_t area_off = kHuffHead + (uint32_t)nib;
  if (size != area_off + ab + rawb) return kDecBadTable;
  // Padding bits after the last code (the low bits of the last byte) are zero.
  if ((total & 7) && (blk[area_off + ab - 1] & ((1u << (8 - (total & 7))) - 1))) return kDecBadStream;

  // Entry = the symbol's value bits << 16 | code length: a 64-bit shift by the
  // whole entry shifts by the length (shift counts are taken mod 64), and the
  // lengths of a refill's 5 symbols are the low 16 bits of their entries' sum.
  for (uint32_t a = 0; a < sym_end; ++a) {
    const uint32_t l = s.len[a];
    if (!l) continue;
    const uint32_t e = (t.sym_bits(kind, a) << 16) | l;
    uint32_t* dst = s.tab + ((uint32_t)s.code[a] << (kMaxLen - l));
    const uint32_t cnt = 1u << (kMaxLen - l);
    for (uint32_t i = 0; i < cnt; ++i) dst[i] = e;
  }
  // Reads take 8 bytes at p + bitpos / 8. A stream decodes at most kStreamLen codes
  // of <= kMaxLen bits from its start (<= T), so even a corrupt one reads inside
  // p[0, ab + kOverrun); when the buffer ends sooner (the row's last blocks) the
  // area is decoded from a zero-padded copy.
  constexpr uint32_t kOverrun = kStreamLen * kMaxLen / 8 + 8;
  const uint8_t* p = blk + area_off;
  if ((uint64_t)area_off + ab + kOverrun > avail) {
    std::memcpy(s.area, p, ab);
    std::memset(s.area + ab, 0, kOverrun);
    p = s.area;
  }
  const uint32_t* tab = s.tab;
  auto refill = [p](uint32_t q) -> uint64_t { return __builtin_bswap64(load64(p + (q >> 3))) << (q & 7); };
  // The index shift count lives in a register so that BMI2 code shifts with one
  // non-destructive shrx instead of mov + shr.
  uint32_t top = 64 - kMaxLen;
  if (Fast) opaque(top);
  uint32_t pos[kStreams];
  for (uint32_t st = 0; st < kStreams; ++st) pos[st] = start[st];
  uint32_t done = 0;  // symbols decoded per stream so far (full blocks)
  if (len == kBlock) {
    constexpr uint32_t rounds = kStreamLen / kSymsPerRefill;
    for (uint32_t r = 0; r < rounds; ++r) {
      uint16_t* yr = s.sv + r * kSymsPerRefill;
#pragma GCC unroll 8
      for (uint32_t st = 0; st < kStreams; ++st) {
        const uint32_t q = pos[st];
        uint64_t buf = refill(q);
        uint32_t sum = 0;
#pragma GCC unroll 5
        for (uint32_t i = 0; i < kSymsPerRefill; ++i) {
          const uint32_t e = tab[buf >> top];
          buf <<= (e & 63);
          sum += e;
          store16(yr + st * kStreamLen + i, e >> 16);
        }
        pos[st] = q + (sum & 0xFFFF);
      }
    }
    done = rounds * kSymsPerRefill;
  }
  for (uint32_t st = 0; st < kStreams; ++st) {
    const uint32_t j0 = std::min(st * kStreamLen, len), j1 = std::min(j0 + kStreamLen, len);
    uint32_t q = pos[st];
    for (uint32_t jj = j0 + done; jj < j1; ++jj) {
      const uint32_t e = tab[refill(q) >> (64 - kMaxLen)];
      q += e & 15;
      s.sv[jj] = (uint16_t)(e >> 16);
    }
    if (q != start[st + 1]) return kDecBadStream;
  }
  or_raw_kind<D>(kind, blk + area_off + ab, len, s.sv, y);
  return kDecOk;
}

// ---------------------------------------------------------------------------------
// ISA dispatch.

template <DtypeCode D>
uint32_t encode_block_base(const uint16_t* x, uint32_t len, uint8_t* out, EncScratch& s, bool* raw) {
  return encode_block_impl<D>(x, len, out, s, raw);
}
template <DtypeCode D>
int32_t decode_block_base(const uint8_t* blk, uint32_t size, uint64_t avail, uint32_t len, uint16_t* y,
                          DecScratch& s) {
  return decode_block_impl<D, false>(blk, size, avail, len, y, s);
}
#if EZ_X86
template <DtypeCode D>
EZ_TARGET_FAST uint32_t encode_block_fast(const uint16_t* x, uint32_t len, uint8_t* out, EncScratch& s,
                                          bool* raw) {
  return encode_block_impl<D>(x, len, out, s, raw);
}
template <DtypeCode D>
EZ_TARGET_FAST int32_t decode_block_fast(const uint8_t* blk, uint32_t size, uint64_t avail, uint32_t len,
                                         uint16_t* y, DecScratch& s) {
  return decode_block_impl<D, true>(blk, size, avail, len, y, s);
}
#endif

template <DtypeCode D>
uint32_t encode_block(const uint16_t* x, uint32_t len, uint8_t* out, EncScratch& s, bool* raw) {
#if EZ_X86
  if (have_fast_isa()) return encode_block_fast<D>(x, len, out, s, raw);
#endif
  return encode_block_base<D>(x, len, out, s, raw);
}
template <DtypeCode D>
int32_t decode_block(const uint8_t* blk, uint32_t size, uint64_t avail, uint32_t len, uint16_t* y,
                     DecScratch& s) {
#if EZ_X86
  if (have_fast_isa()) return decode_block_fast<D>(blk, size, avail, len, y, s);
#endif
  return decode_block_base<D>(blk, size, avail, len, y, s);
}

// ---------------------------------------------------------------------------------
// Rows.

template <DtypeCode D>
RowStats encode_row_t(const uint16_t* x, uint64_t n, uint8_t* out) {
  const uint64_t nb = num_blocks(n);
  const uint64_t doff = data_offset(n);
  const uint64_t maxb = max_nbytes(D, n);
  std::memset(out, 0, doff);
  const int nt = n >= kParallelMinElems ? par::threads_for(nb, kMinBlocksPerThread) : 1;
  std::vector<uint64_t> tb(nt + 1), tbytes(nt, 0), traw(nt, 0);
  for (int t = 0; t <= nt; ++t) tb[t] = nb * (uint64_t)t / (uint64_t)nt;
  // Thread 0 writes in place and checksums its blocks while they are in cache;
  // the others write at their worst-case offsets and are moved down afterwards.
  uint64_t cs = 0, cs_end_word = doff / 4;
  par::parallel_for(nt, [&](int t) {
    std::unique_ptr<EncScratch> s(new EncScratch);
    uint8_t* base = out + doff + tb[t] * (uint64_t)max_block_bytes(kBlock);
    uint64_t off = 0, raws = 0;
    for (uint64_t b = tb[t]; b < tb[t + 1]; ++b) {
      const uint32_t len = block_len(n, b);
      bool raw = false;
      const uint32_t sz = encode_block<D>(x + b * kBlock, len, base + off, *s, &raw);
      st16(out + kHeaderBytes + 2 * b, sz);
      off += sz;
      raws += raw;
      if (t == 0) {
        const uint64_t w1 = (doff + off) / 4;
        cs += cs_words(out, cs_end_word, w1);
        cs_end_word = w1;
      }
    }
    tbytes[t] = off;
    traw[t] = raws;
  });
  uint64_t pos = doff + tbytes[0], raws = traw[0];
  for (int t = 1; t < nt; ++t) {
    std::memmove(out + pos, out + doff + tb[t] * (uint64_t)max_block_bytes(kBlock), tbytes[t]);
    pos += tbytes[t];
    raws += traw[t];
  }
  const uint64_t used = align128(pos);
  std::memset(out + pos, 0, maxb - pos);
  // The rest of the checksum: the moved blocks and the padding (parallel), then the
  // header and directory.
  const uint64_t wrest = used / 4 - cs_end_word;
  const int nc = nt > 1 ? nt : 1;
  std::vector<uint64_t> part(nc, 0);
  par::parallel_for(nc, [&](int t) {
    const uint64_t a = cs_end_word + wrest * t / nc, b = cs_end_word + wrest * (t + 1) / nc;
    part[t] = cs_words(out, a, b);
  });
  for (int t = 0; t < nc; ++t) cs += part[t];
  st32(out + kOffMagic, kMagic);
  out[kOffVersion] = kVersion;
  out[kOffDtype] = (uint8_t)D;
  out[kOffCodec] = kCodecId;
  out[kOffStatus] = 0;
  st64(out + kOffN, n);
  st64(out + kOffUsed, used);
  out[kOffBlockLog2] = (uint8_t)kBlockLog2;
  out[kOffStreams] = (uint8_t)kStreams;
  out[kOffMaxLen] = (uint8_t)kMaxLen;
  st32(out + kOffRawBlocks, (uint32_t)raws);
  st64(out + kOffNumBlocks, nb);
  st64(out + kOffDataBytes, pos - doff);
  cs += cs_words(out, 0, doff / 4);  // checksum field is still zero here
  st64(out + kOffChecksum, cs);
  return RowStats{0, raws, used};
}

template <DtypeCode D>
int32_t decode_row_t(const uint8_t* in, uint64_t L, uint64_t n, uint16_t* y) {
  if (L < kHeaderBytes) return kDecBadSize;
  if (ld32(in + kOffMagic) != kMagic || in[kOffVersion] != kVersion || in[kOffCodec] != kCodecId)
    return kDecBadMagic;
  if (in[kOffDtype] != (uint8_t)D) return kDecBadDtype;
  const uint64_t used = ld64(in + kOffUsed);
  if (ld64(in + kOffN) != n || used % kAlign || used > L || used < min_nbytes(D, n) ||
      used > max_nbytes(D, n))
    return kDecBadSize;
  if (in[kOffStatus] == 1) return kDecNotDecodable;
  const uint64_t nb = num_blocks(n), doff = data_offset(n);
  const uint64_t data_bytes = ld64(in + kOffDataBytes);
  const uint64_t raw_blocks = ld32(in + kOffRawBlocks);
  bool ok = in[kOffStatus] == 0 && in[kOffBlockLog2] == kBlockLog2 && in[kOffStreams] == kStreams &&
            in[kOffMaxLen] == kMaxLen && in[35] == 0 && ld64(in + kOffNumBlocks) == nb &&
            raw_blocks <= nb && data_bytes <= used - doff && align128(doff + data_bytes) == used;
  for (uint32_t i = kHeaderUsed; i < kHeaderBytes && ok; ++i) ok = in[i] == 0;
  if (!ok) return kDecBadHeader;
  // Directory: block offsets, sizes within [4, max], their sum, the RAW count.
  std::vector<uint64_t> off(nb + 1);
  off[0] = doff;
  for (uint64_t b = 0; b < nb; ++b) {
    const uint32_t sz = ld16(in + kHeaderBytes + 2 * b);
    if (sz < kBlockHead || sz > max_block_bytes(block_len(n, b))) return kDecBadTable;
    off[b + 1] = off[b] + sz;
    if (off[b + 1] > doff + data_bytes) return kDecBadTable;
  }
  if (off[nb] != doff + data_bytes) return kDecBadTable;

  const int nt = n >= kParallelMinElems ? par::threads_for(nb, kMinBlocksPerThread) : 1;
  std::vector<int32_t> tstat(nt, kDecOk);
  std::vector<uint64_t> tcs(nt, 0), traws(nt, 0);
  par::parallel_for(nt, [&](int t) {
    std::unique_ptr<DecScratch> s(new DecScratch);
    const uint64_t b0 = nb * (uint64_t)t / nt, b1 = nb * (uint64_t)(t + 1) / nt;
    uint64_t acc = 0, raws = 0;
    int32_t worst = kDecOk;
    for (uint64_t b = b0; b < b1; ++b) {
      raws += in[off[b]] == 0;
      const int32_t st = decode_block<D>(in + off[b], (uint32_t)(off[b + 1] - off[b]), L - off[b],
                                         block_len(n, b), y + b * kBlock, *s);
      if (st != kDecOk && (worst == kDecOk || st < worst)) worst = st;
      if (worst == kDecBadTable) break;  // nothing reports lower
      // Checksum words [off_b / 4, off_b+1 / 4); the last block runs to used.
      const uint64_t w1 = (b + 1 == nb) ? used / 4 : off[b + 1] / 4;
      acc += cs_words(in, off[b] / 4, w1);
    }
    tstat[t] = worst;
    tcs[t] = acc;
    traws[t] = raws;
  });
  // The RAW count is a directory-level check (status 6), made here so that the
  // block starts are read while decoding rather than in a separate pass.
  uint64_t raws = 0;
  int32_t worst = kDecOk;
  for (int t = 0; t < nt; ++t) {
    raws += traws[t];
    if (tstat[t] != kDecOk && (worst == kDecOk || tstat[t] < worst)) worst = tstat[t];
  }
  if (raws != raw_blocks) return kDecBadTable;
  if (worst != kDecOk) return worst;
  uint64_t cs = 0;
  for (int t = 0; t < nt; ++t) cs += tcs[t];
  cs += cs_words(in, 0, kOffChecksum / 4) + cs_words(in, kOffChecksum / 4 + 2, doff / 4);
  if (nb == 0) cs += cs_words(in, doff / 4, used / 4);
  if (cs != ld64(in + kOffChecksum)) return kDecBadChecksum;
  return kDecOk;
}

}  // namespace

RowStats encode_row(DtypeCode d, const uint16_t* x, uint64_t n, uint8_t* out) {
  return d == kBF16 ? encode_row_t<kBF16>(x, n, out) : encode_row_t<kF16>(x, n, out);
}

int32_t decode_row(DtypeCode d, const uint8_t* in, uint64_t nbytes, uint64_t n, uint16_t* y) {
  const int32_t st = d == kBF16 ? decode_row_t<kBF16>(in, nbytes, n, y) : decode_row_t<kF16>(in, nbytes, n, y);
  if (st != kDecOk) std::memset(y, 0xFF, 2 * n);
  return st;
}

}  // namespace cpu
}  // namespace ent
}  // namespace zipccl

// ---------------------------------------------------------------------------------
// XLA FFI handlers. x [..., n] -> payload u8 [..., max_nbytes], stats s32 [..., 4] =
// (status, raw blocks, used_nbytes / 128, 0), workspace u8 [..., W] (unused on the
// CPU). Decode: payload u8 [..., L] -> y [..., n], status s32 [...], workspace.

namespace ffi = xla::ffi;

namespace {

namespace zent = zipccl::ent;

bool ent_dtype(ffi::DataType t, zent::DtypeCode* d) {
  switch (t) {
    case ffi::DataType::BF16: *d = zent::kBF16; return true;
    case ffi::DataType::F16: *d = zent::kF16; return true;
    default: return false;
  }
}

void split_dims(ffi::Span<const int64_t> dims, uint64_t* rows, uint64_t* last) {
  uint64_t r = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) r *= (uint64_t)dims[i];
  *rows = r;
  *last = dims.size() == 0 ? 1 : (uint64_t)dims[dims.size() - 1];
}

std::string str(uint64_t v) { return std::to_string(v); }

// XLA:CPU allocates outputs afresh per call; ask for transparent huge pages on the
// 2 MiB-aligned interior of large outputs (as ffi/codec_cpu.cc does, same reason:
// first-touch page faults cost more than the codec). ZIPCCL_NO_HUGEPAGES=1: off.
void advise_hugepages(void* p, uint64_t nbytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uint64_t kHuge = 2ull << 20;
  if (nbytes < 4 * kHuge) return;
  static const bool off = std::getenv("ZIPCCL_NO_HUGEPAGES") != nullptr;
  if (off) return;
  const uint64_t a = ((uint64_t)p + kHuge - 1) & ~(kHuge - 1);
  const uint64_t b = ((uint64_t)p + nbytes) & ~(kHuge - 1);
  if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_HUGEPAGE);
#endif
}

ffi::Error EntropyEncodeImpl(ffi::AnyBuffer x, ffi::Result<ffi::Buffer<ffi::U8>> payload,
                             ffi::Result<ffi::Buffer<ffi::S32>> stats,
                             ffi::Result<ffi::Buffer<ffi::U8>> workspace) {
  zent::DtypeCode d;
  if (!ent_dtype(x.element_type(), &d))
    return ffi::Error::InvalidArgument("zipccl_entropy_encode: x must be bfloat16 or float16");
  uint64_t rows, n, prow, nbytes, srow, four;
  split_dims(x.dimensions(), &rows, &n);
  split_dims(payload->dimensions(), &prow, &nbytes);
  split_dims(stats->dimensions(), &srow, &four);
  if (n >= (1ull << 32))
    return ffi::Error::InvalidArgument("zipccl_entropy_encode: rows of >= 2^32 elements are not supported");
  const uint64_t want = zent::max_nbytes(d, n);
  if (prow != rows || nbytes != want)
    return ffi::Error::InvalidArgument("zipccl_entropy_encode: payload must be [" + str(rows) + ", " +
                                       str(want) + "] bytes, got [" + str(prow) + ", " + str(nbytes) + "]");
  if (srow != rows || four != 4)
    return ffi::Error::InvalidArgument("zipccl_entropy_encode: stats must be [" + str(rows) + ", 4]");
  const uint16_t* xw = static_cast<const uint16_t*>(x.untyped_data());
  uint8_t* out = payload->typed_data();
  advise_hugepages(out, rows * nbytes);
  int32_t* st = stats->typed_data();
  for (uint64_t r = 0; r < rows; ++r) {
    const zent::cpu::RowStats s = zent::cpu::encode_row(d, xw + r * n, n, out + r * nbytes);
    st[4 * r] = s.status;
    st[4 * r + 1] = (int32_t)std::min<uint64_t>(s.raw_blocks, 0x7FFFFFFF);
    st[4 * r + 2] = (int32_t)std::min<uint64_t>(s.used / zent::kAlign, 0x7FFFFFFF);
    st[4 * r + 3] = 0;
  }
  return ffi::Error::Success();
}

ffi::Error EntropyDecodeImpl(ffi::Buffer<ffi::U8> payload, ffi::Result<ffi::AnyBuffer> y,
                             ffi::Result<ffi::Buffer<ffi::S32>> status,
                             ffi::Result<ffi::Buffer<ffi::U8>> workspace) {
  zent::DtypeCode d;
  if (!ent_dtype(y->element_type(), &d))
    return ffi::Error::InvalidArgument("zipccl_entropy_decode: output must be bfloat16 or float16");
  uint64_t rows, nbytes, yrows, n;
  split_dims(payload.dimensions(), &rows, &nbytes);
  split_dims(y->dimensions(), &yrows, &n);
  if (yrows != rows)
    return ffi::Error::InvalidArgument("zipccl_entropy_decode: payload has " + str(rows) +
                                       " rows but the output has " + str(yrows));
  if (status->element_count() != (size_t)rows)
    return ffi::Error::InvalidArgument("zipccl_entropy_decode: status must have one entry per row");
  if (n >= (1ull << 32))
    return ffi::Error::InvalidArgument("zipccl_entropy_decode: rows of >= 2^32 elements are not supported");
  const uint8_t* in = payload.typed_data();
  uint16_t* yw = static_cast<uint16_t*>(y->untyped_data());
  advise_hugepages(yw, rows * n * 2);
  int32_t* st = status->typed_data();
  for (uint64_t r = 0; r < rows; ++r) st[r] = zent::cpu::decode_row(d, in + r * nbytes, nbytes, n, yw + r * n);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEntropyEncodeCpu, EntropyEncodeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()         // x [..., n]
                                  .Ret<ffi::Buffer<ffi::U8>>()   // payload [..., max_nbytes]
                                  .Ret<ffi::Buffer<ffi::S32>>()  // stats [..., 4]
                                  .Ret<ffi::Buffer<ffi::U8>>()); // workspace [..., W]

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEntropyDecodeCpu, EntropyDecodeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U8>>()   // payload [..., L]
                                  .Ret<ffi::AnyBuffer>()         // y [..., n]
                                  .Ret<ffi::Buffer<ffi::S32>>()  // status [...]
                                  .Ret<ffi::Buffer<ffi::U8>>()); // workspace [..., W]
