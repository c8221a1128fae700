// "entropy" codec (codec id 2) on CUDA GPUs: kernels and the XLA FFI handlers
// "zipccl_entropy_encode" / "zipccl_entropy_decode" for platform "CUDA".
//
// The payload is byte-identical to the CPU codec (ffi/entropy_cpu.cc) and the
// decoder reports the same status for every payload: the format, including the
// encoder's choices (package-merge code lengths, the block mode), is fixed by
// docs/format.md ("Entropy codec (codec id 2)") and ffi/entropy_format.h, whose
// __host__ __device__ functions both codecs call. tests/test_entropy_cuda.py runs
// these kernels on the CPU SIMT emulator (tests/cuda/emulate_entropy.cc) against
// the CPU codec. docs/cuda.md ("Entropy codec kernels") describes the design:
//
// Encoder, per call (all rows), no host synchronisation:
//   1. cudaMemsetAsync: payload and workspace to zero (every byte the kernels do
//      not write -- zero runs, the padding past used_nbytes -- is then already right).
//   2. ent_encode_kernel: one CTA of 256 threads per 4096-element block, in ticket
//      order (an atomic counter, so a CTA only waits on blocks held by CTAs that
//      already run). Histogram of the joint (coded exponent, sign) symbols in
//      shared memory (format v4: the coded exponent is e for bf16, e and the top
//      mantissa bit for fp16; alphabets and raw widths come from entropy_format.h's
//      Traits); code lengths of both kinds by package-merge (one thread per kind,
//      shared-memory lists, the leaf order by a parallel rank); the block's mode and
//      size; its byte offset in the row by a decoupled look-back over per-block
//      states in the workspace; then the block is written straight to its final
//      place: warp s codes stream s (a lane codes 16 elements at its bit offset from
//      a warp scan, ORed into big-endian words in shared memory), raw planes by
//      element/group (kind Z, format v3: only the elements with exponent != 0, the
//      k-th at raw position k, compacted by a CTA scan of per-thread counts). Every
//      byte written adds its checksum term (the checksum is linear in the bytes:
//      byte i contributes byte << 8(i mod 4) times 2(i/4)+1).
//   3. ent_encode_finalize (a CTA per row): header, checksum, stats.
// Decoder: memset(workspace); ent_decode_rows (a CTA per row: header checks in the
// CPU's order, directory sizes, block offsets into the workspace, raw-block count);
// ent_decode_blocks (a one-warp CTA per 4 blocks: block validation as the CPU by
// one lane per block, canonical symbol lists and 256-entry primary tables by
// ballots, then lane 8 g + s decodes stream s of block g in rounds of 64 symbols
// staged in shared memory and joined with the raw planes by the whole warp (kind
// Z: the value bits alone, then a pass that adds the raw values by a running count
// of the elements with exponent != 0, once the raw part's size is checked);
// findings and checksum terms into the workspace); ent_decode_finalize (status by
// the CPU's priority, all-one rows on error).
#include "device_util.h"

#include <stdint.h>

#include <string>

#include "entropy_cuda.h"
#include "entropy_format.h"
#include "handler_common.h"  // split_dims, str (shared with the window codec's handlers)

namespace zipccl {
namespace ent {
namespace gpu {
namespace {

using ::zipccl::dev::ld_relaxed;
using ::zipccl::dev::st_relaxed;

constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kEncThreads = 256;  // 8 warps: warp s codes bit stream s
// ent_decode_blocks: a CTA is one warp for kDecG blocks (a lane per bit stream).
// 12.7 KB of shared memory per CTA allows 16 CTAs per SM; 16 asks for <= 128 registers.
constexpr uint32_t kDecG = 4;
constexpr int kDecThreads = 32;
constexpr int kDecMinCtas = 16;
constexpr int kRowThreads = 256;  // the per-row kernels
constexpr uint32_t kMaxArea = kBlock * kMaxLen / 8;  // bytes of the largest bit area (5632)
constexpr uint32_t kLanesPerStream = 32;
constexpr uint32_t kPerLane = kStreamLen / kLanesPerStream;  // 16 elements per lane
static_assert(kEncThreads / 32 == (int)kStreams, "one warp per stream");

// Workspace, per row (workspace_nbytes(n) bytes, zeroed by the handler):
constexpr uint32_t kWsTicket = 0;   // u32 block ticket counter (row 0's copy serves all rows)
constexpr uint32_t kWsSum = 8;      // u64 checksum terms of the blocks
constexpr uint32_t kWsCount = 16;   // u32 encoder: RAW blocks; decoder: bit s = a block had status s
constexpr uint32_t kWsData = 24;    // u64 encoder: data_bytes (written by the row's last block)
constexpr uint32_t kWsHead = 32;    // u32 decoder: the row-level status (header, directory)
constexpr uint32_t kWsTab = 128;    // u64 per block: encoder look-back state; decoder: offsets [nb + 1]
// Look-back state of a block: flag << 62 | bytes (aggregate: the block's size;
// inclusive: the sum of the sizes of blocks 0..b of the row).
constexpr uint64_t kFlagAgg = 1ull << 62, kFlagIncl = 2ull << 62, kValMask = (1ull << 62) - 1;

// entropy_format.h's traits (format v4: bf16 q = 0, fp16 q = 1) as a constant
// expression: alphabets, raw widths and the shared-memory layout follow from it.
template <DtypeCode D>
__host__ __device__ constexpr Traits traits_c() {
  return traits_of(D);
}

// Checksum term of byte v at row offset pos (COMMON.md's word checksum, per byte).
__device__ __forceinline__ uint64_t cs_byte(uint64_t pos, uint32_t v) {
  return ((uint64_t)v << (8 * (pos & 3))) * (2 * (pos >> 2) + 1);
}

__device__ __forceinline__ uint32_t popc32(uint32_t x) {
#if defined(ZIPCCL_SIMT_HOST)
  return (uint32_t)__builtin_popcount(x);
#else
  return (uint32_t)__popc(x);
#endif
}

__device__ __forceinline__ uint64_t warp_sum64(uint64_t x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

// Sum of x over the CTA, in thread 0 (red: one slot per warp). Contains a barrier.
template <int NT>
__device__ __forceinline__ uint64_t cta_sum64(uint64_t x, uint64_t* red) {
  x = warp_sum64(x);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  uint64_t s = 0;
  if (threadIdx.x == 0)
    for (int i = 0; i < NT / 32; ++i) s += red[i];
  return s;
}

__device__ __forceinline__ uint32_t warp_incl_scan(uint32_t x) {
  const uint32_t lane = threadIdx.x & 31;
#pragma unroll
  for (uint32_t d = 1; d < 32; d <<= 1) {
    const uint32_t y = __shfl_up_sync(kFull, x, d);
    if (lane >= d) x += y;
  }
  return x;
}

// ---- encoder -------------------------------------------------------------------------
//
// The encoder's per-block work is parallel over the CTA from the histogram to the
// bytes: the first GPU run (H200) measured ~30 GB/s for the earlier design, whose
// code choice ran on one thread per kind (symbol lists, package-merge, sizes,
// canonical codes, O(alphabet) loops over dependent shared-memory loads: ~150 K
// cycles per block) and whose look-back walked one predecessor per L2 round trip.
// Here every pass is a CTA-wide step between barriers (docs/cuda.md, "Entropy codec
// kernels"), and the look-back reads 32 predecessors per round trip.

struct EncArgs {
  const uint16_t* x;  // [rows, n]
  uint8_t* out;       // [rows, out_row], zeroed
  uint8_t* ws;        // [rows, ws_row], zeroed
  uint64_t n, nb, out_row, ws_row;
};

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

// Zeroes every row from the end of its blocks (data_off + data_bytes, known once
// ent_encode_kernel has run) to the end of the payload row: the zero padding up to
// used_nbytes and the unused rest. CTA (row, c) covers bytes [c, c + 1) x kTailBytes
// of its row, 16-byte stores where whole aligned words are zero.
constexpr uint64_t kTailBytes = 64 * 1024;
__global__ void __launch_bounds__(kRowThreads) ent_encode_tail(EncArgs a, uint32_t ctas_per_row) {
  const uint64_t row = blockIdx.x / ctas_per_row, c = blockIdx.x - row * ctas_per_row;
  uint8_t* out = a.out + row * a.out_row;
  const uint8_t* ws = a.ws + row * a.ws_row;
  const uint64_t data = a.nb ? *reinterpret_cast<const uint64_t*>(ws + kWsData) : 0;
  const uint64_t start = data_offset(a.n) + data;
  const uint64_t lo = c * kTailBytes > start ? c * kTailBytes : start;
  const uint64_t hi = (c + 1) * kTailBytes < a.out_row ? (c + 1) * kTailBytes : a.out_row;
  if (lo >= hi) return;
  // [lo, w0) bytes, [w0, w1) 16-byte words (aligned in memory), [w1, hi) bytes.
  const uintptr_t base = reinterpret_cast<uintptr_t>(out);
  uint64_t w0 = ((base + lo + 15) & ~(uintptr_t)15) - base, w1 = ((base + hi) & ~(uintptr_t)15) - base;
  if (w0 > hi) w0 = hi;
  if (w1 < w0) w1 = w0;
  for (uint64_t i = lo + threadIdx.x; i < w0; i += kRowThreads) out[i] = 0;
  for (uint64_t i = w0 + 16 * threadIdx.x; i < w1; i += 16 * kRowThreads)
    *reinterpret_cast<uint4*>(out + i) = make_uint4(0, 0, 0, 0);
  for (uint64_t i = w1 + threadIdx.x; i < hi; i += kRowThreads) out[i] = 0;
}

// One CTA per row: header, checksum (the blocks' terms + header and directory), stats.
template <DtypeCode D>
__global__ void __launch_bounds__(kRowThreads) ent_encode_finalize(EncArgs a, int32_t* stats) {
  ZC_SHARED(uint64_t, red, [kRowThreads / 32]);
  const uint64_t row = blockIdx.x;
  uint8_t* out = a.out + row * a.out_row;
  const uint8_t* ws = a.ws + row * a.ws_row;
  const uint64_t nb = a.nb, doff = data_offset(a.n);
  const uint64_t data = nb ? *reinterpret_cast<const uint64_t*>(ws + kWsData) : 0;
  const uint64_t used = align128(doff + data);
  const uint32_t raws = *reinterpret_cast<const uint32_t*>(ws + kWsCount);
  // The zero bytes of the header (35) and the directory's padding (the payload is
  // not memset; the directory itself was written by ent_encode_kernel).
  for (uint64_t i = kDirOff + 2 * nb + threadIdx.x; i < doff; i += kRowThreads) out[i] = 0;
  if (threadIdx.x == 0) {
    out[35] = 0;
    st32(out + kOffMagic, kMagic);
    out[kOffVersion] = kVersion;
    out[kOffDtype] = (uint8_t)D;
    out[kOffCodec] = kCodecId;
    out[kOffStatus] = 0;
    st64(out + kOffN, a.n);
    st64(out + kOffUsed, used);
    out[kOffBlockLog2] = (uint8_t)kBlockLog2;
    out[kOffStreams] = (uint8_t)kStreams;
    out[kOffMaxLen] = (uint8_t)kMaxLen;
    st32(out + kOffRawBlocks, raws);
    st64(out + kOffNumBlocks, nb);
    st64(out + kOffDataBytes, data);
  }
  __syncthreads();
  uint64_t cs = 0;
  for (uint64_t w = threadIdx.x; w < doff / 4; w += kRowThreads)
    if (w != kOffChecksum / 4 && w != kOffChecksum / 4 + 1) cs += (uint64_t)ld32(out + 4 * w) * (2 * w + 1);
  const uint64_t sum = cta_sum64<kRowThreads>(cs, red);
  if (threadIdx.x == 0) {
    st64(out + kOffChecksum, sum + *reinterpret_cast<const uint64_t*>(ws + kWsSum));
    stats[4 * row] = 0;
    stats[4 * row + 1] = (int32_t)raws;
    stats[4 * row + 2] = (int32_t)(used / kAlign);
    stats[4 * row + 3] = 0;
  }
}

// ---- decoder -------------------------------------------------------------------------

struct DecArgs {
  const uint8_t* in;  // [rows, L]
  uint16_t* y;        // [rows, n]
  uint8_t* ws;        // [rows, ws_row], zeroed
  uint64_t L, n, nb, ws_row;
  uint64_t nblk;  // rows * nb: the blocks of the call
};

// The header checks of the CPU decoder, in its order (docs/format.md).
template <DtypeCode D>
__device__ int32_t header_status(const uint8_t* in, uint64_t L, uint64_t n) {
  if (L < kHeaderBytes) return kDecBadSize;
  if (ld32(in + kOffMagic) != kMagic || in[kOffVersion] != kVersion || in[kOffCodec] != kCodecId)
    return kDecBadMagic;
  if (in[kOffDtype] != (uint8_t)D) return kDecBadDtype;
  const uint64_t used = ld64(in + kOffUsed);
  if (ld64(in + kOffN) != n || used % kAlign || used > L || used < min_nbytes(D, n) || used > max_nbytes(D, n))
    return kDecBadSize;
  if (in[kOffStatus] == 1) return kDecNotDecodable;
  const uint64_t nb = num_blocks(n), doff = data_offset(n);
  const uint64_t data_bytes = ld64(in + kOffDataBytes);
  bool ok = in[kOffStatus] == 0 && in[kOffBlockLog2] == kBlockLog2 && in[kOffStreams] == kStreams &&
            in[kOffMaxLen] == kMaxLen && in[35] == 0 && ld64(in + kOffNumBlocks) == nb &&
            ld32(in + kOffRawBlocks) <= nb && data_bytes <= used - doff && align128(doff + data_bytes) == used;
  for (uint64_t i = kDirOff + 2 * nb; i < doff && ok; ++i) ok = in[i] == 0;  // dir padding
  return ok ? kDecOk : kDecBadHeader;
}

// One CTA per row: header status, then the directory (sizes in range, their sum,
// the RAW count) with the block offsets stored in the workspace, and the checksum
// terms of the header and directory.
template <DtypeCode D>
__global__ void __launch_bounds__(kRowThreads) ent_decode_rows(DecArgs a) {
  ZC_SHARED(uint64_t, red, [kRowThreads / 32]);
  ZC_SHARED(uint32_t, sh, [2]);  // status, a size out of range
  const uint64_t row = blockIdx.x;
  const uint8_t* in = a.in + row * a.L;
  uint8_t* ws = a.ws + row * a.ws_row;
  const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    sh[0] = (uint32_t)header_status<D>(in, a.L, a.n);
    sh[1] = 0;
  }
  __syncthreads();
  if (sh[0] != kDecOk) {
    if (tid == 0) *reinterpret_cast<uint32_t*>(ws + kWsHead) = sh[0];
    return;
  }
  const uint64_t nb = a.nb, doff = data_offset(a.n);
  const uint64_t data_bytes = ld64(in + kOffDataBytes), used = ld64(in + kOffUsed);
  uint64_t* off = reinterpret_cast<uint64_t*>(ws + kWsTab);
  // Thread t owns the contiguous blocks [b0, b1): its sizes are summed (independent
  // loads), the sums scanned over the CTA, then the offsets written in a second pass.
  // (One chunk of 256 blocks per barrier, as before, took ~1.5 K cycles per chunk on
  // one SM: ~25 us for a 64 MiB row.)
  const uint64_t per = (nb + kRowThreads - 1) / kRowThreads;
  const uint64_t b0 = tid * per < nb ? tid * per : nb, b1 = b0 + per < nb ? b0 + per : nb;
  uint64_t mine = 0;
  bool bad = false;
  for (uint64_t b = b0; b < b1; ++b) {
    const uint32_t sz = ld16(in + kDirOff + 2 * b);
    bad |= sz < kBlockHead || sz > max_block_bytes(block_len(a.n, b));
    mine += sz;
  }
  if (bad) sh[1] = 1;
  uint64_t incl = mine;
#pragma unroll
  for (uint32_t d = 1; d < 32; d <<= 1) {
    const uint64_t o = __shfl_up_sync(kFull, incl, d);
    if (lane >= d) incl += o;
  }
  if (lane == 31) red[warp] = incl;
  __syncthreads();
  uint64_t carry = doff, pos = doff + incl - mine;
  for (uint32_t w = 0; w < kRowThreads / 32; ++w) {
    carry += red[w];
    if (w < warp) pos += red[w];
  }
  uint32_t st = kDecOk;
  uint32_t raws = 0;
  const bool valid = !sh[1] && carry == doff + data_bytes;  // then every block lies inside [doff, used)
  if (!valid) st = kDecBadTable;
  for (uint64_t b = b0; b < b1; ++b) {
    off[b] = pos;
    if (valid) raws += in[pos] == 0;
    pos += ld16(in + kDirOff + 2 * b);
  }
  __syncthreads();  // red is reused below
  uint64_t cs = 0;
  for (uint64_t w = tid; w < doff / 4; w += kRowThreads)
    if (w != kOffChecksum / 4 && w != kOffChecksum / 4 + 1) cs += (uint64_t)ld32(in + 4 * w) * (2 * w + 1);
  if (nb == 0)
    for (uint64_t w = doff / 4 + tid; w < used / 4; w += kRowThreads) cs += (uint64_t)ld32(in + 4 * w) * (2 * w + 1);
  const uint64_t sum = cta_sum64<kRowThreads>(cs, red);
  __syncthreads();
  const uint64_t nraw = cta_sum64<kRowThreads>(raws, red);
  if (tid == 0) {
    if (st == kDecOk && nraw != ld32(in + kOffRawBlocks)) st = kDecBadTable;
    off[nb] = carry;
    *reinterpret_cast<uint64_t*>(ws + kWsSum) = sum;
    *reinterpret_cast<uint32_t*>(ws + kWsHead) = st;
  }
}

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

// One CTA per row: the status by the CPU's priority (row checks, the smallest
// block error, the checksum); a row with a nonzero status becomes all-one bits.
__global__ void __launch_bounds__(kRowThreads) ent_decode_finalize(DecArgs a, int32_t* status) {
  ZC_SHARED(uint32_t, sst, );
  const uint64_t row = blockIdx.x;
  const uint8_t* ws = a.ws + row * a.ws_row;
  if (threadIdx.x == 0) {
    uint32_t st = *reinterpret_cast<const uint32_t*>(ws + kWsHead);
    if (st == kDecOk) {
      const uint32_t f = *reinterpret_cast<const uint32_t*>(ws + kWsCount);
      if (f & (1u << kDecBadTable))
        st = kDecBadTable;
      else if (f & (1u << kDecBadStream))
        st = kDecBadStream;
      else if (*reinterpret_cast<const uint64_t*>(ws + kWsSum) != ld64(a.in + row * a.L + kOffChecksum))
        st = kDecBadChecksum;
    }
    sst = st;
    status[row] = (int32_t)st;
  }
  __syncthreads();
  if (sst != kDecOk) {
    uint16_t* y = a.y + row * a.n;
    for (uint64_t j = threadIdx.x; j < a.n; j += kRowThreads) y[j] = 0xFFFF;
  }
}

// ---- host side -----------------------------------------------------------------------

namespace ffi = ::xla::ffi;

constexpr const char* kEnc = "zipccl_entropy_encode";
constexpr const char* kDec = "zipccl_entropy_decode";
constexpr uint64_t kMaxGrid = 0x7FFFFFFFu;

using ::zipccl::dev::check_launch;
using ::zipccl::dev::cuda_error;

bool ent_dtype(ffi::DataType t, DtypeCode* d) {
  switch (t) {
    case ffi::DataType::BF16: *d = kBF16; return true;
    case ffi::DataType::F16: *d = kF16; return true;
    default: return false;
  }
}

using ::zipccl::handler::split_dims;
using ::zipccl::handler::str;

bool aligned(const void* p, uintptr_t k) { return (reinterpret_cast<uintptr_t>(p) & (k - 1)) == 0; }

template <DtypeCode D>
ffi::Error encode_launch(cudaStream_t stream, const EncArgs& a, uint64_t rows, int32_t* stats) {
  if (const cudaError_t e = cudaMemsetAsync(a.ws, 0, rows * a.ws_row, stream); e != cudaSuccess)
    return cuda_error(kEnc, "workspace memset", e);
  if (rows * a.nb != 0) {
    ZC_LAUNCH(ent_encode_kernel<D>, rows * a.nb, kEncThreads, stream, a);
    ffi::Error e = check_launch(kEnc, "ent_encode_kernel launch");
    if (e.failure()) return e;
  }
  // (rows * ctas <= 2^31 - 1: the handler checks rows * nb, and a row of n elements
  // has out_row / 64 KiB < nb + 1 chunks.)
  const uint32_t ctas = (uint32_t)((a.out_row + kTailBytes - 1) / kTailBytes);
  ZC_LAUNCH(ent_encode_tail, rows * ctas, kRowThreads, stream, a, ctas);
  if (ffi::Error e = check_launch(kEnc, "ent_encode_tail launch"); e.failure()) return e;
  ZC_LAUNCH(ent_encode_finalize<D>, rows, kRowThreads, stream, a, stats);
  return check_launch(kEnc, "ent_encode_finalize launch");
}

template <DtypeCode D>
ffi::Error decode_launch(cudaStream_t stream, const DecArgs& a, uint64_t rows, int32_t* status) {
  if (const cudaError_t e = cudaMemsetAsync(a.ws, 0, rows * a.ws_row, stream); e != cudaSuccess)
    return cuda_error(kDec, "workspace memset", e);
  ZC_LAUNCH(ent_decode_rows<D>, rows, kRowThreads, stream, a);
  ffi::Error e = check_launch(kDec, "ent_decode_rows launch");
  if (e.failure()) return e;
  if (rows * a.nb != 0) {
    ZC_LAUNCH(ent_decode_blocks<D>, (rows * a.nb + kDecG - 1) / kDecG, kDecThreads, stream, a);
    e = check_launch(kDec, "ent_decode_blocks launch");
    if (e.failure()) return e;
  }
  ZC_LAUNCH(ent_decode_finalize, rows, kRowThreads, stream, a, status);
  return check_launch(kDec, "ent_decode_finalize launch");
}

}  // namespace

// skip and fill (handler_common.h): every row is coded (reading skip on the host
// would cost a synchronization), then launch_skip_stats / launch_skip_fill
// (device_util.h) give the skipped rows the CPU handlers' results.
ffi::Error EntropyEncodeCudaImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Buffer<ffi::U8> skip,
                                 ffi::Result<ffi::Buffer<ffi::U8>> payload,
                                 ffi::Result<ffi::Buffer<ffi::S32>> stats,
                                 ffi::Result<ffi::Buffer<ffi::U8>> workspace) {
  DtypeCode d;
  if (!ent_dtype(x.element_type(), &d))
    return ffi::Error::InvalidArgument(std::string(kEnc) + ": x must be bfloat16 or float16");
  uint64_t rows, n, prow, nbytes, srow, four, wrow, wbytes;
  split_dims(x.dimensions(), &rows, &n);
  split_dims(payload->dimensions(), &prow, &nbytes);
  split_dims(stats->dimensions(), &srow, &four);
  split_dims(workspace->dimensions(), &wrow, &wbytes);
  if (n >= (1ull << 32))
    return ffi::Error::InvalidArgument(std::string(kEnc) + ": rows of >= 2^32 elements are not supported");
  const uint64_t want = max_nbytes(d, n), wneed = workspace_nbytes(n);
  if (prow != rows || nbytes != want)
    return ffi::Error::InvalidArgument(std::string(kEnc) + ": payload must be [" + str(rows) + ", " + str(want) +
                                       "] bytes, got [" + str(prow) + ", " + str(nbytes) + "]");
  if (srow != rows || four != 4)
    return ffi::Error::InvalidArgument(std::string(kEnc) + ": stats must be [" + str(rows) + ", 4]");
  if (ffi::Error e = ::zipccl::handler::check_skip(kEnc, skip.element_count(), rows); e.failure()) return e;
  if (wrow != rows || wbytes != wneed)
    return ffi::Error::InvalidArgument(std::string(kEnc) + ": workspace must be [" + str(rows) + ", " +
                                       str(wneed) + "] bytes, got [" + str(wrow) + ", " + str(wbytes) + "]");
  if (rows == 0) return ffi::Error::Success();
  if (rows > kMaxGrid || rows * num_blocks(n) > kMaxGrid)
    return ffi::Error::InvalidArgument(std::string(kEnc) + ": too many rows or blocks for one call");
  EncArgs a;
  a.x = static_cast<const uint16_t*>(x.untyped_data());
  a.out = payload->typed_data();
  a.ws = workspace->typed_data();
  if (!aligned(a.x, 2) || !aligned(a.ws, 16))
    return ffi::Error::InvalidArgument(std::string(kEnc) + ": x must be 2-byte and workspace 16-byte aligned");
  a.n = n;
  a.nb = num_blocks(n);
  a.out_row = nbytes;
  a.ws_row = wbytes;
  int32_t* st = stats->typed_data();
  ffi::Error e = d == kBF16 ? encode_launch<kBF16>(stream, a, rows, st) : encode_launch<kF16>(stream, a, rows, st);
  if (e.failure()) return e;
  return dev::launch_skip_stats(kEnc, stream, skip.typed_data(), st, rows);
}

ffi::Error EntropyDecodeCudaImpl(cudaStream_t stream, ffi::Buffer<ffi::U8> payload, ffi::Buffer<ffi::U8> skip,
                                 ffi::AnyBuffer fill, ffi::Result<ffi::AnyBuffer> y,
                                 ffi::Result<ffi::Buffer<ffi::S32>> status,
                                 ffi::Result<ffi::Buffer<ffi::U8>> workspace) {
  DtypeCode d;
  if (!ent_dtype(y->element_type(), &d))
    return ffi::Error::InvalidArgument(std::string(kDec) + ": output must be bfloat16 or float16");
  uint64_t rows, nbytes, yrows, n, wrow, wbytes;
  split_dims(payload.dimensions(), &rows, &nbytes);
  split_dims(y->dimensions(), &yrows, &n);
  split_dims(workspace->dimensions(), &wrow, &wbytes);
  if (yrows != rows)
    return ffi::Error::InvalidArgument(std::string(kDec) + ": payload has " + str(rows) +
                                       " rows but the output has " + str(yrows));
  if (status->element_count() != (size_t)rows)
    return ffi::Error::InvalidArgument(std::string(kDec) + ": status must have one entry per row");
  uint64_t group = 0;
  if (ffi::Error e = ::zipccl::handler::check_skip(kDec, skip.element_count(), rows); e.failure()) return e;
  if (ffi::Error e = ::zipccl::handler::check_fill(kDec, fill.element_type(), y->element_type(), fill.dimensions(), rows, n, &group);
      e.failure())
    return e;
  if (n >= (1ull << 32))
    return ffi::Error::InvalidArgument(std::string(kDec) + ": rows of >= 2^32 elements are not supported");
  const uint64_t wneed = workspace_nbytes(n);
  if (wrow != rows || wbytes != wneed)
    return ffi::Error::InvalidArgument(std::string(kDec) + ": workspace must be [" + str(rows) + ", " +
                                       str(wneed) + "] bytes, got [" + str(wrow) + ", " + str(wbytes) + "]");
  if (rows == 0) return ffi::Error::Success();
  if (rows > kMaxGrid || rows * num_blocks(n) > kMaxGrid)
    return ffi::Error::InvalidArgument(std::string(kDec) + ": too many rows or blocks for one call");
  DecArgs a;
  a.in = payload.typed_data();
  a.y = static_cast<uint16_t*>(y->untyped_data());
  a.ws = workspace->typed_data();
  if (!aligned(a.y, 2) || !aligned(a.ws, 16))
    return ffi::Error::InvalidArgument(std::string(kDec) + ": output must be 2-byte and workspace 16-byte aligned");
  a.L = nbytes;
  a.n = n;
  a.nb = num_blocks(n);
  a.ws_row = wbytes;
  a.nblk = rows * a.nb;
  int32_t* st = status->typed_data();
  ffi::Error e = d == kBF16 ? decode_launch<kBF16>(stream, a, rows, st) : decode_launch<kF16>(stream, a, rows, st);
  if (e.failure()) return e;
  return dev::launch_skip_fill(kDec, stream, skip.typed_data(), fill.untyped_data(), a.y, st, rows, 2 * n, group);
}

int warm_up_entropy() {
  return dev::for_each_device([] {
    cudaFuncAttributes attr;
    cudaFuncGetAttributes(&attr, ent_encode_kernel<kBF16>);
    cudaFuncGetAttributes(&attr, ent_encode_kernel<kF16>);
    cudaFuncGetAttributes(&attr, ent_encode_finalize<kBF16>);
    cudaFuncGetAttributes(&attr, ent_encode_finalize<kF16>);
    cudaFuncGetAttributes(&attr, ent_encode_tail);
    cudaFuncGetAttributes(&attr, ent_decode_rows<kBF16>);
    cudaFuncGetAttributes(&attr, ent_decode_rows<kF16>);
    cudaFuncGetAttributes(&attr, ent_decode_blocks<kBF16>);
    cudaFuncGetAttributes(&attr, ent_decode_blocks<kF16>);
#if !defined(ZIPCCL_SIMT_HOST)
    // ~14 one-warp CTAs of ~15 KB each per SM need the largest shared-memory carveout.
    cudaFuncSetAttribute(ent_decode_blocks<kBF16>, cudaFuncAttributePreferredSharedMemoryCarveout,
                         cudaSharedmemCarveoutMaxShared);
    cudaFuncSetAttribute(ent_decode_blocks<kF16>, cudaFuncAttributePreferredSharedMemoryCarveout,
                         cudaSharedmemCarveoutMaxShared);
#endif
    cudaFuncGetAttributes(&attr, ent_decode_finalize);
  });
}

}  // namespace gpu
}  // namespace ent
}  // namespace zipccl

namespace ffi = ::xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEntropyEncodeCuda, zipccl::ent::gpu::EntropyEncodeCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::AnyBuffer>()                     // x [..., n]
                                  .Arg<ffi::Buffer<ffi::U8>>()               // skip [...]
                                  .Ret<ffi::Buffer<ffi::U8>>()               // payload [..., max_nbytes]
                                  .Ret<ffi::Buffer<ffi::S32>>()              // stats [..., 4]
                                  .Ret<ffi::Buffer<ffi::U8>>(),              // workspace [..., W]
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEntropyDecodeCuda, zipccl::ent::gpu::EntropyDecodeCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::Buffer<ffi::U8>>()               // payload [..., L]
                                  .Arg<ffi::Buffer<ffi::U8>>()               // skip [...]
                                  .Arg<ffi::AnyBuffer>()                     // fill [F, n]
                                  .Ret<ffi::AnyBuffer>()                     // y [..., n]
                                  .Ret<ffi::Buffer<ffi::S32>>()              // status [...]
                                  .Ret<ffi::Buffer<ffi::U8>>(),              // workspace [..., W]
                              {ffi::Traits::kCmdBufferCompatible});
