// Part of the CUDA window codec (cuda/window.cu, the only file that includes it): the
// encoder kernels encode_kernel and encode_finalize (the design: cuda/window.cu's
// header and docs/cuda.md).
#pragma once

#include "window_device.cuh"

namespace zipccl {
namespace gpu {
namespace {

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
}  // namespace
}  // namespace gpu
}  // namespace zipccl
