// Part of the CPU entropy codec (entropy_cpu.cc, the only file that includes it): the
// block decoder (table build, 8 interleaved bit streams, raw planes; every read is
// bounds-checked against the block and returns a DecodeStatus on malformed data).
#pragma once

#include "entropy_cpu_kindz.h"
#include "entropy_cpu_planes.h"
#include "entropy_cpu_table.h"  // the decode table's fills

namespace zipccl {
namespace ent {
namespace cpu {
namespace {


// The code lengths of a HUFF block as read by read_lengths (entropy_format.h),
// bucketed by length: sym[l][0, n[l]) = the symbols of length l in ascending
// order, i.e. the canonical (length, symbol) order without a sort.
struct LenBuckets {
  uint32_t n[kMaxLen + 1];
  uint16_t sym[kMaxLen + 1][kMaxAlphabet];
};

// read_lengths with its validation (same results, same -1 cases), writing
// buckets instead of a length array. Returns the bytes used or -1.
EZ_INLINE int32_t read_lengths_bucketed(const uint8_t* p, uint32_t avail, uint32_t sym_end, uint32_t A,
                                        LenBuckets& b) {
  if (sym_end == 0 || sym_end > A) return -1;
  for (uint32_t l = 0; l <= kMaxLen; ++l) b.n[l] = 0;
  uint32_t nn = 0, a = 0, last = 0;  // last = 1 + the last present symbol
  const uint32_t max_nn = 2 * avail;
  while (a < sym_end) {
    if (nn >= max_nn) return -1;
    const uint32_t v = (p[nn >> 1] >> (4 * (nn & 1))) & 15;
    ++nn;
    if (v <= kMaxLen) {
      if (v) {
        b.sym[v][b.n[v]++] = (uint16_t)a;
        last = a + 1;
      }
      ++a;
    } else if (v == 15) {
      if (nn + 2 > max_nn) return -1;
      const uint32_t lo = (p[nn >> 1] >> (4 * (nn & 1))) & 15;
      const uint32_t hi = (p[(nn + 1) >> 1] >> (4 * ((nn + 1) & 1))) & 15;
      nn += 2;
      a += (lo | (hi << 4)) + 3;
    } else {
      return -1;
    }
  }
  if (a != sym_end || last != sym_end) return -1;
  if ((nn & 1) && ((p[nn >> 1] >> 4) != 0)) return -1;  // padding nibble must be zero
  return (int32_t)((nn + 1) / 2);
}

struct DecScratch {
  LenBuckets lb;
  // Decode table, indexed by the next 11 bits of a stream; an entry holds the 1 to
  // 3 symbols whose codes fit in those bits (their concatenation), as 4 16-bit
  // words (stored as they are into sv; a symbol's value bits are its sign/exponent
  // fields, bf16 bits >= 7, fp16 >= 10, so the low nibble of each word is free):
  //   word 0  symbol 1's value bits | the bits the entry consumes (l1 [+ l2 [+ l3]])
  //   word 1  symbol 2's value bits | l1                (value 0 with 1 symbol)
  //   word 2  symbol 3's value bits | l1 + l2 (2+ symbols, else 0)
  //   word 3  output advance in bytes: 2 x the symbols (2, 4 or 6)
  // The join masks the low nibbles off (bits the raw planes own); word 3 and the
  // words past the entry's symbols land on output slots that the stream's next
  // entry (or the tail) overwrites. A 64-bit shift by the entry shifts by its
  // length (x86 counts are taken mod 64; bits 4, 5 are 0). Gaussian bf16:
  // ~2.85 symbols a lookup (1.99 with at most 2), fp16 ~2.46 (its codes are
  // ~3.5 bits against bf16's ~2.6; see the table build for the pairs and
  // triples left out).
  uint64_t tab[kTableSize];
  // Table build (decode_block_impl), per symbol in canonical order: its parts of
  // an entry as symbol 1, 2 and 3 (entries are sums of these: no field carries
  // into the next; c1's low nibble is the symbol's length).
  uint64_t c1[kMaxAlphabet], c2[kMaxAlphabet], c3[kMaxAlphabet];
  // third[2^m + i], m = 1..9, i < 2^m: c3 of the symbol whose code prefixes the
  // m-bit value i, or 0 when none fits (the entries of an (s1, s2) region are
  // c1[s1] + c2[s2] + third[2^m + i], m = 11 - l1 - l2).
  uint64_t third[1u << (kMaxLen - 1)];
  // The c1 list of the codes of <= 6 bits whose regions s.tab holds (see the
  // table build); sig_n = ~0u: none yet.
  uint64_t sig[64];
  uint32_t sig_n;
  uint8_t area[kMaxAreaBytes + kStreamLen * kMaxLen / 8 + 8];
  uint16_t sv[kBlock];       // decoded symbol values (L1), merged with the raw planes into y
  uint16_t zraw[kBlock + 8];  // kind Z: the block's raw values (elements with e != 0), in order
  // Prefetch targets for the decode rounds (see decode_row_t): a later block's
  // payload bytes and the output words of the next block.
  const uint8_t* pf_in;
  uint8_t* pf_out;
};


// The hot loop's constants (decode_block_impl: shift counts in registers).
struct DecodeRegs {
  const uint8_t* p;    // the bit area
  const uint64_t* tab; // DecScratch::tab
  uint8_t* out;        // DecScratch::sv as bytes
  uint32_t top, c3, c48, not7;  // 64 - 11, 3, 48, ~7
};

// 5 lookups from one refill at bit *qp (55 bits <= the 57 valid), output at
// byte oo. The refill sets bit 0 as a marker (the window's bit 63 - q % 8 >= 56,
// never read): after the shifts its position is the bits consumed, added to *qp.
// (oo by value, not a reference to the caller's local: the asm's memory clobber
// would reload anything reached through memory.)
template <bool Fast>
EZ_INLINE void lookups5(const DecodeRegs r, uint32_t* qp, uint32_t& oo_ref) {
  uint64_t buf;
  uint32_t oo = oo_ref;
#if EZ_X86
  if constexpr (Fast) {
    // The bit position stays in memory (the 8 streams' positions and output
    // offsets do not fit in registers): one load here, and the end adds the bits
    // consumed to it in place (GCC: one ADD to memory instead of an add and a
    // store). (Reading it as the memory operand of both SHRX and ANDN, and the
    // add in asm, saved 0.09 more instructions an element but ran ~2% slower
    // on fp16 in 4 of 5 A/B runs: two loads of the just-stored position.)
    // The bit offset q % 8 by one ANDN (GCC otherwise copies q and ANDs).
    uint32_t sh;
    const uint32_t q = *qp;
    asm("andn %[q], %[not7], %[sh]" : [sh] "=r"(sh) : [q] "r"(q), [not7] "r"(r.not7));
    buf = (__builtin_bswap64(load64(r.p + (q >> r.c3))) << sh) | 1;
  } else
#endif
  {
    const uint32_t q = *qp;
    buf = (__builtin_bswap64(load64(r.p + (q >> r.c3))) << (~r.not7 & q)) | 1;
  }
#if EZ_X86
  if constexpr (Fast) {
    // 5 instructions a lookup: the output advance (word 3) is added straight
    // from the entry's memory by a 16-bit add (oo < 2^14, so the register's
    // upper bits stay 0 for the addressing).
    uint64_t oo64 = oo, idx, e;
    const uint64_t top64 = r.top;
#pragma GCC unroll 5
    for (uint32_t i = 0; i < kSymsPerRefill; ++i) {
      asm("shrx %[top], %[buf], %[idx]\n\t"
          "movq (%[tab],%[idx],8), %[e]\n\t"
          "movq %[e], (%[out],%[oo],1)\n\t"
          "shlx %[e], %[buf], %[buf]\n\t"
          "addw 6(%[tab],%[idx],8), %w[oo]"
          : [buf] "+r"(buf), [oo] "+r"(oo64), [idx] "=&r"(idx), [e] "=&r"(e)
          : [top] "r"(top64), [tab] "r"(r.tab), [out] "r"(r.out)
          : "memory", "cc");
    }
    oo = (uint32_t)oo64;
    *qp += (uint32_t)__builtin_ctzll(buf);
  } else
#endif
  {
#pragma GCC unroll 5
    for (uint32_t i = 0; i < kSymsPerRefill; ++i) {
      const uint64_t e = r.tab[buf >> r.top];
      buf <<= (e & 63);
      std::memcpy(r.out + oo, &e, 8);
      oo += (uint32_t)(e >> r.c48);
    }
    *qp += (uint32_t)__builtin_ctzll(buf);
  }
  oo_ref = oo;
}

// Rounds over the 8 streams of 5 lookups each. A lookup emits <= 3 symbols and
// stores 4 words, so R rounds stay inside a stream's output (and decode no more
// than its symbols) while every stream has >= 15 R + 1 symbols left. (Two
// groups a stream a round, q and oo kept in registers between them, ran ~7%
// slower at 64 MiB despite fewer instructions: one stream's longer dependency
// chain.)
template <bool Fast>
EZ_INLINE void decode_rounds(const DecodeRegs r, uint32_t* pos, uint32_t* o, const uint32_t* oend,
                             const uint8_t*& pf_in_ref, uint8_t*& pf_out_ref) {
  constexpr uint32_t kRoundSyms = 3 * kSymsPerRefill;
  const uint8_t* pf_in = pf_in_ref;
  uint8_t* pf_out = pf_out_ref;
  for (;;) {
    uint32_t left = kStreamLen;
    for (uint32_t st = 0; st < kStreams; ++st) left = std::min(left, (oend[st] - o[st]) / 2);
    uint32_t rounds = left ? (left - 1) / kRoundSyms : 0;
    if (!rounds) break;
    for (; rounds; --rounds) {
      // 4 + 3 lines a round (~2.85 symbols a lookup on Gaussian data: ~35
      // rounds a block): ~9 KiB of the output a block (the next block's 8 KiB)
      // and ~6.7 KiB of a later block's payload (~5.4 KiB).
      __builtin_prefetch(pf_out, 1, 2);
      __builtin_prefetch(pf_out + 64, 1, 2);
      __builtin_prefetch(pf_out + 128, 1, 2);
      __builtin_prefetch(pf_out + 192, 1, 2);
      __builtin_prefetch(pf_in, 0, 2);
      __builtin_prefetch(pf_in + 64, 0, 2);
      __builtin_prefetch(pf_in + 128, 0, 2);
      pf_out += 256;
      pf_in += 192;
#pragma GCC unroll 8
      for (uint32_t st = 0; st < kStreams; ++st) {
        uint32_t oo = o[st];
        lookups5<Fast>(r, pos + st, oo);
        o[st] = oo;
      }
    }
  }
  pf_in_ref = pf_in;
  pf_out_ref = pf_out;
}

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
  if (kind > kKindZ || coding > kHuff) return kDecBadTable;
  const bool zk = kind == kKindZ;
  const uint32_t A = t.alphabet(kind);
  // Kind Z's raw-plane size r is what the block has left after its streams
  // (checked below); E and J's is fixed by len.
  const uint32_t rawb = zk ? 0 : t.raw_bytes(kind, len);
  if (zk && coding == kConst) {  // CONST-Z: every element +0 (symbol 0) or -0 (1)
    const uint32_t sym = ld16(blk + 2);
    if (sym >= 2 || size != kBlockHead) return kDecBadTable;
    const uint16_t v = (uint16_t)(sym << 15);
    for (uint32_t j = 0; j < len; ++j) y[j] = v;
    return kDecOk;
  }
  if (coding == kConst) {
    const uint32_t sym = ld16(blk + 2);
    if (sym >= A || size != kBlockHead + rawb) return kDecBadTable;
    const uint16_t v = (uint16_t)t.sym_bits(kind, sym);
    for (uint32_t j = 0; j < len; ++j) y[j] = v;
    or_raw_kind<D, Fast>(kind, blk + kBlockHead, len, y, y, 0xFFFF);
    return kDecOk;
  }
  // HUFF.
  if (size < kHuffHead + rawb) return kDecBadTable;
  const uint32_t sym_end = ld16(blk + 2);
  LenBuckets& lb = s.lb;
  const int32_t nib = read_lengths_bucketed(blk + kHuffHead, size - kHuffHead - rawb, sym_end, A, lb);
  if (nib < 0) return kDecBadTable;
  // The Kraft sum must be exactly 2^11 (a complete code: every index decodes).
  uint32_t kraft = 0;
  for (uint32_t l = 1; l <= kMaxLen; ++l) kraft += lb.n[l] << (kMaxLen - l);
  if (kraft != kTableSize) return kDecBadTable;
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
  if (zk) {
    // HUFF-Z: r = size - area_off - ab in [0, raw_bytes(J, len)]; r must equal
    // raw_bytes(J, nz), checked once the symbols are decoded (zero_join).
    if (size < area_off + ab || size - (area_off + ab) > t.raw_bytes(kKindJ, len)) return kDecBadTable;
  } else if (size != area_off + ab + rawb) {
    return kDecBadTable;
  }
  // Padding bits after the last code (the low bits of the last byte) are zero.
  if ((total & 7) && (blk[area_off + ab - 1] & ((1u << (8 - (total & 7))) - 1))) return kDecBadStream;

  // Decode table: symbol s1 (canonical order) owns the 2^m1 indexes after its
  // code (m1 = 11 - l1); inside them the remaining bits start with the code of
  // each s2 with l1 + l2 <= kPairBits, in canonical order (2^m2 indexes each, m2
  // = m1 - l2 >= 11 - kPairBits), and the indexes after those (longer codes)
  // hold s1 alone. An (s1, s2) region is c1 + c2 + the third-symbol table of its
  // m2 bits. Rarer pairs (l1 + l2 > kPairBits: bf16 < 3% of lookups on Gaussian
  // data, 2.85 instead of 2.92 symbols a lookup) would cost more to build than
  // they save: they keep 1 symbol. The s1 of one length have regions that differ
  // only by c1: the first is built, the others are it plus the difference. The
  // regions are written by length (fill_runs, add_runs): the symbols of one
  // length take regions of one size.
  //
  // Only codes of <= kShortBits bits take part in pairs and triples, so the
  // regions of those codes (the table's first `pre` entries: ~97% of it on
  // Gaussian data) depend only on their (length, value) list, kept in s.sig:
  // when a block's list equals the previous block's (1/3 to 2/3 of Gaussian
  // blocks), they are still in s.tab and only the longer codes' regions (single
  // symbols) are written again.
  {
    // Pairs of up to kPairBits bits from codes of up to kShortBits bits. fp16's
    // codes are longer (~3.5 bits an element on Gaussian data against bf16's
    // ~2.6: its symbols carry m9), so its pairs go up to 10 bits (2.46 instead
    // of 2.31 symbols a lookup; the runs below keep the small regions cheap).
    // bf16 gained nothing from longer pairs (4.64 -> 4.64 instructions an
    // element at 9 bits, 4.66 at 10).
    constexpr uint32_t kPairBits = D == kF16 ? 10 : 8, kShortBits = 6;
    uint32_t k = 0, pre = 0, P = 0;
    uint32_t kst[kMaxLen + 1];  // canonical index of the first symbol of each length
    for (uint32_t l = 1; l <= kMaxLen; ++l) {
      // (Locals: stores through s would make GCC reload lb.n[l] and k.)
      const uint32_t n = lb.n[l];
      const uint16_t* const sym = lb.sym[l];
      uint64_t* const c1 = s.c1 + k;
      const uint64_t part = l | (l << 16) | ((uint64_t)l << 32) | (2ull << 48);
      for (uint32_t i = 0; i < n; ++i) {
        asm("" : "+r"(i));  // a few symbols a length: not worth GCC's vector loop
        c1[i] = t.sym_bits(kind, sym[i]) | part;
      }
      kst[l] = k;
      k += n;
      if (l == kShortBits) {
        P = k;
        pre = 0;
        for (uint32_t l2 = 1; l2 <= kShortBits; ++l2) pre += lb.n[l2] << (kMaxLen - l2);
      }
    }
    uint32_t lmin = 1;
    while (!lb.n[lmin]) ++lmin;  // (a complete code has a shortest length <= 11)
    if (!(P == s.sig_n && std::memcmp(s.sig, s.c1, sizeof(uint64_t) * P) == 0)) {
      for (uint32_t i = 0; i < P; ++i) {
        const uint64_t l = s.c1[i] & kLenMask, v = s.c1[i] & 0xFFF0;  // value bits >= 7 (bf16), >= 9 (fp16)
        s.c2[i] = l | (v << 16) | (l << 32) | (2ull << 48);
        s.c3[i] = l | (v << 32) | (2ull << 48);
      }
      // The third-symbol tables that regions use: m2 = 11 - l1 - l2 in
      // [11 - kPairBits, 11 - 2 lmin].
      for (uint32_t m = kMaxLen - kPairBits; m + 2 * lmin <= kMaxLen; ++m) {
        uint64_t* d = s.third + (1u << m);
        uint64_t* const end = d + (1u << m);
        for (uint32_t l3 = lmin; l3 <= std::min(m, kShortBits); ++l3)
          d = fill_runs(d, m - l3, s.c3 + kst[l3], lb.n[l3]);
        for (; d < end; ++d) *d = 0;
      }
      uint64_t* dst = s.tab;
      for (uint32_t l1 = lmin; l1 <= kShortBits; ++l1) {
        const uint32_t n1 = lb.n[l1], m1 = kMaxLen - l1;
        if (!n1) continue;
        const uint64_t* const c1 = s.c1 + kst[l1];
        if (l1 + lmin > kPairBits) {
          dst = fill_runs(dst, m1, c1, n1);
          continue;
        }
        // The first s1 of this length: its pair regions by s2 length, then s1
        // alone; the others are it plus the difference of c1.
        uint64_t* const built = dst;
        uint64_t* const end = dst + (1u << m1);
        for (uint32_t l2 = lmin; l2 <= std::min(kShortBits, kPairBits - l1); ++l2)
          dst = add_runs(dst, m1 - l2, s.third + (1u << (m1 - l2)), s.c2 + kst[l2], lb.n[l2], c1[0]);
        uint32_t left = (uint32_t)(end - dst);
        for (; left & 7; left &= left - 1) {  // pairs of > 8 bits leave regions of 1, 2 or 4
          const uint32_t cnt = left & (0u - left);
          fill64(dst, cnt, c1[0]);
          dst += cnt;
        }
        if (left) fill64(dst, left, c1[0]);
        dst = end;
        for (uint32_t i = 1; i < n1; ++i, dst += 1u << m1) add_fill64(dst, built, 1u << m1, c1[i] - c1[0]);
      }
      std::memcpy(s.sig, s.c1, sizeof(uint64_t) * P);
      s.sig_n = P;
    }
    uint64_t* dst = s.tab + pre;
    for (uint32_t l = kShortBits + 1; l <= kMaxLen; ++l) dst = fill_runs(dst, kMaxLen - l, s.c1 + kst[l], lb.n[l]);
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
  const uint64_t* tab = s.tab;
  // The shift counts (and the mask) live in registers so that BMI2 code shifts
  // with one non-destructive shrx instead of mov + shr (the entry is still needed
  // after the shift, q after `q >> 3`): one instruction fewer a lookup and a
  // refill (measured with 2-symbol entries: bf16 decode 7.15 -> 6.99
  // instructions an element).
  uint32_t top = 64 - kMaxLen, c3 = 3, c48 = 48, not7 = ~7u;
  if (Fast) {
    opaque(top);
    opaque(c3);
    opaque(c48);
    opaque(not7);
  }
  auto refill = [p, c3, not7](uint32_t q) -> uint64_t {
    return __builtin_bswap64(load64(p + (q >> c3))) << (~not7 & q);
  };
  uint8_t* const out = reinterpret_cast<uint8_t*>(s.sv);
  uint32_t pos[kStreams], o[kStreams], oend[kStreams];
  for (uint32_t st = 0; st < kStreams; ++st) {
    pos[st] = start[st];
    const uint32_t j0 = std::min(st * kStreamLen, len), j1 = std::min(j0 + kStreamLen, len);
    o[st] = 2 * j0;
    oend[st] = 2 * j1;
  }
  const uint8_t* pf_in = s.pf_in;
  uint8_t* pf_out = s.pf_out;
  if (len == kBlock) {
    DecodeRegs r{p, tab, out, top, c3, c48, not7};
    decode_rounds<Fast>(r, pos, o, oend, pf_in, pf_out);
  }
  // The rest of each stream (all of it in a short block): 5 lookups a refill
  // while the stream has >= 16 symbols left (the rounds stop at the slowest
  // stream), then one whole entry a refill while 4 output words remain, then one
  // symbol a lookup (symbol 1's length is word 1's nibble). Each phase takes the
  // streams in turn, so that their lookup chains overlap (one stream after
  // another, the tail was ~7% of the decode time on Gaussian bf16).
  const DecodeRegs regs{p, tab, out, top, c3, c48, not7};
  for (bool more = true; more;) {
    more = false;
    for (uint32_t st = 0; st < kStreams; ++st)
      if (oend[st] - o[st] >= 2 * (3 * kSymsPerRefill + 1)) {
        uint32_t oo = o[st];
        lookups5<Fast>(regs, pos + st, oo);
        o[st] = oo;
        more = true;
      }
  }
  for (bool more = true; more;) {
    more = false;
    for (uint32_t st = 0; st < kStreams; ++st)
      if (oend[st] - o[st] >= 8) {
        const uint64_t e = tab[refill(pos[st]) >> (64 - kMaxLen)];
        std::memcpy(out + o[st], &e, 8);
        pos[st] += (uint32_t)e & kLenMask;
        o[st] += (uint32_t)(e >> 48);
        more = true;
      }
  }
  for (bool more = true; more;) {
    more = false;
    for (uint32_t st = 0; st < kStreams; ++st)
      if (o[st] < oend[st]) {
        const uint64_t e = tab[refill(pos[st]) >> (64 - kMaxLen)];
        std::memcpy(out + o[st], &e, 2);
        pos[st] += (uint32_t)(e >> 16) & kLenMask;
        o[st] += 2;
        more = true;
      }
  }
  for (uint32_t st = 0; st < kStreams; ++st)
    if (pos[st] != start[st + 1]) return kDecBadStream;
  if (zk) return zero_join<D, Fast>(blk + area_off + ab, size - (area_off + ab), len, s.sv, s.zraw, y);
  or_raw_kind<D, Fast>(kind, blk + area_off + ab, len, s.sv, y, (uint16_t)~kLenMask);
  return kDecOk;
}


}  // namespace
}  // namespace cpu
}  // namespace ent
}  // namespace zipccl
