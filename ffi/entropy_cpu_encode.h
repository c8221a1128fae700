// Part of the CPU entropy codec (entropy_cpu.cc, the only file that includes it): the
// block encoder (histograms, package-merge code lengths, canonical codes, the bit
// streams and the choice of block kind; entropy_format.h is normative).
#pragma once

#include "entropy_cpu_kindz.h"
#include "entropy_cpu_planes.h"
#include "entropy_cpu_lengths.h"  // code_lengths_pick
#include "entropy_cpu_pairs.h"  // the pair path (AVX2)

namespace zipccl {
namespace ent {
namespace cpu {
namespace {

// True when no element of x[0, len) is a subnormal ((v & 0x7FFF) in [1, 2^M)): the
// smallest (|v| - 1) mod 2^16 (zeros wrap to 0xFFFF) is >= 2^M - 1. Min reductions
// that the compiler vectorizes (AVX2 in the fast build), 512 elements each, so that
// a block with subnormals (small fp16 activations: a few a block) stops early;
// called only for blocks whose smallest |v| is 0.
template <uint32_t M>
EZ_INLINE bool no_subnormal(const uint16_t* x, uint32_t len) {
  for (uint32_t j0 = 0; j0 < len; j0 += 512) {
    const uint32_t j1 = j0 + 512 < len ? j0 + 512 : len;
    uint16_t mn = 0xFFFF;
    for (uint32_t j = j0; j < j1; ++j) {
      const uint16_t a = (uint16_t)((x[j] & 0x7FFF) - 1);
      mn = a < mn ? a : mn;
    }
    if (mn < (1u << M) - 1) return false;
  }
  return true;
}

struct EncScratch {
  PMFast pm;
  // Elements are indexed by u = v >> L = sign << (E + q) | c (the word's top
  // bits: one shift a 16-element vector; c = the coded exponent, L = M - q,
  // entropy_format.h Traits; "e" below is c), not by the J symbol c << 1 | s: the
  // histogram and the code tables take u and the counts are permuted into
  // symbol order once per block (2 x 256 values), not per element.
  uint16_t sym[kBlock];              // u of every element of the block
  uint16_t cnt[4][kMaxAlphabet];     // histogram lanes over u (<= 1024 per lane); zero between blocks
  uint16_t half[2][kMaxAlphabet / 2 + 16];  // [sign] lane sums by exponent
  uint32_t c[2][kMaxAlphabet];       // [kind] counts by symbol
  uint8_t len[2][kMaxAlphabet];      // [kind] code lengths
  uint8_t nibs[2][kMaxAlphabet / 2 + 8];  // [kind] code-length nibble stream
  uint64_t ccode[kMaxAlphabet];      // [u] code (u64: OR-ed from memory)
  uint8_t clen[kMaxAlphabet];        // [u] code length
  uint8_t bits[kMaxAreaBytes + 64];  // bit streams before they are copied into place
  uint8_t bits2[kMaxAreaBytes / 2 + 64];  // streams 4..7 of a full block (second writer)
  uint16_t pidx[kBlock / 2];         // pair writer: kind E table indices of the block (pe)
  uint16_t pbin[kBlock / 2];         // pair histogram bins of the block (ps)
  uint16_t pcnt[64 * 64];            // pair histogram; zero between blocks
  uint64_t pcode[64 * 64];           // pair writer: codes of symbol pairs (pair_table_fast)
  uint8_t plen[64 * 64];             // pair writer: their total lengths (bits)
  // Prefetch targets for the histogram pass (see encode_row_t): the input of a
  // later block and the output bytes a later block will write (kPfBytes each).
  const uint8_t* pf_in;
  uint8_t* pf_out;
};

// An MSB-first bit writer: codes are shifted into a 64-bit accumulator and
// counted; a flush after every <= 5 codes (<= 55 bits + < 8 pending bits fit)
// stores the pending bits at the top of 8 big-endian bytes and advances by
// whole bytes. The flush only reads acc (the bits above the pending ones shift
// out of the stored word), so the accumulator's dependency chain is one shift
// and one OR a code.
struct BitWriter {
  uint64_t acc;
  uint32_t nacc;
  uint8_t* bp;
  EZ_INLINE void init(uint8_t* p) {
    acc = 0;
    nacc = 0;
    bp = p;
  }
  EZ_INLINE void flush() {
    store_be64(bp, acc << (63 - nacc) << 1);  // two shifts: nacc may be 0
    bp += nacc >> 3;
    nacc &= 7;
  }
  // Bits written since p (the init pointer).
  EZ_INLINE uint32_t bits_since(const uint8_t* p) const { return (uint32_t)(bp - p) * 8 + nacc; }
};

// Appends the nbits bits of src (MSB first from src[0]; src readable and zero
// for 16 bytes past nbits / 8) at bit `at` of dst, whose bits past `at` are
// zero. Writes bytes [at / 8, at / 8 + 8 * ceil((at % 8 + nbits) / 64)).
EZ_INLINE void append_bits(uint8_t* dst, uint32_t at, const uint8_t* src, uint32_t nbits) {
  uint8_t* d = dst + at / 8;
  const uint32_t sh = at & 7;
  const uint32_t nbytes = (sh + nbits + 7) / 8;
  if (!sh) {
    std::memcpy(d, src, (nbits + 7) / 8);
    return;
  }
  uint64_t carry = (uint64_t)d[0] << 56;  // the high sh bits of d[0] are dst's
  for (uint32_t i = 0; i < nbytes; i += 8) {
    const uint64_t w = __builtin_bswap64(load64(src + i));
    store_be64(d + i, carry | (w >> sh));
    carry = w << (64 - sh);
  }
}

// Two bit writers (streams 0..3 into one buffer, 4..7 into another) have ended
// stream st and st + kStreams / 2 at bit positions P_a and P_b: their bit lengths
// go into the block header, and the next streams start there.
EZ_INLINE void end_stream_pair(uint8_t* out, uint32_t st, uint32_t P_a, uint32_t P_b, uint32_t* before_a,
                               uint32_t* before_b) {
  st16(out + kBlockHead + 2 * st, P_a - *before_a);
  st16(out + kBlockHead + 2 * (st + kStreams / 2), P_b - *before_b);
  *before_a = P_a;
  *before_b = P_b;
}

// Joins the two writers' areas: bits_b's bits_b_n bits (its writer ended at bit P_b)
// after bits_a's bits_a_n. Returns the total bits. The writers' last flush stored 8
// bytes from its start byte (zeros after the pending bits); 16 more zero bytes from
// P_b / 8 + 8 cover append_bits' word reads.
EZ_INLINE uint32_t join_writers(uint8_t* bits_a, uint32_t bits_a_n, uint8_t* bits_b, uint32_t P_b,
                                uint32_t bits_b_n) {
  std::memset(bits_b + (P_b >> 3) + 8, 0, 16);
  append_bits(bits_a, bits_a_n, bits_b, bits_b_n);
  return bits_a_n + bits_b_n;
}

// Encodes one block into out (at most max_block_bytes(len) bytes, exactly the
// returned size written). *raw = the block was stored RAW.
template <DtypeCode D, bool Fast>
EZ_INLINE uint32_t encode_block_impl(const uint16_t* x, uint32_t len, uint8_t* out, EncScratch& s,
                                     bool* raw) {
  constexpr Traits t = traits<D>();
  constexpr uint32_t AE = 1u << t.cbits();  // kind E alphabet (coded exponents)
  // The largest and smallest |v| first (a vectorizable pass): their exponents
  // bound the symbols present.
  uint16_t mxa = 0, mna = 0xFFFF;  // u16 keeps the max / min in 16-bit lanes (vpmaxuw)
  bool have_sym = false;  // s.sym holds the block's u values
#if EZ_X86
  if (Fast && len == kBlock) {
    minmax_abs_fast(x, &mxa, &mna);
  } else
#endif
  {
    // Without the pair histogram (portable path, short blocks) every single-code
    // path needs u = v >> L: computed in the same pass.
    for (uint32_t j = 0; j < len; ++j) {
      const uint16_t v = x[j];
      s.sym[j] = (uint16_t)(v >> t.lbits());
      const uint16_t a = v & 0x7FFF;
      mxa = a > mxa ? a : mxa;
      mna = a < mna ? a : mna;
    }
    have_sym = true;
  }
  // Exponents below emin (the smallest |v|'s) have no elements: the counts,
  // lengths and codes of symbols below a0[kind] (emin, 2 emin) are neither
  // written nor read in this block.
  const uint32_t emax = mxa >> t.lbits(), emin = mna >> t.lbits();
  const uint32_t eend = emax + 1;
  const uint32_t a0[2] = {emin, 2 * emin};  // [kind] first symbol that may be present
  const uint32_t pair_r = eend - emin;      // exponents [emin, emax]
  // One input line and one output line are prefetched per 32 elements: 8 KiB
  // each per full block, spread over a long loop instead of a burst (a burst of
  // 128 prefetches stalls on the fill buffers like the demand misses it
  // replaces): the single-code path's histogram, the pair path's writer (its
  // histogram is half as long: the bursts cost ~10% at 64 MiB).
  static_assert(kPfBytes == kBlock * 2, "one line of each per 32 elements");
  const bool pair_hist = EZ_PAIR_OK && Fast && len == kBlock && pair_r <= kPairMaxR;
#if EZ_X86
  if (pair_hist) {
    // Pair histogram: one counter increment (2 instructions) per 2 elements
    // over (sign, exponent) pairs, the per-symbol counts from its row and column
    // sums; the pair indices serve the pair writer too.
    pair_index_fast<t.lbits()>(x, emin, s.pbin, s.pidx);
    for (uint32_t i = 0; i < kBlock / 2; i += 32) {  // 32 pairs = 64 elements
#pragma GCC unroll 32
      for (uint32_t q = i; q < i + 32; ++q) s.pcnt[s.pbin[q]]++;
    }
    pair_hist_counts_fast(s.pcnt, emin, pair_r, s.half);
  } else
#endif
  {
  // u = v >> L, then counts in 4 lanes (a run of equal symbols would otherwise
  // serialize on one counter's store-to-load latency).
  if (!have_sym)
    for (uint32_t j = 0; j < len; ++j) s.sym[j] = (uint16_t)(x[j] >> t.lbits());
  have_sym = true;
  uint32_t j = 0;
  for (; j + 32 <= len; j += 32) {
    __builtin_prefetch(s.pf_in + 2 * j, 0, 2);
    __builtin_prefetch(s.pf_out + 2 * j, 1, 2);
#pragma GCC unroll 4
    for (uint32_t i = j; i < j + 32; i += 8) {
      s.cnt[0][s.sym[i]]++;
      s.cnt[1][s.sym[i + 1]]++;
      s.cnt[2][s.sym[i + 2]]++;
      s.cnt[3][s.sym[i + 3]]++;
      s.cnt[0][s.sym[i + 4]]++;
      s.cnt[1][s.sym[i + 5]]++;
      s.cnt[2][s.sym[i + 6]]++;
      s.cnt[3][s.sym[i + 7]]++;
    }
  }
  for (; j < len; ++j) s.cnt[0][s.sym[j]]++;
  // Sum the lanes (and clear them for the next block) for exponents in [emin,
  // emax] (the lanes are zero elsewhere), each sign half contiguous (vector
  // loops).
  for (uint32_t sg = 0; sg < 2; ++sg) {
    uint16_t* const h = s.half[sg];
    for (uint32_t e = emin; e < eend; ++e) {
      const uint32_t u = sg * AE + e;
      h[e] = (uint16_t)(s.cnt[0][u] + s.cnt[1][u] + s.cnt[2][u] + s.cnt[3][u]);
      s.cnt[0][u] = s.cnt[1][u] = s.cnt[2][u] = s.cnt[3][u] = 0;
    }
  }
  }
  // Interleave the sign halves into J order (symbol 2 e + s) and kind E's.
  for (uint32_t e = emin; e < eend; ++e) {
    const uint32_t p = s.half[0][e], m = s.half[1][e];
    s.c[kKindJ][2 * e] = p;
    s.c[kKindJ][2 * e + 1] = m;
    s.c[kKindE][e] = p + m;
  }
  uint32_t sym_end[2];
  sym_end[kKindE] = eend;
  sym_end[kKindJ] = 2 * emax + 1 + (s.half[1][emax] != 0);  // 1 + the largest J symbol
  // Kind Z (zero elision) needs an element with exponent 0 and no subnormal: the
  // smallest |v| is then 0, and the smallest nonzero |v| is >= 2^M. Blocks whose
  // smallest |v| is not 0 (no zero, or a subnormal smallest) skip the scan.
  const bool zok = mna == 0 && no_subnormal<t.mbits>(x, len);
  const uint32_t z = zok ? s.half[0][0] + s.half[1][0] : 0;  // elements with e = 0 (+-0)

  // Candidate sizes in the tie order CONST-E, CONST-J, CONST-Z, HUFF-E, HUFF-J,
  // HUFF-Z, RAW.
  // RAW comes last in the tie order: a candidate of RAW's size wins (fp16 CONST-J
  // of one element, 6 bytes, since format version 4).
  uint32_t best = max_block_bytes(len) + 1;
  int best_kind = -1;  // -1 = RAW
  bool best_const = false;
  uint32_t nib[2] = {0, 0}, area[2] = {0, 0}, one_sym[2];
  for (uint32_t kind = 0; kind < 2; ++kind) one_sym[kind] = sym_end[kind] - 1;
  // Kind J can only pay when the sign is predictable from the exponent: the sign
  // costs at least 1 - |1 - 2p| bits, so J saves at most sum_e |c+ - c-| bits. It
  // is tried when 16 * that imbalance >= len (format rule; skipping package-merge
  // for J halves the code-length work on symmetric data), or when kind Z applies
  // and 16 z >= len (its raw planes drop z values of M bits).
  uint32_t imb = 0;
  for (uint32_t e = emin; e < sym_end[kKindE]; ++e) {
    const int32_t d = (int32_t)s.c[kKindJ][2 * e] - (int32_t)s.c[kKindJ][2 * e + 1];
    imb += (uint32_t)(d < 0 ? -d : d);
  }
  uint32_t k[2];
  k[kKindE] = code_lengths_pick<Fast>(s.c[kKindE], a0[kKindE], sym_end[kKindE], s.len[kKindE], s.pm);
  if (16 * imb >= len || (zok && 16 * z >= len)) {
    k[kKindJ] = code_lengths_pick<Fast>(s.c[kKindJ], a0[kKindJ], sym_end[kKindJ], s.len[kKindJ], s.pm);
  } else {
    k[kKindJ] = 0;
    for (uint32_t a = a0[kKindJ]; a < sym_end[kKindJ]; ++a) k[kKindJ] += s.c[kKindJ][a] != 0;
    if (k[kKindJ] >= 2) k[kKindJ] = 0;  // not a HUFF-J candidate (and not CONST-J)
  }
  // size[coding_index * 3 + kind]: CONST-E, CONST-J, CONST-Z, HUFF-E, HUFF-J, HUFF-Z.
  uint32_t size[6] = {~0u, ~0u, ~0u, ~0u, ~0u, ~0u};
  for (uint32_t kind = 0; kind < 2; ++kind)
    if (k[kind] == 1) size[kind] = kBlockHead + t.raw_bytes(kind, len);
  if (zok && k[kKindJ] == 1) size[kKindZ] = kBlockHead;  // all +0 or all -0: no raw planes
  for (uint32_t kind = 0; kind < 2; ++kind) {
    if (k[kind] < 2) continue;
    uint64_t bits = 0;
    for (uint32_t a = a0[kind]; a < sym_end[kind]; ++a) bits += (uint64_t)s.c[kind][a] * s.len[kind][a];
    nib[kind] = write_lengths(s.len[kind], sym_end[kind], s.nibs[kind], a0[kind]);
    area[kind] = (uint32_t)((bits + 7) / 8);
    size[3 + kind] = kHuffHead + nib[kind] + area[kind] + t.raw_bytes(kind, len);
  }
  // HUFF-Z: HUFF-J's code and streams, the raw planes of the len - z nonzero values.
  if (zok && k[kKindJ] >= 2) size[3 + kKindZ] = kHuffHead + nib[kKindJ] + area[kKindJ] + t.raw_bytes(kKindJ, len - z);
  for (int c = 0; c < 6; ++c)
    if (size[c] < best) {
      best = size[c];
      best_kind = c % 3;
      best_const = c < 3;
    }

  if (pair_hist && (best_kind < 0 || best_const)) {
    // The pair writer spreads the block's prefetches over its loop; RAW and CONST
    // blocks of the pair path issue them here (rare: a single exponent, or data
    // that does not compress).
    for (uint32_t o = 0; o < kPfBytes; o += 64) {
      __builtin_prefetch(s.pf_in + o, 0, 2);
      __builtin_prefetch(s.pf_out + o, 1, 2);
    }
  }
  if (best_kind < 0) {  // RAW: the words verbatim
    best = max_block_bytes(len);
    *raw = true;
    std::memset(out, 0, kBlockHead);
    std::memcpy(out + kBlockHead, x, 2 * (size_t)len);
    return best;
  }
  *raw = false;
  const uint32_t kind = (uint32_t)best_kind;  // the mode's kind (E, J or Z)
  const uint32_t ck = Traits::sym_kind(kind);  // the symbols' kind (Z codes J symbols)
  if (best_const) {
    out[0] = (uint8_t)(kConst | (kind << 2));
    out[1] = 0;
    st16(out + 2, one_sym[ck]);
    if (kind != kKindZ) write_raw_kind<D, Fast>(kind, x, len, out + kBlockHead);
    return best;
  }
  out[0] = (uint8_t)(kHuff | (kind << 2));
  out[1] = 0;
  st16(out + 2, sym_end[ck]);
  uint8_t* nib_out = out + kHuffHead;
  std::memcpy(nib_out, s.nibs[ck], nib[ck]);
  // Canonical codes (entropy_format.h canonical_codes: (length, symbol) order),
  // written straight into the J-symbol-indexed tables (kind E: both signs).
  {
    const uint8_t* ln = s.len[ck];
    // Lengths counted in 4 lanes: most symbols below sym_end are absent (length
    // 0), and one counter's store-to-load chain cost ~4% of the encoder's time.
    uint32_t nl4[4][kMaxLen + 1] = {}, nl[kMaxLen + 1], next[kMaxLen + 1];
    uint32_t a4 = a0[ck];
    for (; a4 + 4 <= sym_end[ck]; a4 += 4) {
      nl4[0][ln[a4]]++;
      nl4[1][ln[a4 + 1]]++;
      nl4[2][ln[a4 + 2]]++;
      nl4[3][ln[a4 + 3]]++;
    }
    for (; a4 < sym_end[ck]; ++a4) nl4[0][ln[a4]]++;
    for (uint32_t l = 0; l <= kMaxLen; ++l) nl[l] = nl4[0][l] + nl4[1][l] + nl4[2][l] + nl4[3][l];
    uint32_t c = 0;
    for (uint32_t l = 1; l <= kMaxLen; ++l) {
      next[l] = c;
      c = (c + nl[l]) << 1;
    }
    for (uint32_t a = a0[ck]; a < sym_end[ck]; ++a) {
      const uint32_t l = ln[a];
      if (!l) continue;
      const uint32_t code = next[l]++;
      if (ck == kKindE) {  // u = e and AE + e
        s.ccode[a] = s.ccode[AE + a] = code;
        s.clen[a] = s.clen[AE + a] = (uint8_t)l;
      } else {  // symbol a = e << 1 | s: u = s << (E + q) | e
        const uint32_t u = (a & 1) * AE + (a >> 1);
        s.ccode[u] = code;
        s.clen[u] = (uint8_t)l;
      }
    }
  }

  // Per code: load the symbol, its length, shift, OR the code from memory:
  // separate length and u64 code arrays avoid unpacking an entry.
  const uint64_t* const ccode = s.ccode;
  const uint8_t* const clen = s.clen;
  auto push = [ccode, clen](BitWriter& w, uint32_t a) {
    const uint32_t l = clen[a];
    w.acc = (w.acc << l) | ccode[a];
    w.nacc += l;
  };
  uint32_t bits_total;
  // The pair writer runs exactly when the histogram was by pairs and the block
  // is HUFF-E; the single-code writers read u per element.
  const bool pair_writer = pair_hist;  // HUFF-E or HUFF-J
  uint8_t* const area_out = nib_out + nib[ck];
  if (!pair_writer && !have_sym)
    for (uint32_t j = 0; j < len; ++j) s.sym[j] = (uint16_t)(x[j] >> t.lbits());
#if EZ_X86
  if (pair_writer) {
    // Pair writer (kPairMaxR): the same bits as the single-code writers below,
    // two elements a push. Table rows of absent symbols are never read; entries
    // with an absent second symbol are never read either (length 0 there).
    // Kind J: slots us = sg << 5 | e' are the J symbols 2 (emin + e') + sg, the
    // table indexed by the histogram's bins (s.pbin); kind E: slots e', indexed
    // by s.pidx. Both from the histogram pass.
    const uint32_t R = pair_r;
    uint64_t ce[64], le[64];
    uint8_t le8[64];
    const uint16_t* pair_at;
    if (ck == kKindE) {
      for (uint32_t b = 0; b < 32; ++b) {
        const uint32_t l = b < R ? s.len[kKindE][emin + b] : 0;
        le[b] = l;
        le8[b] = (uint8_t)l;
        ce[b] = l ? s.ccode[emin + b] : 0;
      }
      pair_table_fast<1>(ce, le, le8, R, s.pcode, s.plen);
      pair_at = s.pidx;
    } else {
      for (uint32_t b = 0; b < 64; ++b) {
        const uint32_t sg = b >> 5, e = emin + (b & 31);
        const uint32_t a = 2 * e + sg;  // the J symbol of slot b (< sym_end: its length is this block's)
        const uint32_t l = (b & 31) < R && a < sym_end[kKindJ] ? s.len[kKindJ][a] : 0;
        le[b] = l;
        le8[b] = (uint8_t)l;
        ce[b] = l ? s.ccode[sg * AE + e] : 0;  // ccode is indexed by u = s << (E + q) | e
      }
      pair_table_fast<2>(ce, le, le8, R, s.pcode, s.plen);
      pair_at = s.pbin;
    }
    // Two writers as below (streams 0..3 and 4..7), 2 pairs (<= 44 bits + < 8
    // pending <= 64) a flush: a stream's 512 elements are 128 groups of 4.
    uint64_t acc_a = 0, acc_b = 0;
    uint32_t P_a = 0, P_b = 0;
#define EZ_PUSH2(acc, P, pi)              \
  do {                                    \
    const uint32_t l_ = s.plen[pi];       \
    acc = (acc << l_) | s.pcode[pi];      \
    P += l_;                              \
  } while (0)
    // ANDN (BMI1; inline asm: GCC keeps ~7 in a register and still copies P0
    // before an AND, as P0 is needed for the byte offset too) clears P0's low 3
    // bits into a new register: 5 instructions a flush instead of 6. Only the
    // AVX2/BMI2 path gets here (pair_writer).
    uint32_t seven = 7;
#define EZ_FLUSH(acc, P0, P, buf)                                                  \
  do {                                                                             \
    uint32_t b_;                                                                   \
    asm("andn %[p0], %[m], %[b]" : [b] "=r"(b_) : [m] "r"(seven), [p0] "r"(P0)); \
    store_be64((buf) + ((P0) >> 3), (acc) << ((b_ - (P)) & 63));                   \
  } while (0)
    uint32_t before_a = 0, before_b = 0;
    constexpr uint32_t kHalfPairs = kStreams / 2 * kStreamLen / 2;  // stream st + 4's first pair
    const uint16_t* pa = pair_at;
    // The block's prefetches (EncScratch::pf_in / pf_out: one line of each per
    // iteration, 128 = 8 KiB each) are spread over this loop, the block's longest:
    // in the pair histogram (half the old histogram's length) they came in bursts.
    // Their addresses are affine in pa (8 pairs = 16 bytes of pa per 64-byte
    // line): bias + 4 pa, one addressing mode, no prefetch pointers to step (with
    // two writers' state GCC kept them on the stack: 5 more instructions an
    // iteration, 2 of them a reload and a store).
    const uintptr_t pf_in_bias = (uintptr_t)s.pf_in - 4 * (uintptr_t)pa;
    const uintptr_t pf_out_bias = (uintptr_t)s.pf_out - 4 * (uintptr_t)pa;
    static_assert(kStreams / 2 * (kStreamLen / 16) * 64 == kPfBytes, "one line of each an iteration");
    for (uint32_t st = 0; st < kStreams / 2; ++st) {
      // Four groups of each writer an iteration (the loop's own 3 instructions
      // were ~10% of it at one group).
#define EZ_GROUPS(q)                                  \
  do {                                                \
    const uint32_t p0a = P_a, p0b = P_b;              \
    EZ_PUSH2(acc_a, P_a, pa[q]);                      \
    EZ_PUSH2(acc_a, P_a, pa[(q) + 1]);                \
    EZ_FLUSH(acc_a, p0a, P_a, area_out);              \
    EZ_PUSH2(acc_b, P_b, pa[kHalfPairs + (q)]);       \
    EZ_PUSH2(acc_b, P_b, pa[kHalfPairs + (q) + 1]);   \
    EZ_FLUSH(acc_b, p0b, P_b, s.bits2);               \
  } while (0)
      const uint16_t* const pa_end = pa + kStreamLen / 2;
      for (; pa < pa_end; pa += 8) {
        __builtin_prefetch(reinterpret_cast<const void*>(pf_in_bias + 4 * (uintptr_t)pa), 0, 2);
        __builtin_prefetch(reinterpret_cast<const void*>(pf_out_bias + 4 * (uintptr_t)pa), 1, 2);
        EZ_GROUPS(0);
        EZ_GROUPS(2);
        EZ_GROUPS(4);
        EZ_GROUPS(6);
      }
#undef EZ_GROUPS
      end_stream_pair(out, st, P_a, P_b, &before_a, &before_b);
    }
#undef EZ_PUSH2
#undef EZ_FLUSH
    // The first writer wrote streams 0..3 in place (no copy of the area): its
    // flushes and the join store up to 16 bytes past the area's end, into the
    // raw planes written below or, for a HUFF-Z block with few raw values, past
    // the block into bytes a later block, the zero padding or the zeroed tail
    // rewrite (the block is smaller than RAW, which the row's layout leaves room for).
    bits_total = join_writers(area_out, before_a, s.bits2, P_b, before_b);
  } else
#endif
  if (len == kBlock) {
    // Two writers, streams 0..3 into s.bits and 4..7 into s.bits2, advanced in
    // turn: each accumulator's shift-OR chain (2 cycles a code) overlaps the
    // other's. Then the second area is appended at the first one's end bit.
    // Plain locals (not BitWriter objects): GCC then keeps both writers' state in
    // registers instead of on the stack (a store and a load on each accumulator's
    // chain per flush).
    uint64_t acc_a = 0, acc_b = 0;
    // Each writer's state is its accumulator and P, the bits pushed so far: a
    // flush stores at byte P0 / 8 (P0 = P before the group: the pending bits
    // start at bit P0 & ~7) the word acc << (64 - n), n = P - (P0 & ~7) in
    // [1, 62] bits, i.e. a shift by ((P0 & ~7) - P) mod 64. Two registers a
    // writer instead of three (acc, pending count, byte pointer: GCC spilled the
    // writers' state) and 6 instructions a flush instead of 8.
    uint32_t P_a = 0, P_b = 0;
#define EZ_PUSH(acc, P, sym)           \
  do {                                 \
    const uint32_t l_ = s.clen[sym];   \
    acc = (acc << l_) | s.ccode[sym];  \
    P += l_;                           \
  } while (0)
#define EZ_FLUSH(acc, P0, P, buf)                                   \
  store_be64((buf) + ((P0) >> 3), (acc) << ((((P0) & ~7u) - (P)) & 63))
    uint32_t before_a = 0, before_b = 0;
    constexpr uint32_t kHalf = kStreams / 2 * kStreamLen;  // stream st + 4 starts here
    for (uint32_t st = 0; st < kStreams / 2; ++st) {
      const uint16_t* sa = s.sym + st * kStreamLen;
      constexpr uint32_t groups = kStreamLen / kSymsPerRefill;  // 102, then 2 codes
      for (uint32_t g = 0; g < groups; ++g, sa += kSymsPerRefill) {
        const uint32_t p0a = P_a, p0b = P_b;
        EZ_PUSH(acc_a, P_a, sa[0]);
        EZ_PUSH(acc_a, P_a, sa[1]);
        EZ_PUSH(acc_a, P_a, sa[2]);
        EZ_PUSH(acc_a, P_a, sa[3]);
        EZ_PUSH(acc_a, P_a, sa[4]);
        EZ_FLUSH(acc_a, p0a, P_a, s.bits);
        EZ_PUSH(acc_b, P_b, sa[kHalf + 0]);
        EZ_PUSH(acc_b, P_b, sa[kHalf + 1]);
        EZ_PUSH(acc_b, P_b, sa[kHalf + 2]);
        EZ_PUSH(acc_b, P_b, sa[kHalf + 3]);
        EZ_PUSH(acc_b, P_b, sa[kHalf + 4]);
        EZ_FLUSH(acc_b, p0b, P_b, s.bits2);
      }
      const uint32_t p0a = P_a, p0b = P_b;
      for (uint32_t i = 0; i < kStreamLen - groups * kSymsPerRefill; ++i) {
        EZ_PUSH(acc_a, P_a, sa[i]);
        EZ_PUSH(acc_b, P_b, sa[kHalf + i]);
      }
      EZ_FLUSH(acc_a, p0a, P_a, s.bits);
      EZ_FLUSH(acc_b, p0b, P_b, s.bits2);
      end_stream_pair(out, st, P_a, P_b, &before_a, &before_b);
    }
#undef EZ_PUSH
#undef EZ_FLUSH
    bits_total = join_writers(s.bits, before_a, s.bits2, P_b, before_b);
  } else {
    BitWriter w;
    w.init(s.bits);
    uint32_t before = 0;
    for (uint32_t st = 0; st < kStreams; ++st) {
      const uint32_t j0 = std::min(st * kStreamLen, len), j1 = std::min(j0 + kStreamLen, len);
      const uint16_t* sp = s.sym + j0;
      const uint16_t* const se = s.sym + j1;
      for (; se - sp >= (ptrdiff_t)kSymsPerRefill; sp += kSymsPerRefill) {
#pragma GCC unroll 5
        for (uint32_t i = 0; i < kSymsPerRefill; ++i) push(w, sp[i]);
        w.flush();
      }
      for (; sp < se; ++sp) push(w, *sp);
      if (j1 > j0) w.flush();
      const uint32_t now = w.bits_since(s.bits);
      st16(out + kBlockHead + 2 * st, now - before);
      before = now;
    }
    bits_total = before;
  }
  (void)bits_total;
  if (!pair_writer) std::memcpy(area_out, s.bits, area[ck]);
  if (kind == kKindZ) {
    // Kind Z: the kind J planes of the words with e != 0 (|v| != 0 in a Z-valid
    // block), compacted in element order into s.sym (the bit writers are done with
    // it; a separate array would grow the zero-initialized scratch).
    uint32_t nz;
#if EZ_X86
    if (Fast) nz = compact_nonzero_fast(x, len, s.sym);
    else
#endif
      nz = compact_nonzero(x, len, s.sym);
    write_raw_kind<D, Fast>(kKindJ, s.sym, nz, area_out + area[ck]);
  } else {
    write_raw_kind<D, Fast>(kind, x, len, area_out + area[ck]);
  }
  return best;
}

}  // namespace
}  // namespace cpu
}  // namespace ent
}  // namespace zipccl
