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
//      already run). Histogram of the joint (exponent, sign) symbols in shared
//      memory; code lengths of both kinds by package-merge (one thread per kind,
//      shared-memory lists, the leaf order by a parallel rank); the block's mode and
//      size; its byte offset in the row by a decoupled look-back over per-block
//      states in the workspace; then the block is written straight to its final
//      place: warp s codes stream s (a lane codes 16 elements at its bit offset from
//      a warp scan, ORed into big-endian words in shared memory), raw planes by
//      element/group. Every byte written adds its checksum term (the checksum is
//      linear in the bytes: byte i contributes byte << 8(i mod 4) times 2(i/4)+1).
//   3. ent_encode_finalize (a CTA per row): header, checksum, stats.
// Decoder: memset(workspace); ent_decode_rows (a CTA per row: header checks in the
// CPU's order, directory sizes, block offsets into the workspace, raw-block count);
// ent_decode_blocks (a CTA per block: block validation as the CPU, a 2048-entry
// table, the 8 streams decoded by 8 threads, raw planes joined; findings and
// checksum terms into the workspace); ent_decode_finalize (status by the CPU's
// priority, all-one rows on error).
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
constexpr int kDecThreads = 128;
// ent_decode_blocks: 7 CTAs per SM (register cap 72). At 8 (cap 64) ptxas spills a
// few registers; the shared memory (~22 KB per CTA) would allow 9-10.
constexpr int kDecMinCtas = 7;
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

template <DtypeCode D>
__host__ __device__ constexpr Traits traits_c() {
  return D == kBF16 ? Traits{8, 7} : Traits{5, 10};
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
  static constexpr uint32_t AE = 1u << traits_c<D>().ebits, AJ = 2 * AE;
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
  // Kind J is a HUFF candidate only when 16 * imbalance >= len (format rule):
  // otherwise its k >= 2 is recorded as 0, which skips its package-merge and size.
  const uint32_t kJraw = kAll - kE;
  const uint32_t kJ = kJraw >= 2 && 16 * imb < len ? 0 : kJraw;
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
  // HUFF-E, HUFF-J, RAW), its offset by a decoupled look-back (32 predecessors per
  // round trip), the directory entry.
  if (warp == 0) {
    uint32_t best = max_block_bytes(len), coding = kRaw, kind = 0;
    for (uint32_t c = 0; c < 4; ++c) {
      const uint32_t kd = c & 1;
      uint32_t sz = ~0u;
      if (c < 2 && s.k[kd] == 1) sz = kBlockHead + t.raw_bytes(kd, len);
      if (c >= 2 && s.k[kd] >= 2) sz = kHuffHead + (s.acc[2 + kd] + 1) / 2 + (s.acc[kd] + 7) / 8 + t.raw_bytes(kd, len);
      if (sz < best) {
        best = sz;
        coding = c < 2 ? kConst : kHuff;
        kind = kd;
      }
    }
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
      out[kHeaderBytes + 2 * b] = (uint8_t)best;
      out[kHeaderBytes + 2 * b + 1] = (uint8_t)(best >> 8);
      // The block's zero header bytes (no checksum term): byte 1, and 0..3 of RAW.
      uint8_t* bh = out + data_offset(a.n) + excl;
      bh[1] = 0;
      if (coding == kRaw) bh[0] = bh[2] = bh[3] = 0;
      if (coding == kRaw) atomicAdd(reinterpret_cast<unsigned*>(ws + kWsCount), 1u);
      if (b + 1 == a.nb) *reinterpret_cast<uint64_t*>(ws + kWsData) = excl + best;
    }
  }
  __syncthreads();

  const uint32_t coding = s.coding, kind = s.kind;
  const uint64_t blk = data_offset(a.n) + s.base;  // row offset of the block
  uint64_t cs = 0;
  auto put = [&](uint32_t i, uint32_t v) {
    const uint64_t pos = blk + i;
    out[pos] = (uint8_t)v;
    cs += cs_byte(pos, v & 0xFF);
  };
  // Raw planes at block offset off (entropy_format.h: byte plane, packed plane).
  auto put_raw = [&](uint32_t off) {
    const bool bp = t.byte_plane(kind);
    const uint32_t w = t.packed_width(kind);
    if (bp)
      for (uint32_t j = tid; j < len; j += NT) put(off + j, t.raw(kind, s.x[j]) & 0xFF);
    if (w) {
      const uint32_t poff = off + (bp ? len : 0);
      for (uint32_t g = tid; g < (len + 7) / 8; g += NT) {
        uint64_t acc = 0;
        for (uint32_t k = 0; k < 8 && 8 * g + k < len; ++k)
          acc |= (uint64_t)(t.raw(kind, s.x[8 * g + k]) >> (bp ? 8 : 0)) << (k * w);
        for (uint32_t i = 0; i < w; ++i) put(poff + g * w + i, (uint32_t)(acc >> (8 * i)) & 0xFF);
      }
    }
  };

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
      const uint32_t sym = s.sym_end[kind] - 1;
      put(0, kConst | (kind << 2));
      put(2, sym & 0xFF);
      put(3, sym >> 8);
    }
    put_raw(kBlockHead);
  } else {
    const uint32_t k = s.k[kind], nn = s.acc[2 + kind];
    const uint32_t nib = (nn + 1) / 2, ab = (s.acc[kind] + 7) / 8;
    const uint16_t* list = s.list[kind];
    const uint8_t* lens = s.len[kind];
    // 9. Canonical codes (entropy_format.h canonical_codes): a symbol of length l gets
    // next[l] (the first code of length l) + its rank among the symbols of length l in
    // symbol order. The code-length nibble offsets by a CTA scan (each thread two
    // adjacent present symbols).
    uint32_t* ctab = s.u.c.ctab;
    for (uint32_t i = tid; i < (ab + 3) / 4 + 1; i += NT) s.u.c.area[i] = 0;
    for (uint32_t pos = tid; pos < k; pos += NT) {
      const uint32_t sym = list[pos], l = lens[sym];
      uint32_t c = 0;
      for (uint32_t m = 1; m < l; ++m) c = (c + s.nl[kind][m]) << 1;
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
    for (uint32_t i = 0; i < kPerLane && j0 + i < len; ++i) mine += ctab[t.symbol(kind, s.x[j0 + i])] & 15;
    const uint32_t incl = warp_incl_scan(mine);
    const uint32_t total = __reduce_add_sync(kFull, mine);
    if (lane == 0) s.sbits[warp] = total;
    __syncthreads();  // (S) every stream's bit count is in s.sbits
    uint32_t q = incl - mine;
    for (uint32_t w = 0; w < warp; ++w) q += s.sbits[w];
    for (uint32_t i = 0; i < kPerLane && j0 + i < len; ++i) {
      const uint32_t e = ctab[t.symbol(kind, s.x[j0 + i])];
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
      put(2, s.sym_end[kind] & 0xFF);
      put(3, s.sym_end[kind] >> 8);
    }
    for (uint32_t i = tid; i < nib; i += NT) put(kHuffHead + i, s.u.c.nbuf[2 * i] | (s.u.c.nbuf[2 * i + 1] << 4));
    __syncthreads();
    const uint32_t aoff = kHuffHead + nib;
    for (uint32_t i = tid; i < ab; i += NT) put(aoff + i, (s.u.c.area[i >> 2] >> (24 - 8 * (i & 3))) & 0xFF);
    put_raw(aoff + ab);
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
  // The zero bytes of the header (35, 56..127) and the directory's padding (the
  // payload is not memset).
  for (uint64_t i = threadIdx.x; i < kHeaderBytes - kHeaderUsed; i += kRowThreads) out[kHeaderUsed + i] = 0;
  for (uint64_t i = kHeaderBytes + 2 * nb + threadIdx.x; i < doff; i += kRowThreads) out[i] = 0;
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
  for (uint32_t i = kHeaderUsed; i < kHeaderBytes && ok; ++i) ok = in[i] == 0;
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
    const uint32_t sz = ld16(in + kHeaderBytes + 2 * b);
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
    pos += ld16(in + kHeaderBytes + 2 * b);
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

// The number of zero bytes of x (exact: no borrow between bytes).
__device__ __forceinline__ uint32_t zero_bytes(uint32_t x) {
  const uint32_t y = (x & 0x7F7F7F7Fu) + 0x7F7F7F7Fu;
  return popc32(~(y | x | 0x7F7F7F7Fu));
}

// The decoder's symbol array: stream s's 512 entries start 2 s entries (one bank) past
// 512 s, so that the 8 decoding lanes store into 8 different banks.
__device__ __forceinline__ uint32_t yslot(uint32_t j) { return j + 2 * (j >> 9); }

// Joins the symbols' bits (sym_bits) with the raw planes at rp (entropy_format.h) and stores the
// block's len elements: a group of 8 elements per step (its packed-plane bytes read
// once), 16-byte stores where the output allows. The kind is a template parameter
// so that plane widths and shifts are constants.
template <DtypeCode D, uint32_t KIND>
__device__ __forceinline__ void join_planes(const uint16_t* sy, const uint8_t* rp, uint16_t* y, uint32_t len) {
  constexpr Traits t = traits_c<D>();
  // entropy_format.h Traits::byte_plane / packed_width, as constants.
  constexpr uint32_t width = KIND == kKindE ? t.mbits + 1 : t.mbits;
  constexpr bool bp = width >= 8;
  constexpr uint32_t w = bp ? width - 8 : width;
  const uint8_t* pp = rp + (bp ? len : 0);
  const bool vec = (reinterpret_cast<uintptr_t>(y) & 15) == 0;
  for (uint32_t g = threadIdx.x; g < (len + 7) / 8; g += kDecThreads) {
    uint64_t acc = 0;
    if constexpr (w > 0) {
#pragma unroll
      for (uint32_t i = 0; i < w; ++i) acc |= (uint64_t)pp[g * w + i] << (8 * i);
    }
    uint32_t v[4] = {0, 0, 0, 0};  // elements 2i, 2i + 1 of the group
#pragma unroll
    for (uint32_t k = 0; k < 8; ++k) {
      const uint32_t j = 8 * g + k;
      uint32_t r = w ? (uint32_t)(acc >> (k * w)) & ((1u << w) - 1) : 0u;
      if (bp) r = (r << 8) | (j < len ? rp[j] : 0u);
      v[k / 2] |= (t.sym_bits(KIND, sy[yslot(j < len ? j : 0)]) | t.raw_bits(KIND, r)) << (16 * (k & 1));
    }
    if (vec && 8 * g + 8 <= len) {
      reinterpret_cast<uint4*>(y)[g] = make_uint4(v[0], v[1], v[2], v[3]);
    } else {
#pragma unroll
      for (uint32_t k = 0; k < 8; ++k)
        if (8 * g + k < len) y[8 * g + k] = (uint16_t)(v[k / 2] >> (16 * (k & 1)));
    }
  }
}

struct DecSmem {
  uint16_t y[kBlock + 2 * kStreams];  // the symbol of element j at yslot(j)
  uint16_t tab[kTableSize];           // one symbol: sym << 4 | code length (0 = not yet filled)
  uint32_t tab2[kTableSize];          // up to two symbols: see ent_decode_blocks, (d)
  uint32_t area[kMaxArea / 4 + 4];    // the bit area as big-endian words, zero past its end
  alignas(4) uint8_t len[kMaxAlphabet];  // read as words by the canonical-code ranks
  uint32_t nl[kMaxLen + 1];           // present symbols per code length
  uint32_t next[kMaxLen + 1];         // the first canonical code of each length
  uint64_t red[kDecThreads / 32];
  uint32_t scan[kDecThreads / 32];
  uint32_t start[kStreams + 1];
  uint32_t status, coding, kind, sym_end, area_off, ab, bad, lens_ok;
};

// One CTA per block of every row whose header and directory passed.
template <DtypeCode D>
__global__ void __launch_bounds__(kDecThreads, kDecMinCtas) ent_decode_blocks(DecArgs a) {
  constexpr Traits t = traits_c<D>();
  constexpr int NT = kDecThreads;
  ZC_SHARED(DecSmem, s, );
  // blockIdx.x < 2^31 (the grid is checked on the host): row and block fit 32 bits.
  const uint32_t row = (uint32_t)(blockIdx.x / a.nb), b = (uint32_t)(blockIdx.x - row * a.nb);
  const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint8_t* blk;
  uint32_t size;
  {
    const uint8_t* ws = a.ws + (uint64_t)row * a.ws_row;
    if (*reinterpret_cast<const uint32_t*>(ws + kWsHead) != kDecOk) return;  // the same for the whole CTA
    const uint64_t* off = reinterpret_cast<const uint64_t*>(ws + kWsTab);
    const uint64_t o0 = off[b], o1 = off[b + 1];
    size = (uint32_t)(o1 - o0);
    blk = a.in + (uint64_t)row * a.L + o0;
  }
  const uint32_t len = block_len(a.n, b);

  // Thread 0: the block's header, code lengths and stream lengths, validated as the
  // CPU decoder does; the Kraft sum of the lengths (the rest of canonical_codes'
  // check) follows in parallel. Its failure is BAD_TABLE, which takes precedence
  // over everything thread 0 can find after the lengths (BAD_TABLE or BAD_STREAM).
  for (uint32_t i = tid; i <= kMaxLen; i += NT) s.nl[i] = 0;
  if (tid == 0) {
    uint32_t st = kDecOk, coding = 0, kind = 0, lens_ok = 0;
    if (size < kBlockHead || blk[1] != 0) {
      st = kDecBadTable;
    } else {
      coding = blk[0] & 3;
      kind = blk[0] >> 2;
      if (coding == kRaw) {
        if (blk[0] != 0 || ld16(blk + 2) != 0 || size != max_block_bytes(len)) st = kDecBadTable;
      } else if (kind > 1 || coding > kHuff) {
        st = kDecBadTable;
      } else {
        const uint32_t A = t.alphabet(kind), rawb = t.raw_bytes(kind, len);
        if (coding == kConst) {
          if (ld16(blk + 2) >= A || size != kBlockHead + rawb) st = kDecBadTable;
        } else if (size < kHuffHead + rawb) {
          st = kDecBadTable;
        } else {
          // read_lengths sets len[0, sym_end) (sym_end <= A when it succeeds); nothing past it is read.
          const uint32_t sym_end = ld16(blk + 2);
          const int32_t nib = read_lengths(blk + kHuffHead, size - kHuffHead - rawb, sym_end, A, s.len);
          s.sym_end = sym_end;
          if (nib < 0) {
            st = kDecBadTable;
          } else {
            lens_ok = 1;
            s.start[0] = 0;
            for (uint32_t k = 0; k < kStreams && st == kDecOk; ++k) {
              const uint32_t j0 = k * kStreamLen < len ? k * kStreamLen : len;
              const uint32_t j1 = j0 + kStreamLen < len ? j0 + kStreamLen : len;
              const uint32_t cnt = j1 - j0, bits = ld16(blk + kBlockHead + 2 * k);
              if (bits < cnt || bits > kMaxLen * cnt) st = kDecBadTable;
              s.start[k + 1] = s.start[k] + bits;
            }
            if (st == kDecOk) {
              const uint32_t total = s.start[kStreams], ab = (total + 7) / 8;
              const uint32_t area_off = kHuffHead + (uint32_t)nib;
              if (size != area_off + ab + rawb)
                st = kDecBadTable;
              else if ((total & 7) && (blk[area_off + ab - 1] & ((1u << (8 - (total & 7))) - 1)))
                st = kDecBadStream;
              s.area_off = area_off;
              s.ab = ab;
            }
          }
        }
      }
    }
    s.status = st;
    s.coding = coding;
    s.kind = kind;
    s.lens_ok = lens_ok;
    s.bad = 0;
  }
  __syncthreads();
  const uint32_t coding = s.coding, kind = s.kind;
  uint32_t st = s.status;
  if (s.lens_ok) {
    // (a) lengths per code length; the table cleared; the bit area as words.
    const uint32_t sym_end = s.sym_end;
    for (uint32_t sym = tid; sym < sym_end; sym += NT)
      if (const uint32_t l = s.len[sym]) atomicAdd(&s.nl[l], 1u);
    for (uint32_t i = tid; i < kTableSize; i += NT) s.tab[i] = 0;
    if (st == kDecOk) {
      const uint32_t ab = s.ab, nw = (ab + 3) / 4 + 2;
      const uint8_t* ap = blk + s.area_off;
      for (uint32_t i = tid; i < nw; i += NT) {
        uint32_t w = 0;
        for (uint32_t k = 0; k < 4; ++k) w = (w << 8) | (4 * i + k < ab ? ap[4 * i + k] : 0u);
        s.area[i] = w;
      }
    }
    __syncthreads();
    // (b) Kraft sum (every thread: the same value), then each present symbol's
    // canonical code (entropy_format.h canonical_codes: next[l] + its rank among the
    // symbols of length l in symbol order) marks the first entry of its table range.
    uint32_t kraft = 0;
    for (uint32_t l = 1; l <= kMaxLen; ++l) kraft += s.nl[l] << (kMaxLen - l);
    if (kraft != kTableSize) st = kDecBadTable;
    if (tid == 0) {  // the first code of each length
      uint32_t c = 0;
      for (uint32_t l = 1; l <= kMaxLen; ++l) {
        s.next[l] = c;
        c = (c + s.nl[l]) << 1;
      }
    }
    __syncthreads();
    if (st == kDecOk) {
      for (uint32_t sym = tid; sym < sym_end; sym += NT) {
        const uint32_t l = s.len[sym];
        if (!l) continue;
        uint32_t c = s.next[l];
        // + the symbols below sym of length l, four length bytes per step.
        const uint32_t* lw = reinterpret_cast<const uint32_t*>(s.len);
        const uint32_t pat = l * 0x01010101u;
#pragma unroll 1
        for (uint32_t o = 0; o < sym / 4; ++o) c += zero_bytes(lw[o] ^ pat);
        if (sym & 3) c += zero_bytes((lw[sym / 4] ^ pat) | (0xFFFFFFFFu << (8 * (sym & 3))));
        s.tab[c << (kMaxLen - l)] = (uint16_t)((sym << 4) | l);
      }
    }
    __syncthreads();
    if (st == kDecOk) {
      // (c) Fill each range from its marked first entry: thread t owns entries
      // [16 t, 16 t + 16); the owner of its first entry is the last marked entry
      // before it (a max-scan over the threads).
      constexpr uint32_t E = kTableSize / NT;
      static_assert(kTableSize % NT == 0, "table entries per thread");
      int32_t last = -1;
#pragma unroll 4
      for (uint32_t i = 0; i < E; ++i)
        if (s.tab[E * tid + i]) last = (int32_t)(E * tid + i);
      int32_t incl = last;
#pragma unroll
      for (uint32_t d = 1; d < 32; d <<= 1) {
        const int32_t o = __shfl_up_sync(kFull, incl, d);
        if (lane >= d && o > incl) incl = o;
      }
      if (lane == 31) s.scan[warp] = (uint32_t)incl;
      __syncthreads();
      int32_t before = __shfl_up_sync(kFull, incl, 1);
      if (lane == 0) before = -1;
      for (uint32_t w = 0; w < warp; ++w)
        if ((int32_t)s.scan[w] > before) before = (int32_t)s.scan[w];
      // Entry 0 is always marked (the first code is 0), so before >= 0 where needed.
      uint32_t cur = before >= 0 ? s.tab[before] : 0u;  // (entry 0 is marked)
#pragma unroll 4
      for (uint32_t i = 0; i < E; ++i) {
        const uint32_t v = s.tab[E * tid + i];
        if (v) cur = v;
        else s.tab[E * tid + i] = (uint16_t)cur;
      }
      __syncthreads();
      // (d) The two-symbol table: entry i holds the symbol of the window i (length
      // l1) and, when the code that follows it lies inside the same 11 bits (l1 + l2
      // <= 11), the next symbol too: bits 0-3 l1, 4-7 l2 (0: none), 8-16 the first
      // symbol, 17-25 the second. The second is what a one-symbol lookup at the
      // position after the first would give: a code of length l2 is fixed by its
      // first l2 bits, and those are bits l1 .. l1 + l2 - 1 of the window.
      for (uint32_t i = tid; i < kTableSize; i += NT) {
        const uint32_t e1 = s.tab[i], l1 = e1 & 15;
        const uint32_t e2 = s.tab[(i << l1) & (kTableSize - 1)], l2 = e2 & 15;
        s.tab2[i] = l1 + l2 <= kMaxLen ? ((e2 >> 4) << 17) | ((e1 >> 4) << 8) | (l2 << 4) | l1
                                       : ((e1 >> 4) << 8) | l1;
      }
      __syncthreads();
      if (tid < kStreams) {
        // Stream tid through a 64-bit bit buffer (MSB first): 11-bit lookups, a 32-bit
        // refill whenever fewer than 32 bits remain. Words past the area read as zero
        // (a corrupt stream that runs past it is reported by its end position).
        const uint32_t j0 = tid * kStreamLen < len ? tid * kStreamLen : len;
        const uint32_t j1 = j0 + kStreamLen < len ? j0 + kStreamLen : len;
        const uint32_t q0 = s.start[tid], nw = (s.ab + 3) / 4 + 2;
        uint32_t wi = q0 >> 5;
        const uint32_t w0 = wi < nw ? s.area[wi] : 0u, w1 = wi + 1 < nw ? s.area[wi + 1] : 0u;
        uint64_t buf = (((uint64_t)w0 << 32) | w1) << (q0 & 31);
        uint32_t have = 64 - (q0 & 31), q = q0;
        wi += 2;
        for (uint32_t j = j0; j < j1;) {
          // One lookup, one or two symbols (the second only while the stream needs it).
          const uint32_t e = s.tab2[(uint32_t)(buf >> (64 - kMaxLen))];
          s.y[yslot(j)] = (uint16_t)((e >> 8) & 511);
          uint32_t l = e & 15;
          const uint32_t l2 = (e >> 4) & 15;
          if (l2 && j + 1 < j1) {
            s.y[yslot(j + 1)] = (uint16_t)(e >> 17);
            l += l2;
            j += 2;
          } else {
            j += 1;
          }
          buf <<= l;
          have -= l;
          q += l;
          if (have < 32) {
            buf |= (uint64_t)(wi < nw ? s.area[wi] : 0u) << (32 - have);
            ++wi;
            have += 32;
          }
        }
        if (q != s.start[tid + 1]) s.bad = 1;
      }
      __syncthreads();
      if (s.bad) st = kDecBadStream;
    }
  } else if (st == kDecOk && coding == kConst) {
    const uint16_t v = ld16(blk + 2);  // the symbol (< alphabet: checked)
    for (uint32_t j = tid; j < len; j += NT) s.y[yslot(j)] = v;
  }
  __syncthreads();
  if (st == kDecOk) {
    if (coding == kRaw) {
      uint16_t* y = a.y + row * a.n + (uint64_t)b * kBlock;
      for (uint32_t j = tid; j < len; j += NT) y[j] = ld16(blk + kBlockHead + 2 * j);
    } else {
      const uint8_t* rp = blk + (coding == kConst ? kBlockHead : s.area_off + s.ab);
      uint16_t* y = a.y + row * a.n + (uint64_t)b * kBlock;
      if (kind == kKindE)
        join_planes<D, kKindE>(s.y, rp, y, len);
      else
        join_planes<D, kKindJ>(s.y, rp, y, len);
    }
  }
  // The block's checksum terms; the row's last block also covers the padding up to
  // used. (The offsets are read again here rather than kept in registers through
  // the decoding: the output stores in between may alias, so the loads stay.)
  uint64_t cs = 0;
  {
    const uint8_t* rin = a.in + (uint64_t)row * a.L;
    const uint64_t* roff = reinterpret_cast<const uint64_t*>(a.ws + (uint64_t)row * a.ws_row + kWsTab);
    const uint64_t c0 = roff[b], end = b + 1 == a.nb ? ld64(rin + kOffUsed) : roff[b + 1];
    for (uint64_t i = c0 + tid; i < end; i += NT) cs += cs_byte(i, rin[i]);
  }
  const uint64_t sum = cta_sum64<NT>(cs, s.red);
  if (tid == 0) {
    uint8_t* ws = a.ws + (uint64_t)row * a.ws_row;
    if (st != kDecOk) atomicOr(reinterpret_cast<unsigned*>(ws + kWsCount), 1u << st);
    if (sum) atomicAdd(reinterpret_cast<unsigned long long*>(ws + kWsSum), (unsigned long long)sum);
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
    ZC_LAUNCH(ent_decode_blocks<D>, rows * a.nb, kDecThreads, stream, a);
    e = check_launch(kDec, "ent_decode_blocks launch");
    if (e.failure()) return e;
  }
  ZC_LAUNCH(ent_decode_finalize, rows, kRowThreads, stream, a, status);
  return check_launch(kDec, "ent_decode_finalize launch");
}

}  // namespace

// skip and fill (handler_common.h): checked, then every row is coded; a skipped
// row of the transport is its own row, whose payload is that row's encoding, so
// decoding it gives fill's bits. Reading skip would need the mask on the host.
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
  return d == kBF16 ? encode_launch<kBF16>(stream, a, rows, st) : encode_launch<kF16>(stream, a, rows, st);
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
  (void)group;  // every row is decoded (see above)
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
  int32_t* st = status->typed_data();
  return d == kBF16 ? decode_launch<kBF16>(stream, a, rows, st) : decode_launch<kF16>(stream, a, rows, st);
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
