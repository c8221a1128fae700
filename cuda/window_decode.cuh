// Part of the CUDA window codec (cuda/window.cu, the only file that includes it): the
// decoder kernels decode_kernel and decode_finalize (the design: cuda/window.cu's
// header and docs/cuda.md).
#pragma once

#include "window_device.cuh"

namespace zipccl {
namespace gpu {
namespace {

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
}  // namespace
}  // namespace gpu
}  // namespace zipccl
