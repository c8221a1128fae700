// Part of the CUDA entropy codec (cuda/entropy.cu, the only file that includes it):
// the encoder's block kernel ent_encode_kernel (its per-row kernels:
// entropy_encode_rows.cuh).
#pragma once

#include "entropy_device.cuh"
#include "entropy_encode_rows.cuh"  // EncArgs

namespace zipccl {
namespace ent {
namespace gpu {
namespace {

// The encoder's per-block work is parallel over the CTA from the histogram to the
// bytes: every pass is a CTA-wide step between barriers (docs/cuda.md, "Entropy codec
// kernels"), and the decoupled look-back reads 32 predecessors per L2 round trip.

// Package-merge scratch of one kind with alphabet A (<= A leaves, lists of up to
// 2A - 1 items): the leaves in (count, symbol) order, two levels of item weights
// (ping-pong; the sort keys live in w[1] until level 1 is built) and per level one
// bit per item: is it a leaf.
template <uint32_t A>
struct PMKind {
  uint32_t lw[A];                      // leaf weights (counts), ascending
  uint16_t ls[A];                      // the symbol of each leaf
  uint32_t w[2][2 * A];                // list L in w[L & 1]
  uint32_t bits[kMaxLen][2 * A / 32];  // bit i of level L: item i is a leaf
};

struct EncCode {
  uint32_t area[kMaxArea / 4 + 2];  // bit streams, big-endian words (bit i = bit 31 - i%32 of word i/32)
  uint32_t ctab[kMaxAlphabet];      // code << 4 | length, present symbols only
  uint8_t nbuf[kMaxAlphabet + 8];   // the code-length nibble stream, one nibble per byte
};

template <DtypeCode D>
struct EncSmem {
  // Alphabets of kinds E and J (bf16 256 / 512, fp16 v4 64 / 128).
  static constexpr uint32_t AE = traits_c<D>().alphabet(kKindE), AJ = traits_c<D>().alphabet(kKindJ);
  static_assert(AJ == 2 * AE && AJ <= kMaxAlphabet, "J symbols are E symbols and a sign");
  alignas(16) uint16_t x[kBlock];
  uint32_t hist[AJ];  // counts of the J symbols
  uint32_t cE[AE];    // counts of the E symbols
  uint16_t list[2][AJ];  // [kind] the present symbols, ascending
  uint8_t len[2][AJ];    // [kind] code lengths
  union {
    struct {
      PMKind<AE> e;
      PMKind<AJ> j;
    } pm;       // while choosing the code
    EncCode c;  // while writing the block
    uint16_t cr[kBlock];  // HUFF-Z, after the bit area is stored: the compacted raw values
  } u;
  uint64_t red[kEncThreads / 32];
  uint64_t base;  // block offset from data_off
  uint32_t ticket;
  uint32_t wcnt[(AE + AJ + kEncThreads - 1) / kEncThreads][kEncThreads / 32];  // compaction counts
  uint32_t imb[kEncThreads / 32];
  uint32_t k[2], sym_end[2];
  uint32_t acc[4];  // code bits E, J; nibbles E, J
  uint32_t nl[2][kMaxLen + 1];  // [kind] symbols per code length
  uint32_t cl[2][kMaxLen];      // package-merge: leaves taken at each level
  uint32_t scan[kEncThreads / 32];
  uint32_t coding, kind, size;
  uint32_t subn;  // the block holds a subnormal (exponent 0, mantissa != 0): not Z-valid
  uint32_t sbits[kStreams];
};

// Nibbles that code a run of r absent symbols (write_lengths: chunks of min(r, 258)
// as 15, lo, hi while r >= 3, then the rest (< 3) as single zeros).
__device__ __forceinline__ uint32_t run_nibbles(uint32_t r) {
  const uint32_t q = r / 258, rem = r - 258 * q;
  return 3 * q + (rem >= 3 ? 3 : rem);
}

// One item of package-merge list L (entropy_format.h code_lengths: the merge of the k
// leaves lw with the np packages prev[2j] + prev[2j + 1], a leaf before a package of
// equal weight, the first tot items kept). Both inputs are ascending, so the merged
// position of leaf i is i + #{packages < lw[i]} and that of package j is
// j + #{leaves <= its weight}: a binary search each, all items in parallel.
__device__ __forceinline__ void pm_item(uint32_t it, uint32_t k, uint32_t np, uint32_t tot, const uint32_t* lw,
                                        const uint32_t* prev, uint32_t* cur, uint32_t* bits) {
  if (it < k) {
    const uint32_t w = lw[it];
    uint32_t lo = 0, hi = np;
    while (lo < hi) {
      const uint32_t mid = (lo + hi) >> 1;
      if (prev[2 * mid] + prev[2 * mid + 1] < w) lo = mid + 1;
      else hi = mid;
    }
    const uint32_t pos = it + lo;
    if (pos < tot) {
      cur[pos] = w;
      atomicOr(&bits[pos >> 5], 1u << (pos & 31));
    }
  } else {
    const uint32_t j = it - k, pw = prev[2 * j] + prev[2 * j + 1];
    uint32_t lo = 0, hi = k;
    while (lo < hi) {
      const uint32_t mid = (lo + hi) >> 1;
      if (lw[mid] <= pw) lo = mid + 1;
      else hi = mid;
    }
    const uint32_t pos = j + lo;
    if (pos < tot) cur[pos] = pw;
  }
}

// The size of list L of package-merge for k leaves, given the size of list L - 1.
__device__ __forceinline__ uint32_t pm_size(uint32_t L, uint32_t k, uint32_t prev_size) {
  const uint32_t np = prev_size / 2;
  return (L == kMaxLen - 1 && 2 * k - 2 < k + np) ? 2 * k - 2 : k + np;
}

// Leaves among the first t items of a level (one warp; bits has nw <= 32 words).
__device__ __forceinline__ uint32_t leaves_before(const uint32_t* bits, uint32_t nw, uint32_t t, uint32_t lane) {
  uint32_t m = 0;
  if (lane < nw && 32 * lane < t) {
    m = bits[lane];
    const uint32_t rest = t - 32 * lane;
    if (rest < 32) m &= (1u << rest) - 1;
  }
  return __reduce_add_sync(kFull, popc32(m));
}

template <DtypeCode D>
__global__ void __launch_bounds__(kEncThreads, 6) ent_encode_kernel(EncArgs a) {
  constexpr Traits t = traits_c<D>();
  using Smem = EncSmem<D>;
  constexpr uint32_t AE = Smem::AE, AJ = Smem::AJ;
  constexpr int NT = kEncThreads, NW = NT / 32;
  constexpr uint32_t kRounds = (AE + AJ + NT - 1) / NT;  // compaction rounds over E and J bins
  static_assert(AE % 32 == 0, "a warp's bins are of one kind");
  ZC_SHARED(Smem, s, );
  const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    s.ticket = atomicAdd(reinterpret_cast<unsigned*>(a.ws + kWsTicket), 1u);
    for (uint32_t i = 0; i < 4; ++i) s.acc[i] = 0;
    s.sym_end[0] = s.sym_end[1] = 0;
    s.subn = 0;
  }
  for (uint32_t i = tid; i < AJ; i += NT) s.hist[i] = 0;
  for (uint32_t i = tid; i < 2 * (kMaxLen + 1); i += NT) s.nl[i / (kMaxLen + 1)][i % (kMaxLen + 1)] = 0;
  // Leaf bits of both kinds: zero (the bitmaps are adjacent words of the union).
  for (uint32_t i = tid; i < kMaxLen * 2 * AE / 32; i += NT) s.u.pm.e.bits[i / (2 * AE / 32)][i % (2 * AE / 32)] = 0;
  for (uint32_t i = tid; i < kMaxLen * 2 * AJ / 32; i += NT) s.u.pm.j.bits[i / (2 * AJ / 32)][i % (2 * AJ / 32)] = 0;
  __syncthreads();
  const uint64_t row = s.ticket / a.nb, b = s.ticket - row * a.nb;
  const uint32_t len = block_len(a.n, b);
  const uint16_t* x = a.x + row * a.n + b * kBlock;
  uint8_t* out = a.out + row * a.out_row;
  uint8_t* ws = a.ws + row * a.ws_row;
  // 1. The elements into shared memory (16-byte loads when the block allows) and the
  // histogram of the J symbols.
  if (len == kBlock && (reinterpret_cast<uintptr_t>(x) & 15) == 0) {
    for (uint32_t q = tid; q < kBlock / 8; q += NT) {
      const uint4 v = reinterpret_cast<const uint4*>(x)[q];
      reinterpret_cast<uint4*>(s.x)[q] = v;
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        atomicAdd(&s.hist[t.symbol(kKindJ, w[i] & 0xFFFF)], 1u);
        atomicAdd(&s.hist[t.symbol(kKindJ, w[i] >> 16)], 1u);
      }
    }
  } else {
    for (uint32_t j = tid; j < len; j += NT) {
      const uint16_t v = x[j];
      s.x[j] = v;
      atomicAdd(&s.hist[t.symbol(kKindJ, v)], 1u);
    }
  }
  for (uint32_t i = tid; i < AE + AJ; i += NT) s.len[i < AE ? kKindE : kKindJ][i < AE ? i : i - AE] = 0;
  __syncthreads();
  // 2. E counts and the sign imbalance sum_e |c_J[2e] - c_J[2e+1]| (HUFF-J rule).
  {
    uint32_t imb = 0;
    for (uint32_t e = tid; e < AE; e += NT) {
      const uint32_t p = s.hist[2 * e], m = s.hist[2 * e + 1];
      s.cE[e] = p + m;
      imb += p > m ? p - m : m - p;
    }
    imb = __reduce_add_sync(kFull, imb);
    if (lane == 0) s.imb[warp] = imb;
    // Kind Z needs Z-validity (an element with exponent 0, and no subnormal): the
    // subnormals are looked for only in blocks that have elements of coded exponent 0
    // (z = c_J[0] + c_J[1] > 0; fp16 v4: e = 0 and m9 = 0, so a +-0 counts and a
    // subnormal with m9 = 1 does not, but a block without any is not Z-valid anyway),
    // so blocks without zeros pay one branch.
    if (s.hist[0] + s.hist[1] != 0) {
      bool sub = false;
      for (uint32_t j = tid; j < len; j += NT) sub |= t.subnormal(s.x[j]);
      if (sub) s.subn = 1;
    }
  }
  __syncthreads();
  // 3. Present symbols of both kinds in symbol order (E bins, then J bins): ballots,
  // per-warp counts, positions by prefix.
  uint32_t pmask[kRounds];
#pragma unroll
  for (uint32_t r = 0; r < kRounds; ++r) {
    const uint32_t i = r * NT + tid;
    const bool p = i < AE ? s.cE[i] != 0 : (i < AE + AJ && s.hist[i - AE] != 0);
    pmask[r] = __ballot_sync(kFull, p);
    if (lane == 0) s.wcnt[r][warp] = popc32(pmask[r]);
  }
  __syncthreads();
  uint32_t kE = 0, kAll = 0, imb = 0;
  for (uint32_t c = 0; c < kRounds * NW; ++c) {
    const uint32_t v = (&s.wcnt[0][0])[c];
    kAll += v;
    if (32 * c < AE) kE += v;
  }
  for (uint32_t w = 0; w < NW; ++w) imb += s.imb[w];
  // The J code lengths are computed only when 16 * imbalance >= len, or the block is
  // Z-valid with 16 z >= len (format rule): otherwise kind J's k >= 2 is recorded
  // as 0, which skips its package-merge and sizes (no HUFF-J, no HUFF-Z).
  const uint32_t kJraw = kAll - kE;
  const uint32_t z = s.hist[0] + s.hist[1];
  const bool zlen = z != 0 && !s.subn && 16 * z >= len;
  const uint32_t kJ = kJraw >= 2 && 16 * imb < len && !zlen ? 0 : kJraw;
  const uint32_t kE2 = kE >= 2 ? kE : 0, kJ2 = kJ >= 2 ? kJ : 0;  // kinds that run package-merge
#pragma unroll
  for (uint32_t r = 0; r < kRounds; ++r) {
    const uint32_t i = r * NT + tid;
    if (!((pmask[r] >> lane) & 1)) continue;
    uint32_t pos = popc32(pmask[r] & ((1u << lane) - 1));
    for (uint32_t c = 0; c < r * NW + warp; ++c) pos += (&s.wcnt[0][0])[c];
    const uint32_t kind = i < AE ? kKindE : kKindJ, sym = i < AE ? i : i - AE;
    const uint32_t cnt = i < AE ? s.cE[sym] : s.hist[sym];
    if (kind == kKindJ) pos -= kE;
    s.list[kind][pos] = (uint16_t)sym;
    if (pos + 1 == (kind == kKindE ? kE : kJraw)) s.sym_end[kind] = sym + 1;
    // Sort key (count, symbol), unique; kept in w[1] until the ranks are taken.
    (kind == kKindE ? s.u.pm.e.w[1] : s.u.pm.j.w[1])[pos] = (cnt << 9) | sym;
  }
  if (tid == 0) {
    s.k[kKindE] = kE;
    s.k[kKindJ] = kJ;
  }
  __syncthreads();
  // 4. The package-merge leaves: every present symbol's rank in (count, symbol) order.
  for (uint32_t i = tid; i < kE2 + kJ2; i += NT) {
    const bool e = i < kE2;
    const uint32_t pos = e ? i : i - kE2, k = e ? kE2 : kJ2;
    const uint32_t* key = e ? s.u.pm.e.w[1] : s.u.pm.j.w[1];
    const uint32_t my = key[pos];
    uint32_t r = 0;
    for (uint32_t o = 0; o < k; ++o) r += key[o] < my;
    uint32_t* lw = e ? s.u.pm.e.lw : s.u.pm.j.lw;
    uint16_t* ls = e ? s.u.pm.e.ls : s.u.pm.j.ls;
    uint32_t* w0 = e ? s.u.pm.e.w[0] : s.u.pm.j.w[0];
    lw[r] = my >> 9;
    w0[r] = my >> 9;
    ls[r] = (uint16_t)(my & 511);
  }
  __syncthreads();
  // 5. Package-merge lists 1 .. kMaxLen - 1 of both kinds, one barrier per list.
  {
    uint32_t szE = kE2, szJ = kJ2;
    for (uint32_t L = 1; L < kMaxLen; ++L) {
      const uint32_t npE = szE / 2, npJ = szJ / 2;
      const uint32_t totE = kE2 ? pm_size(L, kE2, szE) : 0, totJ = kJ2 ? pm_size(L, kJ2, szJ) : 0;
      const uint32_t nE = kE2 ? kE2 + npE : 0, nJ = kJ2 ? kJ2 + npJ : 0;
      for (uint32_t it = tid; it < nE + nJ; it += NT) {
        if (it < nE)
          pm_item(it, kE2, npE, totE, s.u.pm.e.lw, s.u.pm.e.w[(L - 1) & 1], s.u.pm.e.w[L & 1], s.u.pm.e.bits[L]);
        else
          pm_item(it - nE, kJ2, npJ, totJ, s.u.pm.j.lw, s.u.pm.j.w[(L - 1) & 1], s.u.pm.j.w[L & 1],
                  s.u.pm.j.bits[L]);
      }
      szE = totE;
      szJ = totJ;
      __syncthreads();
    }
  }
  // 6. Walk the lists down (warp 0: E, warp 1: J): cl[L] = leaves among the first t
  // items of list L, t = 2k - 2 at the top and 2 (t - c) below.
  if (warp < 2) {
    const uint32_t k = warp == kKindE ? kE2 : kJ2;
    uint32_t tt = k >= 2 ? 2 * k - 2 : 0;
    for (int L = (int)kMaxLen - 1; L >= 0; --L) {
      uint32_t c = 0;
      if (tt > 0) {
        if (L == 0)
          c = tt < k ? tt : k;  // list 0 is all leaves
        else if (warp == kKindE)
          c = leaves_before(s.u.pm.e.bits[L], 2 * AE / 32, tt, lane);
        else
          c = leaves_before(s.u.pm.j.bits[L], 2 * AJ / 32, tt, lane);
      }
      if (lane == 0) s.cl[warp][L] = c;
      tt = 2 * (tt - c);
    }
  }
  __syncthreads();
  // 7. Code lengths (the leaf of rank r gets #{L : cl[L] > r}), code bits, symbols
  // per length, and the nibble-stream size (per present symbol: its run of absent
  // symbols before it, then its length).
  {
    uint32_t bE = 0, bJ = 0, nE = 0, nJ = 0;
    for (uint32_t i = tid; i < kE2 + kJ2; i += NT) {
      const bool e = i < kE2;
      const uint32_t kind = e ? kKindE : kKindJ, r = e ? i : i - kE2;
      uint32_t l = 0;
      for (uint32_t L = 0; L < kMaxLen; ++L) l += s.cl[kind][L] > r;
      const uint32_t sym = e ? s.u.pm.e.ls[r] : s.u.pm.j.ls[r];
      const uint32_t cnt = e ? s.u.pm.e.lw[r] : s.u.pm.j.lw[r];
      s.len[kind][sym] = (uint8_t)l;
      atomicAdd(&s.nl[kind][l], 1u);
      const uint32_t prev = r ? s.list[kind][r - 1] + 1u : 0u;  // r as a position in symbol order
      const uint32_t nn = 1 + run_nibbles(s.list[kind][r] - prev);
      if (e) {
        bE += cnt * l;
        nE += nn;
      } else {
        bJ += cnt * l;
        nJ += nn;
      }
    }
    bE = __reduce_add_sync(kFull, bE);
    bJ = __reduce_add_sync(kFull, bJ);
    nE = __reduce_add_sync(kFull, nE);
    nJ = __reduce_add_sync(kFull, nJ);
    if (lane == 0) {
      if (bE) atomicAdd(&s.acc[0], bE);
      if (bJ) atomicAdd(&s.acc[1], bJ);
      if (nE) atomicAdd(&s.acc[2], nE);
      if (nJ) atomicAdd(&s.acc[3], nJ);
    }
  }
  __syncthreads();

  // 8. Warp 0: the block's mode (candidates in the tie order CONST-E, CONST-J,
  // CONST-Z, HUFF-E, HUFF-J, HUFF-Z, RAW), its offset by a decoupled look-back (32
  // predecessors per round trip), the directory entry.
  if (warp == 0) {
    // RAW comes last in the tie order (format v4): a candidate of RAW's size wins
    // (fp16 one-element blocks: CONST-J is 4 + 1 + 1 = 6 bytes, as RAW).
    uint32_t best = max_block_bytes(len) + 1, coding = kRaw, kind = 0;
    // Kind Z: Z-valid, and nz = len - z raw values (CONST-Z has none: its one J
    // symbol is 0 or 1). It shares kind J's k, code bits and nibbles.
    const uint32_t z = s.hist[0] + s.hist[1];
    const bool zv = z != 0 && !s.subn;
    for (uint32_t c = 0; c < 6; ++c) {
      const uint32_t kd = c % 3, ck = Traits::sym_kind(kd);
      if (kd == kKindZ && !zv) continue;
      const uint32_t nraw = kd == kKindZ ? (c < 3 ? 0 : len - z) : len;
      uint32_t sz = ~0u;
      if (c < 3 && s.k[ck] == 1) sz = kBlockHead + t.raw_bytes(kd, nraw);
      if (c >= 3 && s.k[ck] >= 2)
        sz = kHuffHead + (s.acc[2 + ck] + 1) / 2 + (s.acc[ck] + 7) / 8 + t.raw_bytes(kd, nraw);
      if (sz < best) {
        best = sz;
        coding = c < 3 ? kConst : kHuff;
        kind = kd;
      }
    }
    if (coding == kRaw) best = max_block_bytes(len);
    uint64_t* st = reinterpret_cast<uint64_t*>(ws + kWsTab);
    uint64_t excl = 0;
    if (b == 0) {
      if (lane == 0) st_relaxed(&st[0], kFlagIncl | best);
    } else {
      if (lane == 0) st_relaxed(&st[b], kFlagAgg | best);
      int64_t top = (int64_t)b - 1;
      for (;;) {
        const int64_t idx = top - (int64_t)lane;
        uint64_t v = idx >= 0 ? ld_relaxed(&st[idx]) : kFlagIncl;
        int spins = 0;
        while (__any_sync(kFull, (v >> 62) == 0)) {
          if (++spins > 8) __nanosleep(32);
          if ((v >> 62) == 0) v = ld_relaxed(&st[idx]);
        }
        const uint32_t incl = __ballot_sync(kFull, (v >> 62) == 2);
        uint64_t val = v & kValMask;
        if (incl) {
          const uint32_t first = (uint32_t)__ffs((int)incl) - 1;  // nearest inclusive state
          if (lane > first) val = 0;
          excl += warp_sum64(val);
          break;
        }
        excl += warp_sum64(val);
        top -= 32;
      }
      if (lane == 0) st_relaxed(&st[b], kFlagIncl | (excl + best));
    }
    if (lane == 0) {
      s.coding = coding;
      s.kind = kind;
      s.size = best;
      s.base = excl;
      out[kDirOff + 2 * b] = (uint8_t)best;
      out[kDirOff + 2 * b + 1] = (uint8_t)(best >> 8);
      // The block's zero header bytes (no checksum term): byte 1, and 0..3 of RAW.
      uint8_t* bh = out + data_offset(a.n) + excl;
      bh[1] = 0;
      if (coding == kRaw) bh[0] = bh[2] = bh[3] = 0;
      if (coding == kRaw) atomicAdd(reinterpret_cast<unsigned*>(ws + kWsCount), 1u);
      if (b + 1 == a.nb) *reinterpret_cast<uint64_t*>(ws + kWsData) = excl + best;
    }
  }
  __syncthreads();

  // kind: the block's kind (E, J, Z); ck: the kind of its symbols and raw planes
  // (Z codes J's symbols; its raw planes are J's planes of fewer values).
  const uint32_t coding = s.coding, kind = s.kind, ck = Traits::sym_kind(kind);
  const uint64_t blk = data_offset(a.n) + s.base;  // row offset of the block
  uint64_t cs = 0;
  auto put = [&](uint32_t i, uint32_t v) {
    const uint64_t pos = blk + i;
    out[pos] = (uint8_t)v;
    cs += cs_byte(pos, v & 0xFF);
  };
  // Raw planes of cnt values rawv(0 .. cnt - 1) at block offset off (entropy_format.h:
  // byte plane, packed plane).
  auto put_raw = [&](uint32_t off, uint32_t cnt, auto rawv) {
    const bool bp = t.byte_plane(ck);
    const uint32_t w = t.packed_width(ck);
    if (bp)
      for (uint32_t j = tid; j < cnt; j += NT) put(off + j, rawv(j) & 0xFF);
    if (w) {
      const uint32_t poff = off + (bp ? cnt : 0);
      for (uint32_t g = tid; g < (cnt + 7) / 8; g += NT) {
        uint64_t acc = 0;
        for (uint32_t k = 0; k < 8 && 8 * g + k < cnt; ++k) acc |= (uint64_t)(rawv(8 * g + k) >> (bp ? 8 : 0)) << (k * w);
        for (uint32_t i = 0; i < w; ++i) put(poff + g * w + i, (uint32_t)(acc >> (8 * i)) & 0xFF);
      }
    }
  };
  auto raw_x = [&](uint32_t j) { return t.raw(ck, s.x[j]); };  // kinds E, J: every element's raw value

  // Every byte of the block is stored here (the payload is not memset: its zero
  // header bytes were stored with the directory entry; ent_encode_tail zeroes what
  // follows the blocks).
  if (coding == kRaw) {
    for (uint32_t j = tid; j < len; j += NT) {
      put(kBlockHead + 2 * j, s.x[j] & 0xFF);
      put(kBlockHead + 2 * j + 1, s.x[j] >> 8);
    }
  } else if (coding == kConst) {
    if (tid == 0) {
      const uint32_t sym = s.sym_end[ck] - 1;  // the kind's one symbol (CONST-Z: 0 or 1)
      put(0, kConst | (kind << 2));
      put(2, sym & 0xFF);
      put(3, sym >> 8);
    }
    if (kind != kKindZ) put_raw(kBlockHead, len, raw_x);  // CONST-Z: no raw planes
  } else {
    const uint32_t k = s.k[ck], nn = s.acc[2 + ck];
    const uint32_t nib = (nn + 1) / 2, ab = (s.acc[ck] + 7) / 8;
    const uint16_t* list = s.list[ck];
    const uint8_t* lens = s.len[ck];
    // 9. Canonical codes (entropy_format.h canonical_codes): a symbol of length l gets
    // next[l] (the first code of length l) + its rank among the symbols of length l in
    // symbol order. The code-length nibble offsets by a CTA scan (each thread two
    // adjacent present symbols).
    uint32_t* ctab = s.u.c.ctab;
    for (uint32_t i = tid; i < (ab + 3) / 4 + 1; i += NT) s.u.c.area[i] = 0;
    for (uint32_t pos = tid; pos < k; pos += NT) {
      const uint32_t sym = list[pos], l = lens[sym];
      uint32_t c = 0;
      for (uint32_t m = 1; m < l; ++m) c = (c + s.nl[ck][m]) << 1;
      for (uint32_t o = 0; o < pos; ++o) c += lens[list[o]] == l;
      ctab[sym] = (c << 4) | l;
    }
    static_assert(2 * NT >= kMaxAlphabet, "two present symbols per thread cover the alphabet");
    uint32_t nv[2] = {0, 0};
    for (uint32_t h = 0; h < 2; ++h) {
      const uint32_t pos = 2 * tid + h;
      if (pos < k) nv[h] = 1 + run_nibbles(list[pos] - (pos ? list[pos - 1] + 1u : 0u));
    }
    const uint32_t mine2 = nv[0] + nv[1], incl2 = warp_incl_scan(mine2);
    if (lane == 31) s.scan[warp] = incl2;
    __syncthreads();
    {
      uint32_t o = incl2 - mine2;
      for (uint32_t w = 0; w < warp; ++w) o += s.scan[w];
      uint8_t* nb = s.u.c.nbuf;
      for (uint32_t h = 0; h < 2; ++h) {
        const uint32_t pos = 2 * tid + h;
        if (pos >= k) break;
        uint32_t r = list[pos] - (pos ? list[pos - 1] + 1u : 0u);
        while (r >= 3) {
          const uint32_t c = r < 258 ? r : 258;
          nb[o++] = 15;
          nb[o++] = (uint8_t)((c - 3) & 15);
          nb[o++] = (uint8_t)((c - 3) >> 4);
          r -= c;
        }
        while (r--) nb[o++] = 0;
        nb[o++] = lens[list[pos]];
      }
      if (tid == 0) nb[nn] = 0;  // the padding nibble of an odd count
    }
    // Warp `warp` codes stream `warp`: lane l the 16 elements 512 warp + 16 l ..
    const uint32_t j0 = kStreamLen * warp + kPerLane * lane;
    uint32_t mine = 0;
    for (uint32_t i = 0; i < kPerLane && j0 + i < len; ++i) mine += ctab[t.symbol(ck, s.x[j0 + i])] & 15;
    const uint32_t incl = warp_incl_scan(mine);
    const uint32_t total = __reduce_add_sync(kFull, mine);
    if (lane == 0) s.sbits[warp] = total;
    __syncthreads();  // (S) every stream's bit count is in s.sbits
    uint32_t q = incl - mine;
    for (uint32_t w = 0; w < warp; ++w) q += s.sbits[w];
    for (uint32_t i = 0; i < kPerLane && j0 + i < len; ++i) {
      const uint32_t e = ctab[t.symbol(ck, s.x[j0 + i])];
      const uint32_t l = e & 15, c = e >> 4, o = q & 31;
      if (o + l <= 32) {
        atomicOr(&s.u.c.area[q >> 5], c << (32 - o - l));
      } else {
        atomicOr(&s.u.c.area[q >> 5], c >> (o + l - 32));
        atomicOr(&s.u.c.area[(q >> 5) + 1], c << (64 - o - l));
      }
      q += l;
    }
    if (tid < kStreams) {
      put(kBlockHead + 2 * tid, s.sbits[tid] & 0xFF);
      put(kBlockHead + 2 * tid + 1, s.sbits[tid] >> 8);
    }
    if (tid == 0) {
      put(0, kHuff | (kind << 2));
      put(2, s.sym_end[ck] & 0xFF);
      put(3, s.sym_end[ck] >> 8);
    }
    for (uint32_t i = tid; i < nib; i += NT) put(kHuffHead + i, s.u.c.nbuf[2 * i] | (s.u.c.nbuf[2 * i + 1] << 4));
    __syncthreads();
    const uint32_t aoff = kHuffHead + nib;
    for (uint32_t i = tid; i < ab; i += NT) put(aoff + i, (s.u.c.area[i >> 2] >> (24 - 8 * (i & 3))) & 0xFF);
    if (kind != kKindZ) {
      put_raw(aoff + ab, len, raw_x);
    } else {
      // HUFF-Z: the raw values of the elements with exponent != 0 only (in a Z-valid
      // block exactly those of coded exponent != 0, symbol >= 2), the k-th such
      // element at raw position k. Thread tid owns elements kZPer tid .. + kZPer; its
      // first position is the count of such elements before them (a CTA scan); the
      // compacted values go to shared memory, then the planes are written as for J.
      constexpr uint32_t kZPer = kBlock / NT;
      const uint32_t e0 = kZPer * tid;
      uint32_t c = 0;
#pragma unroll 4  // (fully unrolled, bf16 spills 8 bytes at the 40-register cap)
      for (uint32_t i = 0; i < kZPer && e0 + i < len; ++i) c += !t.zero_exp(s.x[e0 + i]);
      const uint32_t zi = warp_incl_scan(c);
      if (lane == 31) s.scan[warp] = zi;
      __syncthreads();  // the warp totals are stored; the bit area is read (s.u.cr overlays it)
      uint32_t p = zi - c;
      for (uint32_t w = 0; w < warp; ++w) p += s.scan[w];
#pragma unroll 4
      for (uint32_t i = 0; i < kZPer && e0 + i < len; ++i) {
        const uint32_t v = s.x[e0 + i];
        if (!t.zero_exp(v)) s.u.cr[p++] = (uint16_t)t.raw(kKindJ, v);
      }
      __syncthreads();  // the compacted raw values are stored
      const uint32_t nz = len - (s.hist[0] + s.hist[1]);
      put_raw(aoff + ab, nz, [&](uint32_t j) { return (uint32_t)s.u.cr[j]; });
    }
  }
  const uint64_t sum = cta_sum64<NT>(cs, s.red);
  if (tid == 0 && sum) atomicAdd(reinterpret_cast<unsigned long long*>(ws + kWsSum), (unsigned long long)sum);
}

}  // namespace
}  // namespace gpu
}  // namespace ent
}  // namespace zipccl
