// zipccl codec on CUDA GPUs: encode/decode kernels and their XLA FFI handlers
// (targets "zipccl_zipccl_encode" / "zipccl_zipccl_decode", platform "CUDA").
//
// The output is byte-identical to the CPU codec (ffi/window_cpu.cc) for every input:
// the layout math is ffi/window_format.h, the per-thread bit work cuda/window_tile.h
// (both also compiled for the host, where tests/cuda/emulate_window.cc checks them against
// the CPU codec). docs/cuda.md describes the design; in short:
//
// Encoder, per call (all rows), three stream operations, no host synchronisation:
//   1. cudaMemsetAsync(workspace, 0)
//   2. encode_kernel: persistent CTAs of 256 / G threads (G = 1, 2, 4 groups of 8
//      elements per thread: see groups_per_thread) take blocks ("tiles") in ticket
//      order from an atomic counter (a CTA only ever waits on tiles held by running
//      CTAs: no deadlock even when other kernels share the GPU). Input streams
//      through a cp.async ring (S - 1 tiles loading while one is processed). Per
//      tile: window statistics and the four refinement counts (two rounds of warp
//      reductions), codes and planes (SWAR), raw and plane stores, an escape prefix
//      sum (warp shuffles), the tile's escape offset by a single-pass decoupled
//      look-back over per-tile counts in the workspace, then the record and escape
//      bytes. Every thread sums the checksum terms of the words it writes (a
//      position-weighted word sum: order-independent), flushed with one atomicAdd
//      per warp and row.
//   3. encode_finalize: zeroes the unused escape bytes and writes the header (with
//      the checksum) and the stats.
// Decoder: memset, decode_kernel (grid-stride over tiles through the same kind of
// ring; each record checked locally against its neighbour, planes against the
// record, escapes read by offset and bounds-checked) and decode_finalize (header
// checks in the CPU's order, then the tiles' findings by priority, then the checksum).
#include "device_util.h"  // CUDA or, for tests/cuda/emulate_window.cc, the CPU SIMT emulator

#include <stdint.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "window_cuda.h"
#include "window_format.h"
#include "window_tile.h"
#include "env.h"
#include "handler_common.h"

namespace zipccl {
namespace gpu {
namespace {

using namespace ::zipccl::tile;

constexpr unsigned kFull = 0xFFFFFFFFu;
// The tile kernels come in variants of G = 1, 2 or 4 groups of 8 elements per
// thread (kPlaneBytes / G threads per CTA; see docs/cuda.md, "Groups per thread").
template <int G>
__host__ __device__ constexpr int tile_threads() {
  return (int)kPlaneBytes / G;
}
// __launch_bounds__ minimum CTAs per SM: it sets the register cap per thread,
// 65536 / (threads x CTAs): 48 / 64 / ~100 for 16-bit dtypes with G = 1 / 2 / 4,
// 64 / ~100 / 128 for fp32 (8 words per group), all without spills (ptxas -v).
template <typename T, int G>
constexpr int min_ctas() {
  return Cfg<T>::kBits == 16 ? (G == 1 ? 5 : G == 2 ? 8 : 10) : (G == 1 ? 4 : G == 2 ? 5 : 8);
}
constexpr uint32_t kMaxGridX = 0x7FFFFFFFu;
constexpr uint32_t kNoTicket = 0xFFFFFFFFu;  // >= any total_tiles

// ---- device helpers ----------------------------------------------------------------

using ::zipccl::dev::cp_async16;
using ::zipccl::dev::cp_async8;
using ::zipccl::dev::cp_commit;
using ::zipccl::dev::cp_wait;
using ::zipccl::dev::ld_relaxed;
using ::zipccl::dev::st_relaxed;

__device__ __forceinline__ void st_u64(uint8_t* p, uint64_t v) { *reinterpret_cast<uint64_t*>(p) = v; }
__device__ __forceinline__ uint64_t ld_u64(const uint8_t* p) { return *reinterpret_cast<const uint64_t*>(p); }

// Warp sum of a u64 (mod 2^64), in every lane.
__device__ __forceinline__ uint64_t warp_sum64(uint64_t x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

// Block sums of two u32 per thread in two steps around a barrier: warp_sums2 puts
// the warp's sums in s[warp] (lane 0), block_sums2 adds the NW entries up
// once every warp has stored them.
__device__ __forceinline__ void warp_sums2(uint32_t (*s)[2], uint32_t x, uint32_t y, int lane, int warp) {
  x = __reduce_add_sync(kFull, x);
  y = __reduce_add_sync(kFull, y);
  if (lane == 0) {
    s[warp][0] = x;
    s[warp][1] = y;
  }
}

template <int NW>
__device__ __forceinline__ uint2 block_sums2(const uint32_t (*s)[2]) {
  uint2 r = make_uint2(0, 0);
#pragma unroll
  for (int i = 0; i < NW; ++i) {
    r.x += s[i][0];
    r.y += s[i][1];
  }
  return r;
}

// Adds the warp's checksum terms to *slot (one atomic per warp; skipped if zero).
__device__ __forceinline__ void flush_sum(uint8_t* slot, uint64_t x, int lane) {
  x = warp_sum64(x);
  if (lane == 0 && x) atomicAdd(reinterpret_cast<unsigned long long*>(slot), (unsigned long long)x);
}

// ---- encoder -----------------------------------------------------------------------

struct EncArgs {
  const uint8_t* x;    // [rows, n] elements
  uint8_t* out;        // [rows, out_row] payload
  uint8_t* ws;         // [rows, ws_row] workspace (zeroed)
  uint64_t x_row;      // bytes per input row
  uint64_t out_row;    // bytes per payload row (= g.total)
  uint64_t ws_row;     // bytes per workspace row
  Geom g;
  uint32_t total_tiles;  // rows * g.tiles
};

// Starts loading tile `gt` (global ticket: row * tiles + block) into this thread's
// own slots `buf[q][tid]` of one ring stage -- its G groups, elements 8G*tid ..
// 8G*tid + 8G-1 of the block: 16-byte cp.async where the row is 16-byte aligned
// and the groups are complete, element loads (zero past the end) otherwise.
template <typename T, int G>
__device__ __forceinline__ void enc_issue(const EncArgs& a, uint32_t gt, uint4 (*buf)[tile_threads<G>()],
                                          int tid) {
  using C = Cfg<T>;
  constexpr int CPT = G * C::kGW / 4;  // 16-byte chunks per thread
  const uint32_t row = gt / a.g.tiles, b = gt - row * a.g.tiles;
  const uint8_t* xr = a.x + (uint64_t)row * a.x_row;
  const uint32_t len = block_len(a.g.n, b);
  const uint32_t j0 = 8u * G * tid;
  const uint8_t* src = xr + ((uint64_t)b * kBlock + j0) * C::kEsize;
  if ((reinterpret_cast<uintptr_t>(xr) & 15) == 0 && j0 + 8 * G <= len) {
#pragma unroll
    for (int q = 0; q < CPT; ++q) cp_async16(&buf[q][tid], src + 16 * q);
  } else {
    // Rare (the row's partial last group, or a row not 16-byte aligned): element by
    // element straight into the slots, zero past the end. Element k of the thread
    // sits at byte k * esize of its chunks (little-endian words).
#pragma unroll
    for (int q = 0; q < CPT; ++q) buf[q][tid] = make_uint4(0, 0, 0, 0);
#pragma unroll 1
    for (int k = 0; k < 8 * G; ++k) {
      if (j0 + k >= len) break;
      const int q = (k * C::kEsize) >> 4, kk = k - q * (16 / C::kEsize);
      if (C::kEsize == 2)
        reinterpret_cast<unsigned short*>(&buf[q][tid])[kk] = __ldg(reinterpret_cast<const unsigned short*>(src) + k);
      else
        reinterpret_cast<unsigned int*>(&buf[q][tid])[kk] = __ldg(reinterpret_cast<const unsigned int*>(src) + k);
    }
  }
}

// Checksum term of the G plane bytes v (byte i = group i) a thread stores at o:
// o is a multiple of G <= 4, so they sit inside one u32 word.
template <int G>
__device__ __forceinline__ uint64_t cs_bytes(uint64_t o, uint32_t v) {
  return cs_word(o, v << (8 * (o & 3)));
}

// Decoupled look-back (warp 0): the number of escapes in tiles 0 .. tl-1 of the row.
// Each state word is flag << 32 | count, flag 1 = the tile's own count, 2 = the
// inclusive prefix through that tile. Tile 0 always publishes 2, so the walk ends.
//
// Each lane reads kLookK states per round trip (the warp: 32 kLookK predecessors).
// The persistent CTAs work in rounds of about one tile each, all publishing their
// counts at about the same time; a tile then walks back until it meets an inclusive
// state, and those only appear from the start of the round onwards, so the walk of
// the round's p-th tile takes about p / (2 x states per round trip) round trips. With
// ~1600 CTAs (bf16, G = 4 on an H200) and 32 states per round trip that was ~25 L2
// round trips (~15 us) per round of ~5 us of work (the first GPU run: ~21 us per
// round); 128 per round trip cut it to ~6. See docs/cuda.md. (G = 1 keeps K = 1:
// its register cap of 48 spills with more, and its 5 CTAs of 8 warps per SM make
// rounds of fewer tiles.)
template <int kLookK>
__device__ __forceinline__ uint32_t lookback(const uint64_t* states, uint32_t tl, int lane) {
  uint32_t ex = 0;
  int64_t top = (int64_t)tl - 1;
  for (;;) {
    uint64_t s[kLookK];
    bool missing = false;
#pragma unroll
    for (int j = 0; j < kLookK; ++j) {
      const int64_t idx = top - 32 * j - lane;  // j = 0, lane 0: the nearest predecessor
      s[j] = idx >= 0 ? ld_relaxed(states + idx) : kFlagPrefix;
      missing |= (s[j] >> 32) == 0;
    }
    int spins = 0;
    while (__any_sync(kFull, missing)) {
      if (++spins > 8) __nanosleep(32);
      missing = false;
#pragma unroll
      for (int j = 0; j < kLookK; ++j)
        if ((s[j] >> 32) == 0) {
          s[j] = ld_relaxed(states + (top - 32 * j - lane));
          missing |= (s[j] >> 32) == 0;
        }
    }
#pragma unroll
    for (int j = 0; j < kLookK; ++j) {
      const uint32_t pmask = __ballot_sync(kFull, (s[j] >> 32) == 2);
      uint32_t v = (uint32_t)s[j];
      if (pmask) {
        const int first = __ffs(pmask) - 1;  // nearest tile with an inclusive prefix
        if (lane > first) v = 0;
        return ex + __reduce_add_sync(kFull, v);
      }
      ex += __reduce_add_sync(kFull, v);
    }
    top -= 32 * kLookK;
  }
}

template <typename T, int G>
__global__ void __launch_bounds__(tile_threads<G>(), min_ctas<T, G>()) encode_kernel(EncArgs a) {
  using C = Cfg<T>;
  constexpr int GW = C::kGW, CPB = GW / 4, P = T::kPlanes, RB = C::kRB, S = C::kStages;
  constexpr int NT = tile_threads<G>(), NW = NT / 32;
  static_assert(C::kBPT == 1, "the kernels process one block per tile");
  ZC_SHARED(uint4, s_buf, [S][G * CPB][NT]);  // ring of S tiles, each thread's own slots
  ZC_SHARED(uint32_t, s_red, [NW][2]);
  ZC_SHARED(uint32_t, s_cnt, [NW][2]);
  ZC_SHARED(uint32_t, s_scan, [NW]);
  ZC_SHARED(uint32_t, s_dep, [NW]);    // per warp: largest escape distance below | above << 16
  ZC_SHARED(uint32_t, s_tk, [S + 1]);  // prologue tickets
  ZC_SHARED(uint32_t, s_next, );       // a new ticket, broadcast at barrier (3)
  ZC_SHARED(uint32_t, s_excl, );
  ZC_SHARED(uint32_t, s_code, );       // the block's width | split << 8, broadcast at barrier (3)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const Geom& g = a.g;
  uint32_t* ticket = reinterpret_cast<uint32_t*>(a.ws + kWsTicket);

  // Tickets (tiles in row-major order) are taken from an atomic counter, so a CTA
  // only ever waits in the look-back on tiles held by CTAs that are running. tk[0]
  // is processed while tk[1 .. S-1] load and tk[S] is the next to load. The
  // prologue takes them one at a time, so the first tickets of all CTAs interleave.
  uint32_t tk[S + 1];
#pragma unroll
  for (int i = 0; i <= S; ++i) {
    if (tid == 0) s_tk[i] = atomicAdd(ticket, 1u);
    __syncthreads();
    tk[i] = s_tk[i];
    if (i < S) {
      if (tk[i] < a.total_tiles) enc_issue<T, G>(a, tk[i], s_buf[i], tid);
      cp_commit();
    }
  }
  if (tk[0] >= a.total_tiles) return;  // uniform

  uint32_t acc_row = tk[0] / g.tiles;
  uint64_t csum = 0;  // checksum terms of this thread's writes to row acc_row
  int stage = 0;

  for (;;) {
    const uint32_t cur = tk[0];
    const uint32_t row = cur / g.tiles, tl = cur - row * g.tiles;  // tl = block index
    if (row != acc_row) {  // uniform
      flush_sum(a.ws + (uint64_t)acc_row * a.ws_row + kWsSum, csum, lane);
      csum = 0;
      acc_row = row;
    }
    uint8_t* out = a.out + (uint64_t)row * a.out_row;
    uint8_t* ws = a.ws + (uint64_t)row * a.ws_row;
    uint64_t* states = reinterpret_cast<uint64_t*>(ws + kWsStates);
    const uint32_t len = block_len(g.n, tl);
    uint32_t vm[G];  // valid elements of the thread's groups G*tid .. G*tid + G-1
#pragma unroll
    for (int i = 0; i < G; ++i) vm[i] = valid_mask(len, G * tid + i);

    // This tile's stage has landed (own slots: no barrier needed after the wait).
    /*ZC_MUTATE:enc_wait*/ cp_wait<S - 1>();
    Split sp[G];
    Stats st{0, 0, 0};
#pragma unroll
    for (int i = 0; i < G; ++i) {
      uint32_t w[GW];
#pragma unroll
      for (int q = 0; q < CPB; ++q) {
        const uint4 v = s_buf[stage][i * CPB + q][tid];
        w[4 * q] = v.x;
        w[4 * q + 1] = v.y;
        w[4 * q + 2] = v.z;
        w[4 * q + 3] = v.w;
      }
      sp[i] = split<T>(w);
      // Raw words do not depend on the window: store them now.
#pragma unroll
      for (int q = 0; q < RB; ++q) {
        const uint64_t off = raw_word_off<T>(tl, G * tid + i, q);
        if (off < g.raw_size) {  // data, or raw padding (zero: zero-filled elements)
          const uint64_t v = (uint64_t)sp[i].R[2 * q] | ((uint64_t)sp[i].R[2 * q + 1] << 32);
          st_u64(out + g.raw_off + off, v);
          csum += cs_u64(g.raw_off + off, v);
        }
      }
      const Stats gs = group_stats<T>(sp[i], vm[i]);
      st.S += gs.S;
      st.N += gs.N;
      st.Z += gs.Z;
    }
    warp_sums2(s_red, st.S, st.N | (st.Z << 16), lane, warp);  // N, Z <= 2048 each
    // Refill the stage just read (its words are consumed: the reductions above used
    // every one) with the tile S ahead, and take the ticket after that.
    if (tk[S] < a.total_tiles) enc_issue<T, G>(a, tk[S], s_buf[stage], tid);
    cp_commit();
    uint32_t pend = kNoTicket;
    if (tid == 0 && tk[S] < a.total_tiles) pend = atomicAdd(ticket, 1u);
    __syncthreads();  // (1) s_red

    // Window: first guess from (S, N, Z), then best of base-1/base/base+1 from four
    // exponent counts (a second block reduction).
    Window win;
    {
      const uint2 r = block_sums2<NW>(s_red);  // (S, N | Z << 16)
      win = choose_window32<T>(r.x, r.y & 0xFFFFu, r.y >> 16, len);
      int32_t probe[4];
      window_probes(win, probe);
      uint32_t c[4] = {0, 0, 0, 0};
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int i = 0; i < G; ++i) c[k] += group_count_eq<T>(sp[i], vm[i], probe[k]);
      warp_sums2(s_cnt, c[0] | (c[1] << 16), c[2] | (c[3] << 16), lane, warp);  // <= 2048 each
    }
    __syncthreads();  // (1b) s_cnt
    uint32_t esc[G];
    uint32_t mine = 0;
    {
      const uint2 r = block_sums2<NW>(s_cnt);
      const uint32_t cnt[4] = {r.x & 0xFFFFu, r.x >> 16, r.y & 0xFFFFu, r.y >> 16};
      win = refine_window<T>(win, cnt);
      uint32_t pv[P];  // plane p's G bytes of this thread (byte i = group i)
#pragma unroll
      for (int p = 0; p < P; ++p) pv[p] = 0;
#pragma unroll
      for (int i = 0; i < G; ++i) {
        const Planes pl = group_planes<T>(sp[i], win, vm[i]);
        esc[i] = pl.esc;
        mine += popc(pl.esc);
#pragma unroll
        for (int p = 0; p < P; ++p) pv[p] |= pl.p[p] << (8 * i);
      }
      // Plane bytes do not depend on the escape offsets: store them now, G bytes
      // per plane in one store. A short last block's planes are plane_bytes_of(len)
      // bytes (a multiple of 16, so a thread's G bytes are all in or all out); its
      // threads past them hold zero bits only and store nothing.
      const uint32_t ps = plane_bytes_of(len);
      const uint64_t po = g.plane_off + (uint64_t)tl * (P * kPlaneBytes) + G * tid;
      if (G * (uint32_t)tid < ps) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
          uint8_t* dst = out + po + p * ps;
          if (G == 1) *dst = (uint8_t)pv[p];
          if (G == 2) *reinterpret_cast<unsigned short*>(dst) = (unsigned short)pv[p];
          if (G == 4) *reinterpret_cast<uint32_t*>(dst) = pv[p];
          csum += cs_bytes<G>(po + p * ps, pv[p]);
        }
      }
      // The plane section's padding (< 128 bytes, after the last block's planes).
      if (tl + 1 == g.nb)
        for (uint64_t i = g.plane_end + tid; i < g.esc_off; i += NT) out[i] = 0;
    }
    // The escapes' exponent bytes: word k >> 2 of the thread's group, byte k & 3, by a
    // tree of selects on the bits of k (a compare chain, or indexing, is compiled to
    // a local-memory table).
    auto esc_exp = [&](int k) -> uint32_t {
      uint32_t v[G];
#pragma unroll
      for (int i = 0; i < G; ++i) v[i] = (k & 4) ? sp[i].E[1] : sp[i].E[0];
      if (G == 4) {
        v[0] = (k & 16) ? v[2 % G] : v[0];
        v[1 % G] = (k & 16) ? v[3 % G] : v[1 % G];
      }
      if (G >= 2) v[0] = (k & 8) ? v[1 % G] : v[0];
      return (v[0] >> (8 * (k & 3))) & 0xFFu;
    };
    uint32_t m0 = 0;  // escapes of all G groups: bit 8i + k = element k of group i
#pragma unroll
    for (int i = 0; i < G; ++i) m0 |= esc[i] << (8 * i);
    // How far the escapes lie below and above the window (the block's width and
    // split, window_format.h "escape coding"): per thread, then per warp.
    const uint32_t wlo = win.base, whi = window_hi(win.base, win.mode);
    uint32_t db = 0, da = 0;
#pragma unroll
    for (int i = 0; i < G; ++i) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {   // predicated, no loop over the mask: fewer registers
        const uint32_t e = (sp[i].E[k >> 2] >> (8 * (k & 3))) & 0xFFu;
        const bool is_esc = (esc[i] >> k) & 1u;
        const uint32_t below = is_esc && e < wlo ? wlo - e : 0u, above = is_esc && e > whi ? e - whi : 0u;
        db = db > below ? db : below;
        da = da > above ? da : above;
      }
    }
    db = __reduce_max_sync(kFull, db);
    da = __reduce_max_sync(kFull, da);
    // Exclusive prefix of the escape counts over the threads (element order).
    uint32_t incl = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl += y;
    }
    if (lane == 31) {
      s_scan[warp] = incl;
      s_dep[warp] = db | (da << 16);  // each <= 255
    }
    __syncthreads();  // (2) s_scan, s_dep
    uint32_t pre = 0, cnt = 0;
    db = 0;
    da = 0;
#pragma unroll
    for (int i = 0; i < NW; ++i) {
      const uint32_t v = s_scan[i];
      pre += i < warp ? v : 0u;
      cnt += v;
      db = db > (s_dep[i] & 0xFFFFu) ? db : (s_dep[i] & 0xFFFFu);
      da = da > (s_dep[i] >> 16) ? da : (s_dep[i] >> 16);
    }
    const uint32_t excl = pre + incl - mine;
    uint32_t sbytes;
    {
      uint32_t width, split;
      escape_width(cnt, db, da, &width, &split);
      sbytes = stream_bytes(cnt, width);
      if (tid == 0) s_code = width | (split << 8);  // read after barrier (3): not live across it
    }

    const bool last_tile = tl + 1 == g.tiles;
    if (warp == 0) {
      // Publish this tile's stream bytes, then find the bytes before it.
      if (lane == 0) st_relaxed(states + tl, (tl == 0 ? kFlagPrefix : kFlagAggregate) | sbytes);
      const uint32_t ex = tl > 0 ? lookback<G == 1 ? 1 : 4>(states, tl, lane) : 0u;
      if (lane == 0) {
        if (tl > 0) st_relaxed(states + tl, kFlagPrefix | (ex + sbytes));
        if (last_tile) st_u64(ws + kWsTotal, (uint64_t)ex + sbytes);
        if (cnt) atomicAdd(reinterpret_cast<unsigned long long*>(ws + kWsCount), (unsigned long long)cnt);
        s_excl = ex;
        s_next = pend;  // lane 0 of warp 0 is thread 0, the one that took it
      }
    }
    if (last_tile) {  // zero the table padding (< 16 words)
      const uint64_t wi = (uint64_t)g.nb + tid;
      if (8 * wi < g.table_size) st_u64(out + g.table_off + 8 * wi, 0);
    }
    /*ZC_MUTATE:enc_sync3*/ __syncthreads();  // (3) s_excl, s_next
    const uint32_t boff = s_excl;  // stream bytes before this block in the row
    const uint32_t fresh = s_next;
    const uint32_t width = s_code & 0xFFu, split = s_code >> 8;

    if (tid == 0) {
      Record r;
      r.esc_offset = boff;
      r.esc_count = cnt;
      r.base = win.base;
      r.mode = win.mode;
      r.width = width;
      r.split = split;
      const uint64_t v = record_word(r);
      st_u64(out + g.table_off + 8ull * tl, v);
      csum += cs_u64(g.table_off + 8ull * tl, v);
    }
    // The thread's escapes are ranks excl .. excl + mine - 1 of the block: bits
    // (excl + j) * width of its stream. Neighbouring threads share bytes, so each
    // ORs its bits into the (pre-zeroed) section by 32-bit words; the bits are
    // disjoint, so the words' checksum terms add up to those of the final words.
    // Only words below the capacity are written (a multiple of 128 bytes).
    // Bit b of the stream is bit lb = 8 * (boff & 3) + b of the words from word q on
    // (32-bit arithmetic inside the block: lb < 2^15).
    const uint64_t q = boff >> 2;
    uint32_t lb = 8 * (boff & 3) + excl * width;
    for (uint32_t m = m0; m; m &= m - 1) {
      const uint32_t v = escape_value(esc_exp(__ffs(m) - 1), wlo, whi, width, split);
      const uint32_t lo32 = v << (lb & 31), hi32 = (lb & 31) ? v >> (32 - (lb & 31)) : 0u;
      const uint64_t off = 4 * (q + (lb >> 5));  // the section's byte offset of the first word
      if (lo32 && off < g.cap) {
        atomicOr(reinterpret_cast<unsigned*>(out + g.esc_off + off), lo32);
        csum += cs_word(g.esc_off + off, lo32);
      }
      if (hi32 && off + 4 < g.cap) {
        atomicOr(reinterpret_cast<unsigned*>(out + g.esc_off + off + 4), hi32);
        csum += cs_word(g.esc_off + off + 4, hi32);
      }
      lb += width;
    }

#pragma unroll
    for (int i = 0; i < S; ++i) tk[i] = tk[i + 1];
    tk[S] = fresh;
    stage = stage + 1 == S ? 0 : stage + 1;
    if (tk[0] >= a.total_tiles) break;  // uniform; later tickets are larger still
  }
  flush_sum(a.ws + (uint64_t)acc_row * a.ws_row + kWsSum, csum, lane);
}

// Per row, before the tiles: zero the escape section [0, esc_size) (split over
// `chunks` CTAs), which the tiles then OR their escape streams into.
template <typename T>
__global__ void __launch_bounds__(kThreads) encode_zero(EncArgs a, uint32_t chunks) {
  const int tid = threadIdx.x;
  const uint32_t row = blockIdx.x / chunks, k = blockIdx.x - row * chunks;
  const Geom& g = a.g;
  uint8_t* esc = a.out + (uint64_t)row * a.out_row + g.esc_off;
  const uint64_t lo = (uint64_t)k * kZeroChunk;   // multiples of 16 (esc_size is of 128)
  const uint64_t hi = g.esc_size < lo + kZeroChunk ? g.esc_size : lo + kZeroChunk;
  for (uint64_t i = lo + 16ull * tid; i < hi; i += 16ull * kThreads)
    *reinterpret_cast<uint4*>(esc + i) = make_uint4(0, 0, 0, 0);
}

// Per row: the header and the stats (one CTA per row).
template <typename T>
__global__ void __launch_bounds__(kThreads) encode_finalize(EncArgs a, int32_t* stats) {
  const int tid = threadIdx.x;
  const uint32_t row = blockIdx.x;
  const Geom& g = a.g;
  uint8_t* out = a.out + (uint64_t)row * a.out_row;
  const uint8_t* ws = a.ws + (uint64_t)row * a.ws_row;
  const uint64_t total = ld_u64(ws + kWsTotal);   // escape-section bytes
  const uint64_t count = ld_u64(ws + kWsCount);   // escapes
  if (tid < 16) {
    // A row that fits uses esc_off + align128(total) bytes (the escape bytes past
    // `total` are zero, so the tiles' checksum terms are those of [0, used)); one
    // that does not fit "uses" the whole buffer.
    const uint8_t status = total > g.cap ? kEncDoesNotFit : kEncOk;
    const Header h{T::kCode, status, g.n, status == kEncOk ? g.esc_off + align_up(total) : g.total, g.cap,
                   count, total};
    uint64_t v;
    if (tid == (int)(kOffChecksum / 8))
      v = ld_u64(ws + kWsSum) + header_cs(h);
    else
      v = header_word(tid, h);  // 0 for reserved words
    st_u64(out + 8 * tid, v);
    if (tid == 0) store_row_stats(stats + 4 * (uint64_t)row, status, count, h.used, g.total);
  }
}

// ---- decoder -----------------------------------------------------------------------

struct DecArgs {
  const uint8_t* in;  // [rows, in_row] payload
  uint8_t* y;         // [rows, n] elements
  uint8_t* ws;        // [rows, ws_row] workspace (zeroed)
  uint64_t in_row;    // bytes per payload row
  uint64_t y_row;     // bytes per output row
  uint64_t ws_row;
  Geom g;              // the fixed part's offsets (g.cap, g.total, g.esc_size unused)
  uint64_t esc_room;   // in_row - esc_off: escape bytes the buffer can hold (0 if none)
  uint32_t total_tiles;
  uint64_t esc_chunk;  // escape-section bytes each tile folds into the checksum
};

template <typename T, int G>
struct DecStage {
  uint2 raw[G * Cfg<T>::kRB][tile_threads<G>()];  // own slots: thread t's raw words
  uint4 planes[T::kPlanes * 16];                  // the block's planes (16-byte chunks)
  uint64_t rec[2];                                // its record and the next block's
};

template <typename T, int G>
__device__ __forceinline__ void dec_issue(const DecArgs& a, uint64_t gt, DecStage<T, G>& st, int tid) {
  constexpr int RB = Cfg<T>::kRB, NT = tile_threads<G>();
  const Geom& g = a.g;
  // gt < total_tiles < 2^31 (checked by the handler): a 32-bit division, not the
  // 64-bit software routine.
  const uint32_t row = (uint32_t)gt / g.tiles, b = (uint32_t)gt - row * g.tiles;
  const uint8_t* in = a.in + (uint64_t)row * a.in_row;
  // The thread's raw words are contiguous: those of groups G*tid .. G*tid + G-1.
#pragma unroll
  for (int q = 0; q < G * RB; ++q) {
    const uint64_t off = raw_word_off<T>(b, G * tid, q);
    if (off < g.raw_size)
      cp_async8(&st.raw[q][tid], in + g.raw_off + off);
    else
      st.raw[q][tid] = make_uint2(0, 0);
  }
  // The block's planes: P * plane_bytes_of(len) bytes (P * 256 but for a short last block).
  const int pch = (int)(T::kPlanes * plane_bytes_of(block_len(g.n, b)) / 16);
  for (int c = tid; c < pch; c += NT)
    cp_async16(&st.planes[c], in + g.plane_off + b * (uint64_t)(T::kPlanes * kPlaneBytes) + 16ull * c);
  if (tid < 2 && b + tid < g.nb) cp_async8(&st.rec[tid], in + g.table_off + 8 * (b + tid));
}

__device__ __forceinline__ void dec_flush(const DecArgs& a, uint32_t row, uint64_t csum, uint32_t bad,
                                          int lane) {
  uint8_t* ws = a.ws + (uint64_t)row * a.ws_row;
  flush_sum(ws + kWsSum, csum, lane);
  const uint32_t wb = __reduce_or_sync(kFull, bad);
  if (lane == 0 && wb) atomicOr(reinterpret_cast<unsigned int*>(ws + kWsBad), wb);
}

template <typename T, int G>
__global__ void __launch_bounds__(tile_threads<G>(), min_ctas<T, G>()) decode_kernel(DecArgs a) {
  using C = Cfg<T>;
  constexpr int GW = C::kGW, RB = C::kRB, P = T::kPlanes, S = C::kStages;
  constexpr int NT = tile_threads<G>(), NW = NT / 32;
  static_assert(C::kBPT == 1, "the kernels process one block per tile");
  using Stage = DecStage<T, G>;
  ZC_SHARED(Stage, ring, [S]);
  ZC_SHARED(uint32_t, s_scan, [NW]);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const Geom& g = a.g;
  const uint64_t stride = gridDim.x, total = a.total_tiles;
  uint64_t gt = blockIdx.x;
  if (gt >= total) return;
  // Static assignment (no inter-CTA waits here): tiles blockIdx.x + k * gridDim.x,
  // S of them in the ring.
#pragma unroll
  for (int i = 0; i < S; ++i) {
    if (gt + i * stride < total) dec_issue<T, G>(a, gt + i * stride, ring[i], tid);
    cp_commit();
  }
  uint32_t acc_row = (uint32_t)gt / g.tiles;  // gt < total < 2^31: 32-bit divisions
  uint64_t csum = 0;
  uint32_t bad = 0;  // bit 6: a bad record, bit 7: planes disagree with a record
  // The row's escape count and checksummed escape bytes by its header (validated by
  // decode_finalize; here they only bound every read to the buffer).
  uint64_t esc_total = ld_u64(a.in + (uint64_t)acc_row * a.in_row + kOffEscBytes);
  uint64_t span = esc_span(a.in + (uint64_t)acc_row * a.in_row, g.esc_off, a.in_row);
  int stage = 0;

  for (;;) {
    const uint32_t row = (uint32_t)gt / g.tiles, b = (uint32_t)gt - row * g.tiles;
    if (row != acc_row) {  // uniform
      dec_flush(a, acc_row, csum, bad, lane);
      csum = 0;
      bad = 0;
      acc_row = row;
      esc_total = ld_u64(a.in + (uint64_t)row * a.in_row + kOffEscBytes);
      span = esc_span(a.in + (uint64_t)row * a.in_row, g.esc_off, a.in_row);
    }
    const uint8_t* in = a.in + (uint64_t)row * a.in_row;
    uint8_t* yr = a.y + (uint64_t)row * a.y_row;
    const uint32_t len = block_len(g.n, b);
    uint32_t vm[G];  // valid elements of the thread's groups G*tid .. G*tid + G-1
#pragma unroll
    for (int i = 0; i < G; ++i) vm[i] = valid_mask(len, G * tid + i);

    cp_wait<S - 1>();
    /*ZC_MUTATE:dec_syncA*/ __syncthreads();  // (A) everyone's copies of this stage have landed
    DecStage<T, G>& st = ring[stage];
    const uint64_t recw = st.rec[0];
    const Record rec = record_of_word(recw);
    const bool has_next = b + 1 < g.nb;
    const uint32_t next_off = has_next ? (uint32_t)st.rec[1] : 0u;
    const bool ok = record_ok<T>(rec, b, g.nb, len, has_next, next_off, esc_total);
    if (!ok) bad |= 1u << kDecBadTable;
    uint32_t pb[G][P];
    uint32_t mine = 0;
    const uint8_t* pbytes = reinterpret_cast<const uint8_t*>(st.planes);
    // Bytes per plane of this block; a thread past a short block's planes has none
    // (its groups hold no element: zero bits).
    const uint32_t ps = plane_bytes_of(len);
    const bool has_planes = G * (uint32_t)tid < ps;
#pragma unroll
    for (int i = 0; i < G; ++i) {
      uint32_t any = 0;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        pb[i][p] = has_planes ? pbytes[p * ps + G * tid + i] : 0u;
        any |= pb[i][p];
      }
      if (any & ~vm[i]) bad |= 1u << kDecBadEscapes;  // a padding bit is set
      mine += popc(~(pb[i][0] | pb[i][1] | pb[i][2]) & vm[i]);  // escapes
    }
    uint32_t R[2 * G * RB];
#pragma unroll
    for (int q = 0; q < G * RB; ++q) {
      const uint2 v = st.raw[q][tid];
      R[2 * q] = v.x;
      R[2 * q + 1] = v.y;
    }
    uint32_t incl = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl += y;
    }
    if (lane == 31) s_scan[warp] = incl;
    __syncthreads();  // (B) s_scan; every read of this stage is done: refill it
    const uint64_t nx = gt + S * stride;
    if (nx < total) dec_issue<T, G>(a, nx, st, tid);
    cp_commit();
    uint32_t pre = 0, cnt = 0;
#pragma unroll
    for (int i = 0; i < NW; ++i) {
      const uint32_t v = s_scan[i];
      pre += i < warp ? v : 0u;
      cnt += v;
    }
    if (cnt != rec.esc_count) bad |= 1u << kDecBadEscapes;

    uint32_t E[2 * G];  // exponent bytes of the thread's 8G elements, four per word
    uint32_t m = 0;     // escapes: bit 8i + k = element k of group i
#pragma unroll
    for (int i = 0; i < G; ++i) {
      decode_exps(pb[i][0], pb[i][1], pb[i][2], Window{rec.base, rec.mode}, E + 2 * i);
      m |= (~(pb[i][0] | pb[i][1] | pb[i][2]) & vm[i]) << (8 * i);
    }
    // One loop over all G groups' escapes (a warp runs it as often as its busiest
    // lane needs): escape rank r of the block is bits r * width of its stream.
    const uint32_t width = rec.width, wlo = rec.base, whi = window_hi(rec.base, rec.mode);
    uint64_t bit = 8ull * rec.esc_offset + (uint64_t)(pre + incl - mine) * width;
    while (m) {
      const int k = __ffs(m) - 1;
      m &= m - 1;
      // Reads stay inside the escape section whatever the record says; a block whose
      // record failed is reported as BAD_TABLE and its values are not meaningful.
      const uint64_t byte = bit >> 3;
      uint32_t v = 0;
      if (ok && byte < span) v = in[g.esc_off + byte];
      if (ok && (bit & 7) + width > 8 && byte + 1 < span) v |= (uint32_t)in[g.esc_off + byte + 1] << 8;
      v = (v >> (bit & 7)) & ((1u << width) - 1);
      uint32_t e = 0;
      if (ok && !escape_exponent<T>(v, wlo, whi, rec.mode, width, rec.split, &e)) bad |= 1u << kDecBadEscapes;
      e &= 0xFFu;
      const int sh = 8 * (k & 3);
#pragma unroll
      for (int j = 0; j < 2 * G; ++j)  // selects: no dynamically indexed (local) array
        E[j] = (k >> 2) == j ? (E[j] & ~(0xFFu << sh)) | (e << sh) : E[j];
      bit += width;
    }
    // The stream's bits past count * width (in its last byte) must be zero; and the
    // tiles add the records' counts for decode_finalize (the CPU's count sum).
    if (tid == 0 && ok) {
      const uint32_t used_bits = (rec.esc_count * width) & 7;
      const uint64_t last = (uint64_t)rec.esc_offset + stream_bytes(rec.esc_count, width) - 1;
      if (used_bits && last < span && (in[g.esc_off + last] >> used_bits) != 0) bad |= 1u << kDecBadEscapes;
    }
    if (tid == 0 && rec.esc_count)
      atomicAdd(reinterpret_cast<unsigned long long*>(a.ws + (uint64_t)row * a.ws_row + kWsCount),
                (unsigned long long)rec.esc_count);
    uint32_t wout[G * GW];
#pragma unroll
    for (int i = 0; i < G; ++i)
      join_group<T>(R + 2 * RB * i, P > 3 ? pb[i][3 % P] : 0u, P > 4 ? pb[i][4 % P] : 0u,
                    P > 5 ? pb[i][5 % P] : 0u, E + 2 * i, wout + GW * i);
    uint8_t* dst = yr + ((uint64_t)b * kBlock + 8ull * G * tid) * C::kEsize;
    bool full = (reinterpret_cast<uintptr_t>(yr) & 15) == 0;
#pragma unroll
    for (int i = 0; i < G; ++i) full = full && vm[i] == 0xFFu;
    if (full) {
#pragma unroll
      for (int q = 0; q < G * GW / 4; ++q)
        reinterpret_cast<uint4*>(dst)[q] = make_uint4(wout[4 * q], wout[4 * q + 1], wout[4 * q + 2], wout[4 * q + 3]);
    } else {
#pragma unroll
      for (int i = 0; i < G; ++i) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          if ((vm[i] >> k) & 1u) {
            if (C::kEsize == 2)
              reinterpret_cast<unsigned short*>(dst)[8 * i + k] = (unsigned short)elem<T>(wout + GW * i, k);
            else
              reinterpret_cast<unsigned int*>(dst)[8 * i + k] = elem<T>(wout + GW * i, k);
          }
        }
      }
    }
    // Checksum: raw words (incl. raw padding; words past the section were loaded as
    // 0 and add nothing), plane bytes, the record, the table padding (last block),
    // and this block's share of the escape section.
#pragma unroll
    for (int q = 0; q < G * RB; ++q)
      csum += cs_u64(g.raw_off + raw_word_off<T>(b, G * tid, q), (uint64_t)R[2 * q] | ((uint64_t)R[2 * q + 1] << 32));
    const uint64_t po = g.plane_off + (uint64_t)b * (P * kPlaneBytes) + G * tid;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      uint32_t v = 0;
#pragma unroll
      for (int i = 0; i < G; ++i) v |= pb[i][p] << (8 * i);
      if (has_planes) csum += cs_bytes<G>(po + p * ps, v);
    }
    if (tid == 0) csum += cs_u64(g.table_off + 8ull * b, recw);
    if (b + 1 == g.tiles) {
      const uint64_t wi = (uint64_t)g.nb + tid;
      if (8 * wi < g.table_size) csum += cs_u64(g.table_off + 8 * wi, ld_u64(in + g.table_off + 8 * wi));
    }
    {
      const uint64_t lo = (uint64_t)b * a.esc_chunk;
      const uint64_t hi = span < lo + a.esc_chunk ? span : lo + a.esc_chunk;
      for (uint64_t i = lo + 16ull * tid; i < hi; i += 16ull * NT) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(in + g.esc_off + i));
        const uint64_t o = g.esc_off + i;
        csum += cs_word(o, v.x) + cs_word(o + 4, v.y) + cs_word(o + 8, v.z) + cs_word(o + 12, v.w);
      }
    }
    gt += stride;
    stage = stage + 1 == S ? 0 : stage + 1;
    if (gt >= total) break;  // uniform
  }
  dec_flush(a, acc_row, csum, bad, lane);
}

// One CTA per row: the header checks (statuses 1..5, window_format.h check_header),
// the header's (and, for n = 0, the escape section's) part of the checksum, the
// padding check, the final status in the CPU's priority, and on any error the row
// of y filled with all-one bits.
template <typename T>
__global__ void __launch_bounds__(kThreads) decode_finalize(DecArgs a, int32_t* status) {
  ZC_SHARED(uint64_t, s_x, [kWarps]);
  ZC_SHARED(uint32_t, s_pad, [kWarps]);
  ZC_SHARED(int32_t, s_status, );
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t row = blockIdx.x;
  const Geom& g = a.g;
  const uint8_t* in = a.in + (uint64_t)row * a.in_row;
  uint64_t x = 0;
  uint32_t pad = 0;
  if (a.in_row >= g.esc_off) {  // (>= 128: the header is in the buffer)
    const uint64_t span = esc_span(in, g.esc_off, a.in_row);
    if (g.nb == 0) {
      for (uint64_t i = 16ull * tid; i < span; i += 16ull * kThreads) {
        const uint4 v = *reinterpret_cast<const uint4*>(in + g.esc_off + i);
        const uint64_t o = g.esc_off + i;
        x += cs_word(o, v.x) + cs_word(o + 4, v.y) + cs_word(o + 8, v.z) + cs_word(o + 12, v.w);
      }
    }
    if (tid < 16 && tid != (int)(kOffChecksum / 8)) x += cs_u64(8ull * tid, ld_u64(in + 8 * tid));
    // Padding bytes (each section's padding is < 128 bytes): table, raw, planes,
    // escapes. The plane section's padding is checksummed here (the tile kernels
    // sum the planes themselves; the others' padding they sum with their section).
    if (tid < (int)kAlign) {
      const uint64_t t = g.table_off + 8ull * g.nb + tid, r = g.raw_off + g.n * (uint64_t)T::kRawBytes + tid;
      const uint64_t pp = g.plane_end + tid;
      if (t < g.raw_off) pad |= in[t];
      if (r < g.plane_off) pad |= in[r];
      if (pp < g.esc_off) {
        pad |= in[pp];
        x += cs_byte(pp, in[pp]);
      }
      const uint64_t ec = load_u64(in + kOffEscBytes);
      if (ec < span && ec + tid < span) pad |= in[g.esc_off + ec + tid];
    }
  }
  x = warp_sum64(x);
  pad = __reduce_or_sync(kFull, pad);
  if (lane == 0) {
    s_x[warp] = x;
    s_pad[warp] = pad;
  }
  __syncthreads();
  if (tid == 0) {
    int32_t s = kDecBadSize;
    HeaderInfo hi;
    if (a.in_row >= kHeaderBytes) s = check_header<T>(in, g.n, a.in_row, &hi);
    if (s == kDecOk) {
      const uint8_t* ws = a.ws + (uint64_t)row * a.ws_row;
      const uint32_t bad = *reinterpret_cast<const uint32_t*>(ws + kWsBad);
      uint64_t cs = ld_u64(ws + kWsSum);
      uint32_t p = 0;
      for (int i = 0; i < kWarps; ++i) {
        cs += s_x[i];
        p |= s_pad[i];
      }
      const uint64_t counted = ld_u64(ws + kWsCount);  // the records' escape counts, summed
      if ((g.nb == 0 && hi.esc_bytes != 0) || counted != hi.esc_count || (bad & (1u << kDecBadTable)))
        s = kDecBadTable;
      else if (bad & (1u << kDecBadEscapes))
        s = kDecBadEscapes;
      else if (cs != load_u64(in + kOffChecksum))
        s = kDecBadChecksum;
      else if (p)
        s = kDecBadPadding;
    }
    status[row] = s;
    s_status = s;
  }
  __syncthreads();
  if (s_status != kDecOk) {  // uniform: all-one bits, element by element (rows may be misaligned)
    uint8_t* yr = a.y + (uint64_t)row * a.y_row;
    for (uint64_t i = tid; i < g.n; i += kThreads) {
      if (Cfg<T>::kEsize == 2)
        reinterpret_cast<unsigned short*>(yr)[i] = 0xFFFFu;
      else
        reinterpret_cast<unsigned int*>(yr)[i] = 0xFFFFFFFFu;
    }
  }
}

// ---- host side ---------------------------------------------------------------------

// CTAs that fit on the current device at once (for the persistent/grid-stride
// kernels); cached per (device, kernel). Only a performance hint: the kernels are
// correct for any grid size.
int resident_ctas(const void* kernel, int threads) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> cache;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 1024;
  }
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({dev, kernel});
  if (it != cache.end()) return it->second;
  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) sms = 132;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess || per_sm <= 0)
    per_sm = 4;
  cudaGetLastError();  // clear anything the queries left behind
  const int v = sms * per_sm;
  cache[{dev, kernel}] = v;
  return v;
}

template <typename T, int G>
void warm_up_tile_kernels() {
  cudaFuncAttributes attr;
  cudaFuncGetAttributes(&attr, encode_kernel<T, G>);
  cudaFuncGetAttributes(&attr, decode_kernel<T, G>);
  resident_ctas((const void*)encode_kernel<T, G>, tile_threads<G>());
  resident_ctas((const void*)decode_kernel<T, G>, tile_threads<G>());
}

template <typename T>
void warm_up_kernels() {
  cudaFuncAttributes attr;
  cudaFuncGetAttributes(&attr, encode_finalize<T>);
  cudaFuncGetAttributes(&attr, decode_finalize<T>);
  warm_up_tile_kernels<T, 1>();
  warm_up_tile_kernels<T, 2>();
  warm_up_tile_kernels<T, 4>();
}

// The tile-kernel variant chosen by set_tile_groups (0: none chosen).
std::atomic<int> g_tile_groups{0};

// Groups per thread of the tile kernels: set_tile_groups' choice, else
// ZIPCCL_CUDA_GROUPS (1, 2 or 4; read once per process, ffi/env.h), else the
// default: G = 4 for 16-bit dtypes, 2 for fp32 -- the fewest SASS instructions per
// element at a register cap without spills (docs/cuda.md, "Groups per thread"; a
// static estimate until a GPU has timed them). Read whenever XLA runs the handler
// (once per capture when the call is recorded in a CUDA graph). The payload bytes
// do not depend on it.
template <typename T>
int groups_per_thread() {
  const int chosen = g_tile_groups.load(std::memory_order_relaxed);
  if (chosen) return chosen;
  if (const int v = env::cuda_groups()) return v;
  return Cfg<T>::kBits == 16 ? 4 : 2;
}

// A tile kernel (encode_kernel or decode_kernel of dtype T, in the variant
// groups_per_thread<T>() picks among k1, k2, k4) with as many CTAs as fit on the
// device at once, at most one per tile (persistent / grid-stride).
template <typename T, typename Args>
void launch_tiles(void (*k1)(Args), void (*k2)(Args), void (*k4)(Args), uint64_t total_tiles, cudaStream_t stream,
                  const Args& a) {
  const int groups = groups_per_thread<T>();
  void (*kernel)(Args) = groups == 1 ? k1 : groups == 2 ? k2 : k4;
  const int threads = (int)kPlaneBytes / groups;
  const uint64_t grid = std::min<uint64_t>(total_tiles, (uint64_t)resident_ctas((const void*)kernel, threads));
  ZC_LAUNCH(kernel, grid, threads, stream, a);
}

namespace ffi = ::xla::ffi;
using ::zipccl::dev::check_launch;
using ::zipccl::dev::cuda_error;

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

using handler::kDecodeTarget;
using handler::kEncodeTarget;
using handler::Shape;

template <typename T>
ffi::Error encode_launch(cudaStream_t stream, const uint8_t* x, uint8_t* out, int32_t* stats, uint8_t* ws,
                         const Shape& s) {
  EncArgs a;
  a.x = x;
  a.out = out;
  a.ws = ws;
  a.g = geom_of<T>(s.n, max_escape_capacity(T::kCode, s.n));
  a.x_row = s.n * (uint64_t)Cfg<T>::kEsize;
  a.out_row = a.g.total;
  a.ws_row = s.ws_row;
  const uint64_t total_tiles = s.rows * a.g.tiles;
  // Tickets overshoot the end by at most S + 1 per CTA: keep them far from 2^32.
  if (total_tiles > kMaxGridX) return handler::invalid(kEncodeTarget, "too many tiles");
  a.total_tiles = (uint32_t)total_tiles;
  const uint64_t chunks = std::max<uint64_t>(1, (a.g.esc_size + kZeroChunk - 1) / kZeroChunk);
  if (s.rows * chunks > kMaxGridX) return handler::invalid(kEncodeTarget, "rows too large");

  if (const cudaError_t e = cudaMemsetAsync(ws, 0, s.rows * s.ws_row, stream); e != cudaSuccess)
    return cuda_error(kEncodeTarget, "workspace memset", e);
  if (s.rows && a.g.esc_size) {
    ZC_LAUNCH(encode_zero<T>, s.rows * chunks, kThreads, stream, a, (uint32_t)chunks);
    ffi::Error e = check_launch(kEncodeTarget, "encode_zero launch");
    if (e.failure()) return e;
  }
  if (total_tiles) {
    launch_tiles<T>(encode_kernel<T, 1>, encode_kernel<T, 2>, encode_kernel<T, 4>, total_tiles, stream, a);
    ffi::Error e = check_launch(kEncodeTarget, "encode_kernel launch");
    if (e.failure()) return e;
  }
  ZC_LAUNCH(encode_finalize<T>, s.rows, kThreads, stream, a, stats);
  return check_launch(kEncodeTarget, "encode_finalize launch");
}

template <typename T>
ffi::Error decode_launch(cudaStream_t stream, const uint8_t* in, uint8_t* y, int32_t* status, uint8_t* ws,
                         const Shape& s) {
  DecArgs a;
  a.in = in;
  a.y = y;
  a.ws = ws;
  a.g = geom_of<T>(s.n, 0);
  a.in_row = s.nbytes;
  a.y_row = s.n * (uint64_t)Cfg<T>::kEsize;
  a.ws_row = s.ws_row;
  // The tiles read the fixed part of every row: only when the buffer holds it (else
  // every row is BAD_SIZE, found by decode_finalize alone).
  const bool fixed_ok = s.nbytes >= a.g.esc_off;
  a.esc_room = fixed_ok ? s.nbytes - a.g.esc_off : 0;
  const uint64_t total_tiles = fixed_ok ? s.rows * a.g.tiles : 0;
  if (total_tiles > kMaxGridX || s.rows > kMaxGridX) return handler::invalid(kDecodeTarget, "too many tiles");
  a.total_tiles = (uint32_t)total_tiles;
  a.esc_chunk = esc_chunk_of(a.esc_room, a.g.tiles);

  if (const cudaError_t e = cudaMemsetAsync(ws, 0, s.rows * s.ws_row, stream); e != cudaSuccess)
    return cuda_error(kDecodeTarget, "workspace memset", e);
  if (total_tiles) {
    launch_tiles<T>(decode_kernel<T, 1>, decode_kernel<T, 2>, decode_kernel<T, 4>, total_tiles, stream, a);
    ffi::Error e = check_launch(kDecodeTarget, "decode_kernel launch");
    if (e.failure()) return e;
  }
  ZC_LAUNCH(decode_finalize<T>, s.rows, kThreads, stream, a, status);
  return check_launch(kDecodeTarget, "decode_finalize launch");
}

// skip and fill (handler_common.h): every row is coded (reading skip on the host
// would cost a synchronization), then launch_skip_stats / launch_skip_fill
// (device_util.h) give the skipped rows the CPU handlers' results.
ffi::Error EncodeCudaImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Buffer<ffi::U8> skip,
                          ffi::Result<ffi::Buffer<ffi::U8>> payload, ffi::Result<ffi::Buffer<ffi::S32>> stats,
                          ffi::Result<ffi::Buffer<ffi::U8>> workspace) {
  Shape s;
  if (ffi::Error e = handler::check_encode(x.element_type(), x.dimensions(), payload->dimensions(),
                                           stats->dimensions(), workspace->dimensions(), &s);
      e.failure())
    return e;
  if (ffi::Error e = handler::check_skip(kEncodeTarget, skip.element_count(), s.rows); e.failure()) return e;
  if (s.rows == 0) return ffi::Error::Success();
  uint8_t* out = payload->typed_data();
  uint8_t* ws = workspace->typed_data();
  if (!aligned16(out) || !aligned16(ws))
    return handler::invalid(kEncodeTarget, "payload and workspace must be 16-byte aligned");
  const uint8_t* xb = static_cast<const uint8_t*>(x.untyped_data());
  int32_t* st = stats->typed_data();
  ffi::Error e = s.d == kBF16  ? encode_launch<BF16Traits>(stream, xb, out, st, ws, s)
                 : s.d == kF16 ? encode_launch<F16Traits>(stream, xb, out, st, ws, s)
                               : encode_launch<F32Traits>(stream, xb, out, st, ws, s);
  if (e.failure()) return e;
  return dev::launch_skip_stats(kEncodeTarget, stream, skip.typed_data(), st, s.rows);
}

ffi::Error DecodeCudaImpl(cudaStream_t stream, ffi::Buffer<ffi::U8> payload, ffi::Buffer<ffi::U8> skip,
                          ffi::AnyBuffer fill, ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::Buffer<ffi::S32>> status,
                          ffi::Result<ffi::Buffer<ffi::U8>> workspace) {
  Shape s;
  if (ffi::Error e = handler::check_decode(payload.dimensions(), y->element_type(), y->dimensions(),
                                           status->element_count(), workspace->dimensions(), &s);
      e.failure())
    return e;
  uint64_t group = 0;
  if (ffi::Error e = handler::check_skip(kDecodeTarget, skip.element_count(), s.rows); e.failure()) return e;
  if (ffi::Error e =
          handler::check_fill(kDecodeTarget, fill.element_type(), y->element_type(), fill.dimensions(), s.rows, s.n, &group);
      e.failure())
    return e;
  if (s.rows == 0) return ffi::Error::Success();
  // Rows are read with 16-byte loads: each must start 16-byte aligned (decode_rows
  // cuts a row length that is not a multiple of 16 to a multiple of 128, which
  // loses nothing: used_nbytes is a multiple of 128).
  if (s.nbytes % 16 != 0)
    return handler::invalid(kDecodeTarget, "on the GPU, payload rows must be a multiple of 16 bytes, got " +
                                               handler::str(s.nbytes));
  const uint8_t* in = payload.typed_data();
  uint8_t* ws = workspace->typed_data();
  if ((s.nbytes && !aligned16(in)) || !aligned16(ws))
    return handler::invalid(kDecodeTarget, "payload and workspace must be 16-byte aligned");
  uint8_t* yb = static_cast<uint8_t*>(y->untyped_data());
  int32_t* st = status->typed_data();
  ffi::Error e = s.d == kBF16  ? decode_launch<BF16Traits>(stream, in, yb, st, ws, s)
                 : s.d == kF16 ? decode_launch<F16Traits>(stream, in, yb, st, ws, s)
                               : decode_launch<F32Traits>(stream, in, yb, st, ws, s);
  if (e.failure()) return e;
  return dev::launch_skip_fill(kDecodeTarget, stream, skip.typed_data(), fill.untyped_data(), yb, st, s.rows,
                               s.n * elem_bytes_of(s.d), group);
}

}  // namespace

bool set_tile_groups(int groups) {
  if (groups != 0 && groups != 1 && groups != 2 && groups != 4) return false;
  g_tile_groups.store(groups, std::memory_order_relaxed);
  return true;
}

int warm_up() {
  return dev::for_each_device([] {
    warm_up_kernels<BF16Traits>();
    warm_up_kernels<F16Traits>();
    warm_up_kernels<F32Traits>();
  });
}

}  // namespace gpu
}  // namespace zipccl

namespace ffi = ::xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEncodeCuda, zipccl::gpu::EncodeCudaImpl,
                              zipccl::handler::bind_encode(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecodeCuda, zipccl::gpu::DecodeCudaImpl,
                              zipccl::handler::bind_decode(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});
