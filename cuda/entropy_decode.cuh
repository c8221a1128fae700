// Part of the CUDA entropy codec (cuda/entropy.cu, the only file that includes it):
// the decoder's block kernel ent_decode_blocks, between ent_decode_rows and
// ent_decode_finalize (entropy_decode_rows.cuh).
#pragma once

#include "entropy_decode_rows.cuh"  // DecArgs
#include "entropy_device.cuh"

namespace zipccl {
namespace ent {
namespace gpu {
namespace {

// ---- ent_decode_blocks: a warp decodes 4 blocks, a lane per bit stream ----------------
//
// The previous design (a CTA of 128 threads per block, a 2048-entry two-symbol table,
// 8 lanes decoding while 120 threads waited at a barrier) ran at 141 GB/s on an H200:
// ~23 K warp instructions per block, 18 of 32 lanes active, 56 streams per SM in
// flight (docs/cuda.md, "Measured"). Here a CTA is one warp for kDecG = 4 blocks and
// lane 8 g + s decodes stream s of block g, so every decode instruction serves 32
// streams. The per-block state is small (a 256-entry primary table, the canonical
// symbol list, the code lengths: ~2.6 KB; the staging rows reuse the lengths' space:
// 12.7 KB per 4 blocks), so 16 CTAs = 64 blocks = 512 streams are resident per SM
// (+1 KB reserved per CTA: 16 x 13.7 KB <= 228 KB). docs/cuda.md
// ("Entropy codec kernels", "Decoder v2") has the estimate.
//
// Decoding without a full table: codes are canonical, so the codes of length l
// occupy the 11-bit windows [B_l, B_{l+1}) with B_l = sum_{i<l} n_i 2^(11-i), and
// the window w of a code of length l is the symbol at index C_l + (w - B_l) >> (11 - l)
// of the list of present symbols in (length, symbol) order (C_l = sum_{i<l} n_i).
// The primary table (the window's first 8 bits) holds every code of <= 8 bits; a
// longer code (Gaussian bf16: ~0.4% of symbols) takes the arithmetic for l = 9..11.

constexpr uint32_t kPrimBits = 8;                          // primary table index bits
constexpr uint32_t kPrim = 1u << kPrimBits;                // its entries (256)
constexpr uint32_t kLong = kMaxLen - kPrimBits;            // code lengths past the table (9, 10, 11)
constexpr uint32_t kSeg = 64;                              // symbols a lane decodes per round
constexpr uint32_t kSegRounds = kStreamLen / kSeg;         // rounds per stream (8)
constexpr uint32_t kSkip = 0xFFFFFFFFu;                    // block status: none (past the grid, or its row failed)
static_assert(kDecG * kStreams == 32, "a lane per stream");
static_assert(kLong == 3, "the long-code arithmetic selects among 3 lengths");
static_assert(kSeg == 64, "the join stores 2 elements per lane per segment");

// One block's decode state (written by lane g in phase 0, the code by phase 1).
struct DecBlk {
  const uint8_t* blk;  // the block's bytes
  const uint8_t* rin;  // the row's payload
  uint8_t* ws;         // the row's workspace
  uint16_t* y;         // the block's first output element
  uint64_t cs0, cs1;   // row byte range whose checksum terms this block adds
  uint32_t len, size, st, coding, kind, sym_end, area_off, ab, lens_ok, bad;
  uint32_t rz, nz;  // HUFF-Z: the raw-plane bytes the block holds; elements with symbol >= 2 (phase 2)
  uint32_t start[kStreams + 1];  // bit offset of each stream in the area (+ the total)
  uint32_t lb[kLong], lc[kLong];  // codes of kPrimBits + 1 + i bits: B_l and C_l (see above)
};

struct DecSmem {
  uint32_t prim[kDecG][kPrim];           // value bits << 16 | code length (0: a code of > kPrimBits bits)
  uint16_t sorted[kDecG][kMaxAlphabet];  // value bits (sym_bits) of the present symbols, canonical order
  union {
    uint8_t len[kDecG][kMaxAlphabet];  // phases 0-1: code lengths
    uint16_t stage[32][kSeg + 2];      // phase 2: a lane's decoded value bits of one round (+2: banks)
  };
  DecBlk bk[kDecG];
};

__device__ __forceinline__ uint32_t bswap32(uint32_t x) {
#if defined(ZIPCCL_SIMT_HOST)
  return __builtin_bswap32(x);
#else
  return __byte_perm(x, 0, 0x0123);
#endif
}

// Big-endian word wi of a bit area read from the 4-byte aligned address base (inside
// the block, at or after its start); the words before word wfull lie inside the
// block, bytes past its end hi read as zero. Which bits lie past a stream's end does
// not matter: a prefix code's lengths depend only on the bits they consume, and a
// stream that consumes a bit past its end fails its end-position check.
__device__ __forceinline__ uint32_t area_word(uintptr_t base, uint32_t wi, uint32_t wfull, uintptr_t hi) {
  const uintptr_t p = base + 4 * (uintptr_t)wi;
  if (wi < wfull) return bswap32(*reinterpret_cast<const uint32_t*>(p));
  uint32_t w = 0;
  for (uint32_t i = 0; i < 4; ++i) w = (w << 8) | (p + i < hi ? (uint32_t)*reinterpret_cast<const uint8_t*>(p + i) : 0u);
  return w;
}

// Phase 0 (one lane per block): the block's header, code lengths and stream lengths,
// validated in the CPU decoder's order. The Kraft sum (the rest of canonical_codes'
// check) follows in phase 1; its failure is BAD_TABLE, which takes precedence over
// everything found here after the lengths (BAD_TABLE or BAD_STREAM).
template <DtypeCode D>
__device__ uint32_t block_header(DecBlk& k, uint8_t* lenv) {
  constexpr Traits t = traits_c<D>();
  const uint8_t* blk = k.blk;
  const uint32_t size = k.size, len = k.len;
  if (size < kBlockHead || blk[1] != 0) return kDecBadTable;
  const uint32_t coding = blk[0] & 3, kind = blk[0] >> 2;
  k.coding = coding;
  k.kind = kind;
  if (coding == kRaw)
    return blk[0] != 0 || ld16(blk + 2) != 0 || size != max_block_bytes(len) ? kDecBadTable : kDecOk;
  if (kind > kKindZ || coding > kHuff) return kDecBadTable;
  // Kind Z: J's alphabet; CONST-Z is the symbol 0 or 1 and no raw planes; a HUFF-Z
  // block's raw part is what follows its streams (checked below, and against the
  // decoded symbols after phase 2).
  const bool zk = kind == kKindZ;
  const uint32_t A = t.alphabet(kind), rawb = zk ? 0 : t.raw_bytes(kind, len);
  if (coding == kConst) return ld16(blk + 2) >= (zk ? 2 : A) || size != kBlockHead + rawb ? kDecBadTable : kDecOk;
  if (size < kHuffHead + rawb) return kDecBadTable;
  // read_lengths sets len[0, sym_end) (sym_end <= A when it succeeds); nothing past it is read.
  const uint32_t sym_end = ld16(blk + 2);
  const int32_t nib = read_lengths(blk + kHuffHead, size - kHuffHead - rawb, sym_end, A, lenv);
  k.sym_end = sym_end;
  if (nib < 0) return kDecBadTable;
  k.lens_ok = 1;
  k.start[0] = 0;
  for (uint32_t s = 0; s < kStreams; ++s) {
    const uint32_t j0 = s * kStreamLen < len ? s * kStreamLen : len;
    const uint32_t j1 = j0 + kStreamLen < len ? j0 + kStreamLen : len;
    const uint32_t cnt = j1 - j0, bits = ld16(blk + kBlockHead + 2 * s);
    if (bits < cnt || bits > kMaxLen * cnt) return kDecBadTable;
    k.start[s + 1] = k.start[s] + bits;
  }
  const uint32_t total = k.start[kStreams], ab = (total + 7) / 8, area_off = kHuffHead + (uint32_t)nib;
  k.area_off = area_off;
  k.ab = ab;
  if (zk) {  // r = size - (20 + nib + ab) in [0, raw_bytes(J, len)]
    if (size < area_off + ab || size - (area_off + ab) > t.raw_bytes(kKindJ, len)) return kDecBadTable;
    k.rz = size - (area_off + ab);
  } else if (size != area_off + ab + rawb) {
    return kDecBadTable;
  }
  if ((total & 7) && (blk[area_off + ab - 1] & ((1u << (8 - (total & 7))) - 1))) return kDecBadStream;
  return kDecOk;
}

// Phase 1 for block g (the whole warp): code lengths per length by ballots, the Kraft
// check, the canonical symbol list, the primary table.
template <DtypeCode D>
__device__ __forceinline__ void build_code(DecSmem& s, uint32_t g, uint32_t lane) {
  constexpr Traits t = traits_c<D>();
  const uint32_t se = s.bk[g].sym_end, kind = s.bk[g].kind;
  const uint8_t* ln = s.len[g];
  uint32_t nl[kMaxLen + 1];
#pragma unroll
  for (uint32_t l = 0; l <= kMaxLen; ++l) nl[l] = 0;
  for (uint32_t b0 = 0; b0 < se; b0 += 32) {
    const uint32_t sym = b0 + lane, my = sym < se ? ln[sym] : 0u;
#pragma unroll
    for (uint32_t l = 1; l <= kMaxLen; ++l) nl[l] += popc32(__ballot_sync(kFull, my == l));
  }
  uint32_t B[kMaxLen + 2], C[kMaxLen + 2];
  B[1] = 0;
  C[1] = 0;
#pragma unroll
  for (uint32_t l = 1; l <= kMaxLen; ++l) {
    B[l + 1] = B[l] + (nl[l] << (kMaxLen - l));
    C[l + 1] = C[l] + nl[l];
  }
  if (B[kMaxLen + 1] != kTableSize) {  // the Kraft sum: not a complete code (the same in every lane)
    if (lane == 0) s.bk[g].st = kDecBadTable;
    return;
  }
  // The list: symbol sym of length l at C_l + its rank among the symbols of length l.
  uint32_t cnt[kMaxLen + 1];
#pragma unroll
  for (uint32_t l = 0; l <= kMaxLen; ++l) cnt[l] = 0;
  const uint32_t below = (1u << lane) - 1;
  for (uint32_t b0 = 0; b0 < se; b0 += 32) {
    const uint32_t sym = b0 + lane, my = sym < se ? ln[sym] : 0u;
    uint32_t pos = 0;
#pragma unroll
    for (uint32_t l = 1; l <= kMaxLen; ++l) {
      const uint32_t m = __ballot_sync(kFull, my == l);
      if (my == l) pos = C[l] + cnt[l] + popc32(m & below);
      cnt[l] += popc32(m);
    }
    if (my) s.sorted[g][pos] = (uint16_t)t.sym_bits(kind, sym);
  }
  __syncthreads();  // (L) the list is complete
  // Primary entry i: the code that window i << 3 starts with, when it has <= 8 bits
  // (the length l is the largest with B_l <= w: empty lengths have B_l = B_{l+1}).
  for (uint32_t i = lane; i < kPrim; i += 32) {
    const uint32_t w = i << (kMaxLen - kPrimBits);
    uint32_t l = 1, bl = 0, cl = 0;
#pragma unroll
    for (uint32_t m = 2; m <= kPrimBits + 1; ++m)
      if (w >= B[m]) {
        l = m;
        bl = B[m];
        cl = C[m];
      }
    s.prim[g][i] = l <= kPrimBits ? ((uint32_t)s.sorted[g][cl + ((w - bl) >> (kMaxLen - l))] << 16) | l : 0u;
  }
  if (lane == 0) {
#pragma unroll
    for (uint32_t i = 0; i < kLong; ++i) {
      s.bk[g].lb[i] = B[kPrimBits + 1 + i];
      s.bk[g].lc[i] = C[kPrimBits + 1 + i];
    }
  }
}

// Phase 2, join: segment r of every stream of block g (elements 512 s + 64 r .. + 64),
// two elements per lane: the staged value bits (or the CONST symbol's) OR the raw
// planes' bits, stored to y (one 32-bit store when aligned). Consecutive lanes read
// consecutive plane bytes and write consecutive outputs. 4 segments' plane bytes are
// loaded before the first store (byte loads may alias the stores, so the compiler
// would otherwise wait for each segment's loads in turn: 8 round trips, now 2).
template <DtypeCode D>
__device__ __forceinline__ void join_segment(const DecSmem& s, uint32_t g, uint32_t r, uint32_t lane) {
  constexpr Traits t = traits_c<D>();
  const DecBlk& k = s.bk[g];
  const uint32_t len = k.len, kind = k.kind, coding = k.coding;
  const bool bp = t.byte_plane(kind);
  const uint32_t pw = t.packed_width(kind), pmask = (1u << pw) - 1, rw = t.raw_width(kKindJ);
  const uint8_t* rp = k.blk + (coding == kConst ? kBlockHead : k.area_off + k.ab);
  const uint8_t* pp = rp + (bp ? len : 0);
  const uint32_t psz = (len + 7) / 8 * pw;
  const uint32_t cval = coding == kConst ? t.sym_bits(kind, ld16(k.blk + 2)) * 0x10001u : 0u;
  uint16_t* y = k.y;
  const bool w32 = (reinterpret_cast<uintptr_t>(y) & 3) == 0;
  // Two halves of 4 streams (all 8 at once would need > 128 registers for fp16).
  for (uint32_t hs = 0; hs < kStreams; hs += kStreams / 2) {
    uint32_t raw[kStreams / 2][2];
  #pragma unroll
    for (uint32_t si = 0; si < kStreams / 2; ++si) {
      const uint32_t sidx = hs + si;
  #pragma unroll
      for (uint32_t h = 0; h < 2; ++h) {
        // Element e's pw bits at bit pw * e of the packed plane (LSB first, within 2
        // bytes) above its byte-plane byte. Conditional loads, no branches, so that the
        // compiler issues all of them before the first use.
        const uint32_t e = sidx * kStreamLen + r * kSeg + 2 * lane + h;
        const bool in = e < len;
        const uint32_t bit = pw * e, by = bit >> 3;
        const uint32_t x0 = in && pw ? (uint32_t)pp[by] : 0u;
        const uint32_t x1 = in && pw && by + 1 < psz ? (uint32_t)pp[by + 1] : 0u;
        const uint32_t b8 = in && bp ? (uint32_t)rp[e] : 0u;
        const uint32_t v = ((x0 | (x1 << 8)) >> (bit & 7)) & pmask;
        raw[si][h] = bp ? (v << 8) | b8 : v;
      }
    }
  #pragma unroll
    for (uint32_t si = 0; si < kStreams / 2; ++si) {
      const uint32_t sidx = hs + si;
      const uint32_t e0 = sidx * kStreamLen + r * kSeg + 2 * lane;
      const uint32_t sv =
          coding == kConst ? cval : reinterpret_cast<const uint32_t*>(s.stage[g * kStreams + sidx])[lane];
      uint32_t out[2];
      // Traits::raw_bits for both kinds: the raw value's bits above kind J's raw width rw
      // (M - q) are kind E's sign, kind J's raw has none (bf16 rw = 7, fp16 rw = 9).
  #pragma unroll
      for (uint32_t h = 0; h < 2; ++h)
        out[h] = ((sv >> (16 * h)) & 0xFFFFu) | ((raw[si][h] >> rw) << 15) | (raw[si][h] & ((1u << rw) - 1));
      if (w32 && e0 + 1 < len) {
        *reinterpret_cast<uint32_t*>(y + e0) = out[0] | (out[1] << 16);
      } else {
        if (e0 < len) y[e0] = (uint16_t)out[0];
        if (e0 + 1 < len) y[e0 + 1] = (uint16_t)out[1];
      }
    }
  }
}

// join_segment for kind Z (CONST-Z, HUFF-Z): the value bits alone (the raw positions
// depend on the symbols of every earlier stream, which are decoded later: expand_z
// adds the raw values), with the same element-to-lane mapping. Returns this lane's
// count of elements with symbol >= 2 (exponent != 0: value bits other than the sign).
// Kinds E and J keep join_segment as it was.
template <DtypeCode D>
__device__ __forceinline__ uint32_t join_values(const DecSmem& s, uint32_t g, uint32_t r, uint32_t lane) {
  constexpr Traits t = traits_c<D>();
  const DecBlk& k = s.bk[g];
  const uint32_t len = k.len;
  const uint32_t cval = k.coding == kConst ? t.sym_bits(kKindZ, ld16(k.blk + 2)) * 0x10001u : 0u;
  uint16_t* y = k.y;
  const bool w32 = (reinterpret_cast<uintptr_t>(y) & 3) == 0;
  uint32_t nz = 0;
#pragma unroll 4
  for (uint32_t sidx = 0; sidx < kStreams; ++sidx) {
    const uint32_t e0 = sidx * kStreamLen + r * kSeg + 2 * lane;
    const uint32_t sv =
        k.coding == kConst ? cval : reinterpret_cast<const uint32_t*>(s.stage[g * kStreams + sidx])[lane];
    const uint32_t o0 = sv & 0xFFFFu, o1 = sv >> 16;
    nz += (e0 < len && (o0 & 0x7FFFu) != 0) + (e0 + 1 < len && (o1 & 0x7FFFu) != 0);
    if (w32 && e0 + 1 < len) {
      *reinterpret_cast<uint32_t*>(y + e0) = sv;
    } else {
      if (e0 < len) y[e0] = (uint16_t)o0;
      if (e0 + 1 < len) y[e0 + 1] = (uint16_t)o1;
    }
  }
  return nz;
}

// HUFF-Z after phase 2 (the whole warp, one block): y holds every element's value bits
// (from join_segment); the k-th element with exponent != 0 (value bits other than
// the sign) gets raw value k of kind J's planes of nz values at the end of the block.
// Lane l handles elements 64 q + 2 l, + 1 of step q (the elements it stored in the
// join, so it reads back its own stores); a step's positions are a running count
// (carry) plus ranks from two ballots. Four steps' loads are issued before their
// stores. The caller has checked r == raw_bytes(J, nz), and a position is < nz
// (nz was counted from the same value bits), so no read leaves the block's raw part.
template <DtypeCode D>
__device__ __forceinline__ void expand_z(const DecBlk& k, uint32_t lane) {
  constexpr Traits t = traits_c<D>();
  constexpr uint32_t kQ = 4;  // steps per batch
  const uint32_t len = k.len, nz = k.nz;
  const bool bp = t.byte_plane(kKindJ);
  const uint32_t pw = t.packed_width(kKindJ), pmask = (1u << pw) - 1, psz = (nz + 7) / 8 * pw;
  const uint8_t* rp = k.blk + k.area_off + k.ab;
  const uint8_t* pp = rp + (bp ? nz : 0);
  uint16_t* y = k.y;
  const bool w32 = (reinterpret_cast<uintptr_t>(y) & 3) == 0;
  const uint32_t below = (1u << lane) - 1;
  uint32_t carry = 0;
  for (uint32_t b0 = 0; b0 < len; b0 += kQ * kSeg) {
    uint32_t v[kQ][2];
#pragma unroll
    for (uint32_t q = 0; q < kQ; ++q) {
      const uint32_t e0 = b0 + q * kSeg + 2 * lane;
      if (w32 && e0 + 1 < len) {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(y + e0);
        v[q][0] = w & 0xFFFFu;
        v[q][1] = w >> 16;
      } else {
        v[q][0] = e0 < len ? y[e0] : 0u;
        v[q][1] = e0 + 1 < len ? y[e0 + 1] : 0u;
      }
    }
    uint32_t raw[kQ][2];
#pragma unroll
    for (uint32_t q = 0; q < kQ; ++q) {
      const bool n0 = (v[q][0] & 0x7FFFu) != 0, n1 = (v[q][1] & 0x7FFFu) != 0;
      const uint32_t m0 = __ballot_sync(kFull, n0), m1 = __ballot_sync(kFull, n1);
      const uint32_t p0 = carry + popc32(m0 & below) + popc32(m1 & below);
      carry += popc32(m0) + popc32(m1);
#pragma unroll
      for (uint32_t h = 0; h < 2; ++h) {
        const bool in = h ? n1 : n0;
        const uint32_t p = p0 + (h ? (uint32_t)n0 : 0u);
        const uint32_t bit = pw * p, by = bit >> 3;
        const uint32_t x0 = in && pw ? (uint32_t)pp[by] : 0u;
        const uint32_t x1 = in && pw && by + 1 < psz ? (uint32_t)pp[by + 1] : 0u;
        const uint32_t b8 = in && bp ? (uint32_t)rp[p] : 0u;
        const uint32_t x = ((x0 | (x1 << 8)) >> (bit & 7)) & pmask;
        raw[q][h] = bp ? (x << 8) | b8 : x;  // kind J's raw value: the mantissa
      }
    }
#pragma unroll
    for (uint32_t q = 0; q < kQ; ++q) {
      const uint32_t e0 = b0 + q * kSeg + 2 * lane;
      const uint32_t o0 = v[q][0] | raw[q][0], o1 = v[q][1] | raw[q][1];
      if (w32 && e0 + 1 < len) {
        *reinterpret_cast<uint32_t*>(y + e0) = o0 | (o1 << 16);
      } else {
        if (e0 < len) y[e0] = (uint16_t)o0;
        if (e0 + 1 < len) y[e0 + 1] = (uint16_t)o1;
      }
    }
  }
}

// Asks L2 for the line at p (no effect on results; the emulator skips it).
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if !defined(ZIPCCL_SIMT_HOST)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

// This lane's share of the checksum terms of row bytes [c0, c1): aligned 32-bit words
// where the row is 4-byte aligned, single bytes at the ends (and otherwise).
__device__ __forceinline__ uint64_t cs_range(const uint8_t* rin, uint64_t c0, uint64_t c1, uint32_t lane) {
  uint64_t cs = 0;
  const uint64_t w0 = (c0 + 3) >> 2, w1 = c1 >> 2;
  if ((reinterpret_cast<uintptr_t>(rin) & 3) == 0 && w0 < w1) {
    for (uint64_t w = w0 + lane; w < w1; w += 32)
      cs += (uint64_t)*reinterpret_cast<const uint32_t*>(rin + 4 * w) * (2 * w + 1);
    const uint64_t i = lane < 4 ? c0 + lane : 4 * w1 + (lane - 4);  // lanes 0-3 head, 4-7 tail
    if ((lane < 4 && i < 4 * w0) || (lane >= 4 && lane < 8 && i < c1)) cs += cs_byte(i, rin[i]);
  } else {
    for (uint64_t i = c0 + lane; i < c1; i += 32) cs += cs_byte(i, rin[i]);
  }
  return cs;
}

// kDecG blocks per CTA of one warp (blocks blockIdx.x * kDecG + g over all rows).
template <DtypeCode D>
__global__ void __launch_bounds__(kDecThreads, kDecMinCtas) ent_decode_blocks(DecArgs a) {
  ZC_SHARED(DecSmem, s, );
  const uint32_t lane = threadIdx.x;
  // Phase 0: lane g < kDecG validates block g.
  if (lane < kDecG) {
    DecBlk& k = s.bk[lane];
    k.st = kSkip;
    k.lens_ok = 0;
    k.bad = 0;
    k.coding = 0;
    k.kind = 0;
    k.nz = 0;
    // blockIdx.x * kDecG + lane < 2^31 + 3 (the host checks rows * nb < 2^31).
    const uint64_t B = (uint64_t)blockIdx.x * kDecG + lane;
    if (B < a.nblk) {
      const uint64_t row = B / a.nb, b = B - row * a.nb;
      const uint8_t* ws = a.ws + row * a.ws_row;
      if (*reinterpret_cast<const uint32_t*>(ws + kWsHead) == kDecOk) {
        const uint64_t* off = reinterpret_cast<const uint64_t*>(ws + kWsTab);
        const uint64_t o0 = off[b], o1 = off[b + 1];
        const uint8_t* rin = a.in + row * a.L;
        k.rin = rin;
        k.ws = const_cast<uint8_t*>(ws);
        k.cs0 = o0;
        k.cs1 = b + 1 == a.nb ? ld64(rin + kOffUsed) : o1;  // the row's last block: up to used
        k.blk = rin + o0;
        k.y = a.y + row * a.n + b * kBlock;
        k.len = block_len(a.n, b);
        k.size = (uint32_t)(o1 - o0);
        k.st = block_header<D>(k, s.len[lane]);
      }
    }
  }
  __syncthreads();
  // The blocks' bytes towards L2 while phase 1 runs (the join's plane loads and the
  // stream words then hit L2 instead of DRAM): one 128-byte line per lane and step.
  for (uint32_t g = 0; g < kDecG; ++g) {
    if (s.bk[g].st == kSkip) continue;
    const uintptr_t b0 = reinterpret_cast<uintptr_t>(s.bk[g].blk), b1 = b0 + s.bk[g].size;
    for (uintptr_t p = (b0 & ~(uintptr_t)127) + 128 * lane; p < b1; p += 128 * 32)
      prefetch_l2(reinterpret_cast<const void*>(p > b0 ? p : b0));
  }
  // Phase 1: the codes (the branch is the same for every lane).
  for (uint32_t g = 0; g < kDecG; ++g)
    if (s.bk[g].st != kSkip && s.bk[g].lens_ok) build_code<D>(s, g, lane);
  __syncthreads();
  // Phase 2: lane 8 g + sidx decodes stream sidx of block g, kSeg symbols per round
  // into its staging row; then the warp joins the round's segments with the raw planes.
  const uint32_t g = lane / kStreams, sidx = lane % kStreams;
  const DecBlk& k = s.bk[g];
  const bool dec = k.st == kDecOk && k.coding == kHuff;
  uint32_t j = 0, j1 = 0, have = 0, nw = 0, pre = 0, wfull = 0, p0 = 0;
  uint64_t buf = 0;
  uintptr_t base = 0, hi = 0;
  uint32_t lb[kLong], lc[kLong];
#pragma unroll
  for (uint32_t i = 0; i < kLong; ++i) lb[i] = lc[i] = 0;
  if (dec) {
    const uint32_t len = k.len;
    j = sidx * kStreamLen < len ? sidx * kStreamLen : len;
    j1 = j + kStreamLen < len ? j + kStreamLen : len;
#pragma unroll
    for (uint32_t i = 0; i < kLong; ++i) {
      lb[i] = k.lb[i];
      lc[i] = k.lc[i];
    }
    // A 64-bit MSB-first bit buffer holding `have` bits, fed with the area's aligned
    // big-endian words; the next word is loaded one refill ahead (pre), so its latency
    // overlaps ~12 lookups. Bits are counted from base: the next word to enter the
    // buffer starts at bit 32 nw, so the stream's position is 32 nw - have.
    const uintptr_t lo = reinterpret_cast<uintptr_t>(k.blk), area = lo + k.area_off;
    hi = lo + k.size;
    base = area & ~(uintptr_t)3;  // >= lo: the area starts >= kHuffHead bytes into the block
    wfull = (uint32_t)((hi - base) / 4);
    p0 = 8 * (uint32_t)(area & 3);
    const uint32_t q0 = p0 + k.start[sidx];
    nw = q0 >> 5;
    const uint32_t w0 = area_word(base, nw, wfull, hi), w1 = area_word(base, nw + 1, wfull, hi);
    buf = (((uint64_t)w0 << 32) | w1) << (q0 & 31);
    have = 64 - (q0 & 31);
    nw += 2;
    pre = area_word(base, nw, wfull, hi);
  }
  const uint32_t* prim = s.prim[g];
  const uint16_t* sorted = s.sorted[g];
  uint16_t* stage = s.stage[lane];
  // One symbol (have >= 11): the primary entry, or for a code of 9..11 bits its length
  // from the limits B_l and its value from the list.
  auto one = [&](uint32_t i) {
    const uint32_t w = (uint32_t)(buf >> (64 - kMaxLen));
    const uint32_t e = prim[w >> (kMaxLen - kPrimBits)];
    uint32_t l = e & 15, v = e >> 16;
    if (l == 0) {
      const uint32_t x = (w >= lb[1]) + (w >= lb[2]);
      l = kPrimBits + 1 + x;
      const uint32_t bl = x == 0 ? lb[0] : x == 1 ? lb[1] : lb[2];
      const uint32_t cl = x == 0 ? lc[0] : x == 1 ? lc[1] : lc[2];
      v = sorted[(cl + ((w - bl) >> (kMaxLen - l))) & (kMaxAlphabet - 1)];
    }
    stage[i] = (uint16_t)v;
    buf <<= l;
    have -= l;
  };
  // Refill once per two symbols: have >= 32 after it (or without it), so both lookups
  // of the next pair see >= 21 bits. (Lanes refill at different steps, so the warp runs
  // this block at almost every check: checking once per pair halves its cost.)
  auto refill = [&]() {
    if (have < 32) {
      buf |= (uint64_t)pre << (32 - have);
      have += 32;
      ++nw;
      pre = area_word(base, nw, wfull, hi);
    }
  };
  for (uint32_t r = 0; r < kSegRounds; ++r) {
    if (dec) {
      const uint32_t je = j + kSeg < j1 ? j + kSeg : j1;
      uint32_t i = 0;
      for (; j + 2 <= je; j += 2, i += 2) {
        one(i);
        one(i + 1);
        refill();
      }
      if (j < je) {
        one(i);
        refill();
        ++j;
      }
    }
    __syncthreads();  // (R) the round's symbols are staged
    for (uint32_t gg = 0; gg < kDecG; ++gg)
      if (s.bk[gg].st == kDecOk && s.bk[gg].coding != kRaw) {  // the same for every lane
        if (s.bk[gg].kind != kKindZ) {
          join_segment<D>(s, gg, r, lane);
        } else {
          const uint32_t sum = __reduce_add_sync(kFull, join_values<D>(s, gg, r, lane));
          if (lane == 0) s.bk[gg].nz += sum;  // (CONST-Z counts too; only HUFF-Z reads it)
        }
      }
    __syncthreads();  // the staging rows are free again
  }
  if (dec && 32 * nw - have - p0 != k.start[sidx + 1]) s.bk[g].bad = 1;
  __syncthreads();
  // Phase 3: RAW blocks, then per block its status bit and checksum terms.
  for (uint32_t gg = 0; gg < kDecG; ++gg) {
    DecBlk& kb = s.bk[gg];
    uint32_t st = kb.st;
    if (st == kSkip) continue;  // the same for every lane
    if (st == kDecOk && kb.coding == kRaw)
      for (uint32_t i = lane; i < kb.len; i += 32) kb.y[i] = ld16(kb.blk + kBlockHead + 2 * i);
    if (st == kDecOk && kb.bad) st = kDecBadStream;
    if (st == kDecOk && kb.kind == kKindZ && kb.coding == kHuff) {
      // The streams decoded validly: the raw part must hold exactly nz values.
      if (kb.rz != traits_c<D>().raw_bytes(kKindJ, kb.nz)) st = kDecBadStream;
      else expand_z<D>(kb, lane);
    }
    const uint64_t sum = warp_sum64(cs_range(kb.rin, kb.cs0, kb.cs1, lane));
    if (lane == 0) {
      if (st != kDecOk) atomicOr(reinterpret_cast<unsigned*>(kb.ws + kWsCount), 1u << st);
      if (sum) atomicAdd(reinterpret_cast<unsigned long long*>(kb.ws + kWsSum), (unsigned long long)sum);
    }
  }
}

}  // namespace
}  // namespace gpu
}  // namespace ent
}  // namespace zipccl
