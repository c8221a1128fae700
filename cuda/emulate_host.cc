// Host emulation of the CUDA codec kernels (cuda/codec.cu), for machines without a
// GPU. It runs the kernels' decomposition -- tiles of 256 "threads", the same
// per-thread functions (cuda/codec_tile.h), the same address and checksum-term
// math, the block scans, the decoupled look-back (over states randomly left as
// aggregates or inclusive prefixes), the finalize steps -- starting from
// garbage-filled output buffers, and compares every byte and status with the CPU
// codec (ffi/codec_cpu.cc). What it cannot check is the CUDA glue itself (warp
// intrinsics, barriers, cp.async, atomics); benchmarks/gpu_check.py does that on a GPU.
//
// Build and run (tests/test_cuda_build.py does this), with INC = jax.ffi.include_dir():
//   g++ -O2 -std=c++17 -Iffi -Icuda -I$INC cuda/emulate_host.cc ffi/codec_cpu.cc -lpthread
//   ./a.out [--quick]
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "codec_cpu.h"
#include "codec_format.h"
#include "codec_tile.h"

using namespace zipccl;
using namespace zipccl::tile;

namespace {

constexpr uint8_t kGarbage = 0xA5;

// ---- encoder emulation ---------------------------------------------------------------

uint32_t emu_lookback(const std::vector<uint64_t>& st, uint32_t tl) {
  uint32_t ex = 0;
  int64_t top = (int64_t)tl - 1;
  for (;;) {
    uint64_t s[32];
    for (int lane = 0; lane < 32; ++lane) {
      const int64_t idx = top - lane;
      s[lane] = idx >= 0 ? st[idx] : kFlagPrefix;
      if ((s[lane] >> 32) == 0) {
        fprintf(stderr, "look-back read an unpublished state\n");
        exit(2);
      }
    }
    uint32_t pmask = 0;
    for (int lane = 0; lane < 32; ++lane)
      if ((s[lane] >> 32) == 2) pmask |= 1u << lane;
    uint32_t sum = 0;
    if (pmask) {
      const int first = __builtin_ctz(pmask);
      for (int lane = 0; lane <= first; ++lane) sum += (uint32_t)s[lane];
      return ex + sum;
    }
    for (int lane = 0; lane < 32; ++lane) sum += (uint32_t)s[lane];
    ex += sum;
    top -= 32;
  }
}

template <typename T>
void emu_encode(const typename T::bits_t* x_all, uint64_t rows, uint64_t n, uint64_t cap, uint8_t* out_all,
                int32_t* stats, std::mt19937_64& rng) {
  using C = Cfg<T>;
  constexpr int BPT = C::kBPT, P = T::kPlanes, RB = C::kRB;
  const Geom g = geom_of<T>(n, cap);
  const uint64_t W = workspace_nbytes(n);
  std::vector<uint8_t> ws(rows * W, 0);
  std::vector<std::vector<uint64_t>> states(rows, std::vector<uint64_t>(g.tiles, 0));
  std::vector<std::vector<uint32_t>> own(rows, std::vector<uint32_t>(g.tiles, 0));
  std::vector<uint64_t> row_sum(rows, 0), row_total(rows, 0);
  const uint64_t total_tiles = rows * g.tiles;

  for (uint64_t gt = 0; gt < total_tiles; ++gt) {
    const uint32_t row = (uint32_t)(gt / g.tiles), tl = (uint32_t)(gt - (uint64_t)row * g.tiles);
    const typename T::bits_t* x = x_all + row * n;
    uint8_t* out = out_all + row * g.total;
    static Split sp[kThreads][2];
    static Planes pl[kThreads][2];
    static uint32_t vm[kThreads][2], packed[kThreads], excl[kThreads];
    uint32_t len[2] = {0, 0};
    Window win[2];
    uint64_t S[2] = {0, 0};
    uint32_t N[2] = {0, 0}, Z[2] = {0, 0};
    for (int blk = 0; blk < BPT; ++blk) len[blk] = block_len(n, (uint64_t)tl * BPT + blk);
    for (int t = 0; t < kThreads; ++t) {
      for (int blk = 0; blk < BPT; ++blk) {
        const uint64_t b = (uint64_t)tl * BPT + blk;
        uint32_t w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int k = 0; k < 8; ++k)
          if (8u * t + k < len[blk]) set_elem<T>(w, k, x[b * kBlock + 8 * t + k]);
        vm[t][blk] = valid_mask(len[blk], t);
        sp[t][blk] = split<T>(w);
        const Stats st = group_stats<T>(sp[t][blk], vm[t][blk]);
        S[blk] += st.S;
        N[blk] += st.N;
        Z[blk] += st.Z;
      }
    }
    for (int blk = 0; blk < BPT; ++blk) {
      // The kernel sums 32-bit warp partials: check they cannot wrap.
      if (S[blk] >= (1ull << 32) || N[blk] > 0xFFFF || Z[blk] > 0xFFFF) {
        fprintf(stderr, "stats overflow\n");
        exit(2);
      }
      win[blk] = choose_window32<T>((uint32_t)S[blk], N[blk], Z[blk], len[blk]);
      const Window ref = choose_window<T>(S[blk], N[blk], Z[blk], len[blk]);
      if (ref.base != win[blk].base || ref.mode != win[blk].mode) {
        fprintf(stderr, "choose_window32 differs from choose_window\n");
        exit(2);
      }
      int32_t probe[4];
      window_probes(win[blk], probe);
      uint32_t cnt[4] = {0, 0, 0, 0};
      for (int t = 0; t < kThreads; ++t)
        for (int k = 0; k < 4; ++k) cnt[k] += group_count_eq<T>(sp[t][blk], vm[t][blk], probe[k]);
      win[blk] = refine_window<T>(win[blk], cnt);
    }
    uint32_t run = 0;
    for (int t = 0; t < kThreads; ++t) {
      packed[t] = 0;
      for (int blk = 0; blk < BPT; ++blk) {
        pl[t][blk] = group_planes<T>(sp[t][blk], win[blk], vm[t][blk]);
        packed[t] |= popc(pl[t][blk].esc) << (16 * blk);
      }
      excl[t] = run;
      run += packed[t];
    }
    const uint32_t tot = run;
    const uint32_t cnt0 = BPT == 2 ? (tot & 0xFFFFu) : tot;
    const uint32_t cnt1 = BPT == 2 ? (tot >> 16) : 0u;
    const uint32_t tile_total = cnt0 + cnt1;
    own[row][tl] = tile_total;
    states[row][tl] = (tl == 0 ? kFlagPrefix : kFlagAggregate) | tile_total;

    uint64_t csum = 0;
    for (int t = 0; t < kThreads; ++t) {
      for (int blk = 0; blk < BPT; ++blk) {
        if (len[blk] == 0) continue;
        const uint64_t b = (uint64_t)tl * BPT + blk;
        for (int q = 0; q < RB; ++q) {
          const uint64_t off = raw_word_off<T>(b, t, q);
          if (off < g.raw_size) {
            const uint64_t v = (uint64_t)sp[t][blk].R[2 * q] | ((uint64_t)sp[t][blk].R[2 * q + 1] << 32);
            memcpy(out + g.raw_off + off, &v, 8);
            csum += cs_u64(g.raw_off + off, v);
          }
        }
        const uint64_t po = g.plane_off + b * (uint64_t)(P * kPlaneBytes) + t;
        for (int p = 0; p < P; ++p) {
          out[po + p * kPlaneBytes] = (uint8_t)pl[t][blk].p[p];
          csum += cs_byte(po + p * kPlaneBytes, pl[t][blk].p[p]);
        }
      }
    }
    // Look-back over a copy in which earlier tiles are randomly left at their
    // aggregate (as if their own look-back had not finished yet).
    std::vector<uint64_t> view(states[row].begin(), states[row].begin() + tl + 1);
    for (uint32_t i = 1; i < tl; ++i)
      if (rng() % 3 == 0) view[i] = kFlagAggregate | own[row][i];
    const uint32_t ex = tl > 0 ? emu_lookback(view, tl) : 0u;
    if (tl > 0) states[row][tl] = kFlagPrefix | (ex + tile_total);
    const bool last_tile = tl + 1 == g.tiles;
    if (last_tile) {
      row_total[row] = (uint64_t)ex + tile_total;
      for (int t = 0; t < kThreads; ++t) {
        const uint64_t wi = (uint64_t)g.nb + t;
        if (8 * wi < g.table_size) memset(out + g.table_off + 8 * wi, 0, 8);
      }
    }
    for (int t = 0; t < kThreads; ++t) {
      for (int blk = 0; blk < BPT; ++blk) {
        if (len[blk] == 0) continue;
        const uint64_t b = (uint64_t)tl * BPT + blk;
        const uint32_t boff = ex + (blk ? cnt0 : 0u);
        if (t == blk) {
          Record r;
          r.esc_offset = boff;
          r.esc_count = blk ? cnt1 : cnt0;
          r.base = win[blk].base;
          r.mode = win[blk].mode;
          const uint64_t v = record_word(r);
          memcpy(out + g.table_off + 8 * b, &v, 8);
          csum += cs_u64(g.table_off + 8 * b, v);
        }
        uint32_t m = pl[t][blk].esc;
        uint64_t gi = (uint64_t)boff + ((excl[t] >> (16 * blk)) & 0xFFFFu);
        while (m) {
          const int k = __builtin_ctz(m);
          m &= m - 1;
          if (gi < g.cap) {
            const uint32_t e = exp_byte(sp[t][blk].E, k);
            out[g.esc_off + gi] = (uint8_t)e;
            csum += cs_byte(g.esc_off + gi, e);
          }
          ++gi;
        }
      }
    }
    row_sum[row] += csum;
  }
  // finalize
  const uint64_t chunks = std::max<uint64_t>(1, (g.esc_size + kZeroChunk - 1) / kZeroChunk);
  for (uint64_t row = 0; row < rows; ++row) {
    uint8_t* out = out_all + row * g.total;
    const uint64_t total = row_total[row];
    const uint64_t written = std::min(total, g.cap);
    for (uint64_t k = 0; k < chunks; ++k) {
      const uint64_t c0 = k * kZeroChunk;
      const uint64_t lo = std::max(written, c0), hi = std::min(g.esc_size, c0 + kZeroChunk);
      if (lo < hi) {
        if (hi % 16) {
          fprintf(stderr, "zero chunk end not 16-aligned\n");
          exit(2);
        }
        const uint64_t lo16 = std::min<uint64_t>(hi, (lo + 15) & ~15ull);
        for (uint64_t i = lo; i < lo16; ++i) out[g.esc_off + i] = 0;
        for (uint64_t i = lo16; i < hi; i += 16) memset(out + g.esc_off + i, 0, 16);
      }
    }
    const uint8_t status = total > g.cap ? kEncOverflow : kEncOk;
    for (int tid = 0; tid < 16; ++tid) {
      uint64_t v;
      if (tid == (int)(kOffChecksum / 8))
        v = row_sum[row] + header_cs(T::kCode, status, g.n, g.cap, total, g.total);
      else
        v = header_word(tid, T::kCode, status, g.n, g.cap, total, g.total);
      memcpy(out + 8 * tid, &v, 8);
    }
    stats[2 * row] = status;
    stats[2 * row + 1] = (int32_t)std::min<uint64_t>(total, 0x7FFFFFFF);
  }
}

// ---- decoder emulation ---------------------------------------------------------------

template <typename T>
int32_t emu_header_status(const uint8_t* in, const Geom& g, bool size_ok) {
  return check_header<T>(in, g.n, g.cap, g.total, size_ok);
}

template <typename T>
void emu_decode(const uint8_t* in_all, uint64_t rows, uint64_t nbytes, uint64_t n, uint64_t cap,
                typename T::bits_t* y_all, int32_t* status) {
  using C = Cfg<T>;
  constexpr int BPT = C::kBPT, P = T::kPlanes, RB = C::kRB;
  const Geom g = geom_of<T>(n, cap);
  const bool size_ok = nbytes == g.total;
  const uint64_t total_tiles = size_ok ? rows * g.tiles : 0;
  const uint64_t esc_chunk = esc_chunk_of(g.esc_size, g.tiles);
  std::vector<uint64_t> row_sum(rows, 0);
  std::vector<uint32_t> row_bad(rows, 0);
  for (uint64_t gt = 0; gt < total_tiles; ++gt) {
    const uint32_t row = (uint32_t)(gt / g.tiles), tl = (uint32_t)(gt - (uint64_t)row * g.tiles);
    const uint8_t* in = in_all + row * nbytes;
    typename T::bits_t* yr = y_all + row * n;
    const uint64_t esc_total = load_u64(in + kOffEscCount);
    // "dec_issue": records, planes, raw words (only what the kernel copies).
    uint64_t srec[3] = {0x1111111111111111ull, 0x2222222222222222ull, 0x3333333333333333ull};
    for (int i = 0; i <= BPT; ++i) {
      const uint64_t b = (uint64_t)tl * BPT + i;
      if (b < g.nb) memcpy(&srec[i], in + g.table_off + 8 * b, 8);
    }
    uint64_t csum = 0;
    uint32_t bad = 0;
    static uint32_t pb[kThreads][2][6], R[kThreads][2][6], vm[kThreads][2], packed[kThreads], excl[kThreads];
    uint32_t len[2] = {0, 0};
    Record rec[2];
    uint64_t recw[2] = {0, 0};
    bool ok[2] = {false, false};
    for (int blk = 0; blk < BPT; ++blk) {
      const uint64_t b = (uint64_t)tl * BPT + blk;
      len[blk] = block_len(n, b);
      recw[blk] = len[blk] ? srec[blk] : 0;
      rec[blk] = record_of_word(recw[blk]);
      const bool has_next = b + 1 < g.nb;
      const uint32_t next_off = has_next ? (uint32_t)srec[blk + 1] : 0u;
      ok[blk] = len[blk] > 0 && record_ok<T>(rec[blk], b, g.nb, len[blk], has_next, next_off, esc_total);
      if (len[blk] && !ok[blk]) bad |= 1u << kDecBadTable;
    }
    uint32_t run = 0;
    for (int t = 0; t < kThreads; ++t) {
      packed[t] = 0;
      for (int blk = 0; blk < BPT; ++blk) {
        const uint64_t b = (uint64_t)tl * BPT + blk;
        vm[t][blk] = valid_mask(len[blk], t);
        uint32_t any = 0;
        for (int p = 0; p < P; ++p) {
          pb[t][blk][p] = len[blk] ? in[g.plane_off + b * P * kPlaneBytes + p * kPlaneBytes + t] : 0u;
          any |= pb[t][blk][p];
        }
        if (any & ~vm[t][blk]) bad |= 1u << kDecBadEscapes;
        for (int q = 0; q < RB; ++q) {
          const uint64_t off = raw_word_off<T>(b, t, q);
          uint64_t v = 0;
          if (b < g.nb && off < g.raw_size) memcpy(&v, in + g.raw_off + off, 8);
          R[t][blk][2 * q] = (uint32_t)v;
          R[t][blk][2 * q + 1] = (uint32_t)(v >> 32);
        }
        packed[t] |= popc(~(pb[t][blk][0] | pb[t][blk][1] | pb[t][blk][2]) & vm[t][blk]) << (16 * blk);
      }
      excl[t] = run;
      run += packed[t];
    }
    const uint32_t tot = run;
    for (int blk = 0; blk < BPT; ++blk) {
      if (len[blk] == 0) continue;
      const uint32_t cnt = (tot >> (16 * blk)) & 0xFFFFu;
      if (cnt != rec[blk].esc_count) bad |= 1u << kDecBadEscapes;
    }
    for (int t = 0; t < kThreads; ++t) {
      for (int blk = 0; blk < BPT; ++blk) {
        if (len[blk] == 0) continue;
        const uint64_t b = (uint64_t)tl * BPT + blk;
        const Window w{rec[blk].base, rec[blk].mode};
        uint32_t E[2];
        decode_exps(pb[t][blk][0], pb[t][blk][1], pb[t][blk][2], w, E);
        uint32_t m = ~(pb[t][blk][0] | pb[t][blk][1] | pb[t][blk][2]) & vm[t][blk];
        uint64_t idx = (uint64_t)rec[blk].esc_offset + ((excl[t] >> (16 * blk)) & 0xFFFFu);
        while (m) {
          const int k = __builtin_ctz(m);
          m &= m - 1;
          const uint32_t e = (ok[blk] && idx < g.cap) ? (uint32_t)in[g.esc_off + idx] : 0u;
          if (ok[blk] && idx >= g.cap) {
            // Not an error for memory safety, but a valid table never gets here.
          }
          set_exp_byte(E, k, e);
          ++idx;
        }
        uint32_t wout[8];
        join_group<T>(R[t][blk], P > 3 ? pb[t][blk][3 % P] : 0u, P > 4 ? pb[t][blk][4 % P] : 0u,
                      P > 5 ? pb[t][blk][5 % P] : 0u, E, wout);
        for (int k = 0; k < 8; ++k)
          if ((vm[t][blk] >> k) & 1u) yr[b * kBlock + 8 * t + k] = (typename T::bits_t)elem<T>(wout, k);
        for (int q = 0; q < RB; ++q)
          csum += cs_u64(g.raw_off + raw_word_off<T>(b, t, q),
                         (uint64_t)R[t][blk][2 * q] | ((uint64_t)R[t][blk][2 * q + 1] << 32));
        const uint64_t po = g.plane_off + b * (uint64_t)(P * kPlaneBytes) + t;
        for (int p = 0; p < P; ++p) csum += cs_byte(po + p * kPlaneBytes, pb[t][blk][p]);
        if (t == blk) csum += cs_u64(g.table_off + 8 * b, recw[blk]);
      }
      if (tl + 1 == g.tiles) {
        const uint64_t wi = (uint64_t)g.nb + t;
        if (8 * wi < g.table_size) csum += cs_u64(g.table_off + 8 * wi, load_u64(in + g.table_off + 8 * wi));
      }
      const uint64_t lo = (uint64_t)tl * esc_chunk;
      const uint64_t hi = std::min(g.esc_size, lo + esc_chunk);
      for (uint64_t i = lo + 16ull * t; i < hi; i += 16ull * kThreads) {
        const uint64_t o = g.esc_off + i;
        for (int k = 0; k < 4; ++k) csum += cs_word(o + 4 * k, load_u32(in + o + 4 * k));
      }
    }
    row_sum[row] += csum;
    row_bad[row] |= bad;
  }
  for (uint64_t row = 0; row < rows; ++row) {
    const uint8_t* in = in_all + row * nbytes;
    uint64_t x = 0;
    if (size_ok) {
      if (g.nb == 0)
        for (uint64_t i = 0; i < g.esc_size; i += 4) x += cs_word(g.esc_off + i, load_u32(in + g.esc_off + i));
      for (int tid = 0; tid < 16; ++tid)
        if (tid != (int)(kOffChecksum / 8)) x += cs_u64(8ull * tid, load_u64(in + 8 * tid));
    }
    int32_t s = nbytes < kHeaderBytes ? (int32_t)kDecBadSize : emu_header_status<T>(in, g, size_ok);
    if (s == kDecOk) {
      const uint64_t cs = row_sum[row] + x;
      if ((g.nb == 0 && load_u64(in + kOffEscCount) != 0) || (row_bad[row] & (1u << kDecBadTable)))
        s = kDecBadTable;
      else if (row_bad[row] & (1u << kDecBadEscapes))
        s = kDecBadEscapes;
      else if (cs != load_u64(in + kOffChecksum))
        s = kDecBadChecksum;
    }
    status[row] = s;
  }
}

// ---- test data -------------------------------------------------------------------------

template <typename T>
typename T::bits_t make_bits(uint32_t sign, uint32_t e, uint64_t man) {
  return (typename T::bits_t)(((uint64_t)sign << (T::kExpBits + T::kManBits)) | ((uint64_t)e << T::kManBits) |
                              (man & ((1ull << T::kManBits) - 1)));
}

template <typename T>
std::vector<typename T::bits_t> gen(const std::string& kind, uint64_t n, std::mt19937_64& rng) {
  using B = typename T::bits_t;
  std::vector<B> v(n);
  std::normal_distribution<double> gauss(0.0, 1.0);
  const int emax = (int)T::kExpMax, center = emax / 2;
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t sign = rng() & 1;
    const uint64_t man = rng();
    int e;
    if (kind == "gauss") {
      e = center + (int)std::floor(std::log2(std::fabs(gauss(rng)) + 1e-30));
    } else if (kind == "laplace") {
      const double u = (double)(rng() >> 11) / 9007199254740992.0;
      e = center - 3 + (int)std::floor(std::log2(-std::log(1.0 - u) + 1e-30));
    } else if (kind == "zeros") {
      v[i] = 0;
      continue;
    } else if (kind == "bits") {
      v[i] = (B)rng();
      continue;
    } else if (kind == "specials") {
      const int c = (int)(rng() % 8);
      if (c == 0) e = 0, v[i] = make_bits<T>(sign, 0, 0);                 // +-0
      else if (c == 1) v[i] = make_bits<T>(sign, emax, 0);                // +-inf
      else if (c == 2) v[i] = make_bits<T>(sign, emax, man | 1);          // NaN payloads
      else if (c == 3) v[i] = make_bits<T>(sign, 0, man | 1);             // subnormals
      else v[i] = make_bits<T>(sign, (uint32_t)(center + (int)(rng() % 5) - 2), man);
      continue;
    } else if (kind == "relu") {
      if (rng() & 1) {
        v[i] = 0;
        continue;
      }
      e = center + (int)std::floor(std::log2(std::fabs(gauss(rng)) + 1e-30));
      v[i] = make_bits<T>(0, (uint32_t)std::max(1, std::min(emax - 1, e)), man);
      continue;
    } else if (kind == "outlier") {
      e = center + (int)std::floor(std::log2(std::fabs(gauss(rng)) + 1e-30));
      if (i % 2048 == 1000) e = emax - 1;
    } else {  // "wide": exponents all over the range
      e = (int)(rng() % (uint64_t)(emax + 1));
    }
    e = std::max(0, std::min(emax, e));
    v[i] = make_bits<T>(sign, (uint32_t)e, man);
  }
  return v;
}

int failures = 0;
int cases = 0;
int status_seen[9] = {0};  // decoder statuses met in the corruption checks

template <typename T>
void check_case(const std::string& kind, uint64_t rows, uint64_t n, int64_t cap_arg, std::mt19937_64& rng) {
  using B = typename T::bits_t;
  ++cases;
  const uint64_t cap = cap_arg >= 0 ? (uint64_t)cap_arg : std::min<uint64_t>((n * 3 + 79) / 80 + 64, n + 128);
  const uint64_t nbytes = encoded_nbytes(T::kCode, n, cap);
  std::vector<B> x = gen<T>(kind, rows * n, rng);
  std::vector<uint8_t> ref(rows * nbytes, 0x5A), emu(rows * nbytes, kGarbage);
  std::vector<int32_t> emu_stats(2 * rows, -7);
  std::vector<cpu::RowStats> ref_stats(rows);
  for (uint64_t r = 0; r < rows; ++r)
    ref_stats[r] = cpu::encode_row(T::kCode, x.data() + r * n, n, cap, ref.data() + r * nbytes);
  emu_encode<T>(x.data(), rows, n, cap, emu.data(), emu_stats.data(), rng);
  char name[160];
  snprintf(name, sizeof name, "dtype=%d kind=%s rows=%llu n=%llu cap=%llu", (int)T::kCode, kind.c_str(),
           (unsigned long long)rows, (unsigned long long)n, (unsigned long long)cap);
  for (uint64_t i = 0; i < rows * nbytes; ++i) {
    if (ref[i] != emu[i]) {
      printf("FAIL encode bytes %s: first mismatch at row %llu byte %llu: cpu %02x emu %02x\n", name,
             (unsigned long long)(i / nbytes), (unsigned long long)(i % nbytes), ref[i], emu[i]);
      ++failures;
      return;
    }
  }
  for (uint64_t r = 0; r < rows; ++r) {
    const int32_t want_cnt = (int32_t)std::min<uint64_t>(ref_stats[r].escape_count, 0x7FFFFFFF);
    if (emu_stats[2 * r] != ref_stats[r].status || emu_stats[2 * r + 1] != want_cnt) {
      printf("FAIL encode stats %s\n", name);
      ++failures;
      return;
    }
  }
  // Decode the (identical) payload; overflowed rows must report 4.
  std::vector<B> y(rows * n, (B)0x7777);
  std::vector<int32_t> st(rows, -1);
  emu_decode<T>(emu.data(), rows, nbytes, n, cap, y.data(), st.data());
  for (uint64_t r = 0; r < rows; ++r) {
    std::vector<B> yc(n);
    const int32_t want = cpu::decode_row(T::kCode, ref.data() + r * nbytes, nbytes, n, cap, yc.data());
    if (st[r] != want) {
      printf("FAIL decode status %s row %llu: cpu %d emu %d\n", name, (unsigned long long)r, want, st[r]);
      ++failures;
      return;
    }
    if (want == kDecOk && memcmp(y.data() + r * n, x.data() + r * n, n * sizeof(B)) != 0) {
      printf("FAIL decode values %s row %llu\n", name, (unsigned long long)r);
      ++failures;
      return;
    }
  }
  // Corruptions: flip bytes in every section, compare statuses with the CPU.
  if (rows == 1 && n > 0) {
    const Geom g = geom_of<T>(n, cap);
    struct Region {
      uint64_t lo, hi;
    };
    const Region regions[] = {{0, 48},
                              {48, 128},
                              {g.table_off, g.table_off + 8 * (uint64_t)g.nb},
                              {g.table_off, g.raw_off},
                              {g.raw_off, g.plane_off},
                              {g.plane_off, g.esc_off},
                              {g.esc_off, g.esc_off + std::min<uint64_t>(g.cap, ref_stats[0].escape_count + 1)},
                              {g.esc_off, g.total}};
    for (const Region& rg : regions) {
      if (rg.hi <= rg.lo) continue;
      for (int it = 0; it < 6; ++it) {
        std::vector<uint8_t> bad = ref;
        const int flips = 1 + (int)(rng() % 3);
        for (int f = 0; f < flips; ++f) {
          const uint64_t pos = rg.lo + rng() % (rg.hi - rg.lo);
          bad[pos] ^= (uint8_t)(1u << (rng() % 8));
        }
        std::vector<B> yc(n), ye(n);
        int32_t se = -1;
        const int32_t sc = cpu::decode_row(T::kCode, bad.data(), nbytes, n, cap, yc.data());
        emu_decode<T>(bad.data(), 1, nbytes, n, cap, ye.data(), &se);
        if (sc >= 0 && sc <= 8) ++status_seen[sc];
        if (sc != se) {
          printf("FAIL corrupt status %s region [%llu,%llu): cpu %d emu %d\n", name, (unsigned long long)rg.lo,
                 (unsigned long long)rg.hi, sc, se);
          ++failures;
          return;
        }
        if (sc == kDecOk && memcmp(yc.data(), ye.data(), n * sizeof(B)) != 0) {
          printf("FAIL corrupt values %s\n", name);
          ++failures;
          return;
        }
      }
    }
    // Crafted table: valid checksum is impossible to keep by random flips, so also
    // re-seal the checksum after editing a record (exercises statuses 6 and 7).
    for (int it = 0; it < 6 && g.nb > 0; ++it) {
      std::vector<uint8_t> bad = ref;
      const uint64_t b = rng() % g.nb;
      Record r = load_record(bad.data() + g.table_off + 8 * b);
      switch (it % 6) {
        case 0: r.esc_count += 1; break;
        case 1: r.esc_offset += 1; break;
        case 2: r.mode = 2; break;
        case 3: r.base = T::kExpMax; break;
        case 4: r.base = r.base > 0 ? r.base - 1 : r.base + 1; break;  // window shift: planes stay
        default: bad[g.plane_off + b * T::kPlanes * kPlaneBytes + (rng() % 256)] ^= 0xFF; break;
      }
      store_record(bad.data() + g.table_off + 8 * b, r);
      uint64_t cs = checksum_span(bad.data(), 0, kOffChecksum / 4) +
                    checksum_span(bad.data() + kOffChecksum + 8, (kOffChecksum + 8) / 4,
                                  (g.total - kOffChecksum - 8) / 4);
      store_u64(bad.data() + kOffChecksum, cs);
      std::vector<B> yc(n), ye(n);
      int32_t se = -1;
      const int32_t sc = cpu::decode_row(T::kCode, bad.data(), nbytes, n, cap, yc.data());
      emu_decode<T>(bad.data(), 1, nbytes, n, cap, ye.data(), &se);
      if (sc >= 0 && sc <= 8) ++status_seen[sc];
      if (sc != se || (sc == kDecOk && memcmp(yc.data(), ye.data(), n * sizeof(B)) != 0)) {
        printf("FAIL crafted table %s case %d: cpu %d emu %d\n", name, it, sc, se);
        ++failures;
        return;
      }
    }
    // Size mismatch (the handler's header-only path).
    for (uint64_t nb2 : {(uint64_t)64, nbytes - 128}) {
      int32_t se = -1;
      std::vector<B> yc(n), ye(n);
      const int32_t sc = cpu::decode_row(T::kCode, ref.data(), nb2, n, cap, yc.data());
      emu_decode<T>(ref.data(), 1, nb2, n, cap, ye.data(), &se);
      if (sc >= 0 && sc <= 8) ++status_seen[sc];
      if (sc != se) {
        printf("FAIL size mismatch %s nbytes=%llu: cpu %d emu %d\n", name, (unsigned long long)nb2, sc, se);
        ++failures;
        return;
      }
    }
  }
}

template <typename T>
void suite(std::mt19937_64& rng, bool big) {
  const char* kinds[] = {"gauss", "laplace", "zeros", "bits", "specials", "relu", "outlier", "wide"};
  const uint64_t sizes[] = {0, 1, 7, 8, 9, 255, 2047, 2048, 2049, 4095, 4096, 4097, 6143, 6145, 12345, 70001};
  for (const char* k : kinds)
    for (uint64_t n : sizes) check_case<T>(k, 1, n, -1, rng);
  // escape capacity: 0, tiny (overflow), exact, huge
  for (int64_t cap : {0, 1, 5, 100, 129, 1000000})
    for (const char* k : {"gauss", "bits", "wide"}) check_case<T>(k, 1, 9000, cap, rng);
  // several rows (odd n: misaligned rows in the kernels), incl. n = 0
  for (uint64_t n : {0, 1, 7, 2049, 5000})
    for (uint64_t rows : {2, 3, 5}) check_case<T>("gauss", rows, n, -1, rng);
  check_case<T>("wide", 3, 3000, 10, rng);  // overflow in several rows
  if (big) {
    check_case<T>("gauss", 1, (1u << 20) + 3, -1, rng);  // > 32 tiles: look-back windows
    check_case<T>("outlier", 2, 300000, -1, rng);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool big = !(argc > 1 && std::string(argv[1]) == "--quick");
  std::mt19937_64 rng(12345);
  suite<BF16Traits>(rng, big);
  suite<F16Traits>(rng, big);
  suite<F32Traits>(rng, big);
  printf("decoder statuses compared on corrupted payloads:");
  for (int i = 0; i <= 8; ++i) printf(" %d:%d", i, status_seen[i]);
  printf("\n%d cases, %d failures\n", cases, failures);
  for (int i = 1; i <= 8; ++i)
    if (!status_seen[i]) {
      printf("FAIL: status %d never produced\n", i);
      ++failures;
    }
  return failures ? 1 : 0;
}
