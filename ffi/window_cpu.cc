// zipccl codec on the CPU: encoder, entry points and their XLA FFI handlers
// (targets "zipccl_zipccl_encode" / "zipccl_zipccl_decode", platform "cpu"); the
// decoder is window_cpu_decode.h, what both share window_cpu_common.h.
//
// Format: docs/format.md and window_format.h. This file is the reference the CUDA
// codec (cuda/window.cu) must reproduce byte for byte.
//
// Speed: the per-block work is branch-free over 8-element groups (one plane byte
// per group), written so that GCC vectorizes it; bf16 and fp16 additionally have
// AVX2 paths for full blocks, chosen at run time (no -march flags: the module runs
// on any x86-64 or aarch64; ZIPCCL_DISABLE_SIMD selects the portable code).
// Rows of >= kParallelMinElems elements are split across threads by whole blocks.
#include "window_cpu.h"

#include "cpu_handler.h"
#include "env.h"
#include "handler_common.h"
#include "window_cpu_common.h"
#include "window_cpu_decode.h"  // decode_row_t

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace zipccl {
namespace cpu {
namespace {

// ---------------------------------------------------------------------------------
// Block encoder (portable). Writes the block's raw bytes and planes, the exponents
// of its escapes to esc[0..count) (kBlock bytes of the caller's), returns the
// record's count, base and mode (the caller codes the escapes and places them).

struct BlockOut {
  Record rec;
};

template <typename T>
Window block_window_generic(const typename T::bits_t* x, uint32_t len) {
  uint64_t S = 0;
  uint32_t N = 0, Z = 0;
  for (uint32_t j = 0; j < len; ++j) {
    uint32_t e = T::exponent(x[j]);
    uint32_t normal = (e != 0) & (e != T::kExpMax);
    S += normal ? e : 0;
    N += normal;
    Z += (e == 0);
  }
  const Window w0 = choose_window<T>(S, N, Z, len);
  int32_t probe[4];
  window_probes(w0, probe);
  uint32_t cnt[4] = {0, 0, 0, 0};
  for (uint32_t j = 0; j < len; ++j) {
    const int32_t e = (int32_t)T::exponent(x[j]);
    for (int k = 0; k < 4; ++k) cnt[k] += (e == probe[k]);
  }
  return refine_window<T>(w0, cnt);
}

template <typename T>
BlockOut encode_block_generic(const typename T::bits_t* x, uint32_t len, uint8_t* raw,
                              uint8_t* planes, uint8_t* esc) {
  const Window w = block_window_generic<T>(x, len);
  uint32_t count = 0;
  const uint32_t ps = plane_bytes_of(len);  // bytes per plane (256 for a full block)
  uint8_t* p0 = planes;
  uint8_t* p1 = planes + ps;
  uint8_t* p2 = planes + 2 * ps;
  for (uint32_t t = 0; t < ps; ++t) {
    uint64_t c8 = 0, r8 = 0, r9 = 0, rs = 0;
    uint32_t valid = 0;
    for (uint32_t k = 0; k < 8; ++k) {
      const uint32_t j = 8 * t + k;
      if (j >= len) break;
      valid |= 1u << k;
      const typename T::bits_t v = x[j];
      const uint32_t e = T::exponent(v);
      const uint32_t c = code_of(e, w);
      c8 |= (uint64_t)c << (8 * k);
      const uint32_t r = T::raw(v);
      if (T::kRawBytes == 1) {
        raw[j] = (uint8_t)r;
      } else {
        raw[3 * j] = (uint8_t)r;
        raw[3 * j + 1] = (uint8_t)(r >> 8);
        raw[3 * j + 2] = (uint8_t)(r >> 16);
      }
      if (T::kRawPlanes) {
        r8 |= (uint64_t)((r >> 8) & 1) << (8 * k);
        r9 |= (uint64_t)((r >> 9) & 1) << (8 * k);
        rs |= (uint64_t)((r >> 10) & 1) << (8 * k);
      }
    }
    const uint32_t b0 = pack8(c8 & 0x0101010101010101ull);
    const uint32_t b1 = pack8((c8 >> 1) & 0x0101010101010101ull);
    const uint32_t b2 = pack8((c8 >> 2) & 0x0101010101010101ull);
    p0[t] = (uint8_t)b0;
    p1[t] = (uint8_t)b1;
    p2[t] = (uint8_t)b2;
    if (T::kRawPlanes) {
      planes[3 * ps + t] = (uint8_t)pack8(r8);
      planes[4 * ps + t] = (uint8_t)pack8(r9);
      planes[5 * ps + t] = (uint8_t)pack8(rs);
    }
    uint32_t escm = ~(b0 | b1 | b2) & valid;
    while (escm) {
      const uint32_t k = __builtin_ctz(escm);
      escm &= escm - 1;
      esc[count++] = (uint8_t)T::exponent(x[8 * t + k]);
    }
  }
  BlockOut o;
  o.rec = Record{0, count, w.base, w.mode, 0, 0};
  return o;
}

#if ZIPCCL_X86
// A full block (len == kBlock) of bf16 or fp16, AVX2. Same output as
// encode_block_generic<T>. The two dtypes differ only in pass 1 (how a 16-bit word
// splits into exponent, raw byte and raw planes):
//   bf16 s|e8|m7:  e = v[14:7];  raw byte = s<<7 | m[6:0];  no raw planes
//   fp16 s|e5|m10: e = v[14:10]; raw byte = m[7:0]; planes 3, 4, 5 = m8, m9, s
//                  (v[8], v[9], v[15]: bits 0, 1, 7 of the word's high byte)
// Exponents are bytes from then on (fp16's <= 31), so the window statistics, the
// probe counts and pass 2 are shared.
template <typename T>
__attribute__((target("avx2,bmi,popcnt"))) BlockOut encode_block_avx2(
    const uint16_t* x, uint8_t* raw, uint8_t* planes, uint8_t* esc) {
  static_assert(std::is_same<T, BF16Traits>::value || std::is_same<T, F16Traits>::value,
                "the AVX2 block paths cover the 16-bit dtypes");
  constexpr bool kF16 = std::is_same<T, F16Traits>::value;
  alignas(32) uint8_t ebuf[kBlock];
  const __m256i m7f = _mm256_set1_epi16(0x7F);
  const __m256i m80 = _mm256_set1_epi16(0x80);
  const __m256i mff = _mm256_set1_epi16(0xFF);
  const __m256i emask = _mm256_set1_epi16((short)T::kExpMax);
  const __m256i zero = _mm256_setzero_si256();
  const __m256i emax = _mm256_set1_epi8((char)T::kExpMax);
  __m256i sad = zero;
  uint32_t N = 0, Z = 0;
  // Pass 1: exponent bytes (kept in ebuf, L1), raw bytes (and fp16's raw planes),
  // and the window statistics.
  for (uint32_t j = 0; j < kBlock; j += 32) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j + 16));
    __m256i ea = _mm256_and_si256(_mm256_srli_epi16(a, T::kManBits), emask);
    __m256i eb = _mm256_and_si256(_mm256_srli_epi16(b, T::kManBits), emask);
    __m256i ra, rb;
    if constexpr (kF16) {
      ra = _mm256_and_si256(a, mff);
      rb = _mm256_and_si256(b, mff);
    } else {
      ra = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 8), m80), _mm256_and_si256(a, m7f));
      rb = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 8), m80), _mm256_and_si256(b, m7f));
    }
    // packus interleaves the 128-bit lanes (a0-7 b0-7 a8-15 b8-15); 0xD8 restores
    // element order.
    __m256i e = _mm256_permute4x64_epi64(_mm256_packus_epi16(ea, eb), 0xD8);
    __m256i r = _mm256_permute4x64_epi64(_mm256_packus_epi16(ra, rb), 0xD8);
    _mm256_store_si256(reinterpret_cast<__m256i*>(ebuf + j), e);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(raw + j), r);
    if constexpr (kF16) {
      // High bytes in element order; bit k of a byte -> bit 7 by a 16-bit shift
      // left by 7 - k (the bits a shift carries in from the low byte land below
      // bit 7), then movemask: one plane word of 32 elements.
      __m256i h = _mm256_permute4x64_epi64(
          _mm256_packus_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8)), 0xD8);
      const uint32_t m8 = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(h, 7));
      const uint32_t m9 = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(h, 6));
      const uint32_t ms = (uint32_t)_mm256_movemask_epi8(h);
      std::memcpy(planes + 3 * kPlaneBytes + j / 8, &m8, 4);
      std::memcpy(planes + 4 * kPlaneBytes + j / 8, &m9, 4);
      std::memcpy(planes + 5 * kPlaneBytes + j / 8, &ms, 4);
    }
    __m256i isz = _mm256_cmpeq_epi8(e, zero);
    __m256i ismax = _mm256_cmpeq_epi8(e, emax);
    __m256i abnormal = _mm256_or_si256(isz, ismax);
    sad = _mm256_add_epi64(sad, _mm256_sad_epu8(_mm256_andnot_si256(abnormal, e), zero));
    N += 32 - __builtin_popcount((uint32_t)_mm256_movemask_epi8(abnormal));
    Z += __builtin_popcount((uint32_t)_mm256_movemask_epi8(isz));
  }
  alignas(32) uint64_t s4[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(s4), sad);
  const uint64_t S = s4[0] + s4[1] + s4[2] + s4[3];
  const Window w0 = choose_window<T>(S, N, Z, kBlock);
  int32_t probe[4];
  window_probes(w0, probe);
  // Count the four probe exponents in byte lanes: each lane sees 64 of the block's
  // elements, so a byte counter cannot overflow; one psadbw per probe sums them.
  // A probe outside 0..255 (base-1 < 0 or base+7 > 255) counts nothing; fp16's
  // probes up to 32 match no exponent byte (<= 31) by themselves.
  uint32_t cnt[4] = {0, 0, 0, 0};
  {
    __m256i pv[4], acc[4];
    for (int k = 0; k < 4; ++k) {
      pv[k] = _mm256_set1_epi8((char)probe[k]);
      acc[k] = zero;
    }
    for (uint32_t j = 0; j < kBlock; j += 32) {
      __m256i e = _mm256_load_si256(reinterpret_cast<const __m256i*>(ebuf + j));
      for (int k = 0; k < 4; ++k) acc[k] = _mm256_sub_epi8(acc[k], _mm256_cmpeq_epi8(e, pv[k]));
    }
    for (int k = 0; k < 4; ++k) {
      if (probe[k] < 0 || probe[k] > 255) continue;
      alignas(32) uint64_t s4k[4];
      _mm256_store_si256(reinterpret_cast<__m256i*>(s4k), _mm256_sad_epu8(acc[k], zero));
      cnt[k] = (uint32_t)(s4k[0] + s4k[1] + s4k[2] + s4k[3]);
    }
  }
  const Window w = refine_window<T>(w0, cnt);

  // Pass 2: codes -> three bit planes (movemask), escapes in element order.
  const __m256i vbase = _mm256_set1_epi8((char)w.base);
  const __m256i one = _mm256_set1_epi8(1);
  const __m256i two = _mm256_set1_epi8(2);
  const __m256i lim = _mm256_set1_epi8(w.mode == 0 ? 6 : 5);
  uint32_t count = 0;
  for (uint32_t j = 0; j < kBlock; j += 32) {
    __m256i e = _mm256_load_si256(reinterpret_cast<const __m256i*>(ebuf + j));
    __m256i d = _mm256_sub_epi8(e, vbase);
    __m256i in = _mm256_cmpeq_epi8(_mm256_min_epu8(d, lim), d);
    __m256i c;
    if (w.mode == 0) {
      c = _mm256_and_si256(_mm256_add_epi8(d, one), in);
    } else {
      c = _mm256_or_si256(_mm256_and_si256(_mm256_add_epi8(d, two), in),
                          _mm256_and_si256(_mm256_cmpeq_epi8(e, zero), one));
    }
    const uint32_t m0 = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(c, 7));
    const uint32_t m1 = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(c, 6));
    const uint32_t m2 = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(c, 5));
    std::memcpy(planes + j / 8, &m0, 4);
    std::memcpy(planes + kPlaneBytes + j / 8, &m1, 4);
    std::memcpy(planes + 2 * kPlaneBytes + j / 8, &m2, 4);
    uint32_t escm = ~(m0 | m1 | m2);
    while (escm) {
      const uint32_t k = __builtin_ctz(escm);
      escm &= escm - 1;
      esc[count++] = ebuf[j + k];
    }
  }
  BlockOut o;
  o.rec = Record{0, count, w.base, w.mode, 0, 0};
  return o;
}

#endif

template <typename T>
BlockOut encode_block(const typename T::bits_t* x, uint32_t len, uint8_t* raw, uint8_t* planes,
                      uint8_t* esc) {
#if ZIPCCL_X86
  if constexpr (std::is_same<T, BF16Traits>::value || std::is_same<T, F16Traits>::value) {
    if (len == kBlock && have_avx2() && !env::simd_disabled())
      return encode_block_avx2<T>(x, raw, planes, esc);
  }
#endif
  return encode_block_generic<T>(x, len, raw, planes, esc);
}

// ---------------------------------------------------------------------------------
// Row encoder.

// Codes a block's escapes (exponents ex[0..count), window w): fills the record's
// width and split and writes its stream (window_format.h, "escape coding") to
// out[0..stream_bytes), only the bytes below `room` (the rest of the capacity).
// Returns the stream bytes.
inline uint32_t code_escapes(const uint8_t* ex, Record* r, uint8_t* out, uint64_t room) {
  const uint32_t count = r->esc_count, lo = r->base, hi = window_hi(r->base, r->mode);
  uint32_t db = 0, da = 0;
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t e = ex[i];
    if (e < lo) db = std::max(db, lo - e);
    else da = std::max(da, e - hi);  // e > hi: escapes lie outside the window
  }
  escape_width(count, db, da, &r->width, &r->split);
  const uint32_t sb = stream_bytes(count, r->width);
  if (r->width == 8) {
    std::memcpy(out, ex, std::min<uint64_t>(count, room));
    return sb;
  }
  uint64_t acc = 0;
  uint32_t bits = 0, o = 0;
  for (uint32_t i = 0; i < count; ++i) {
    acc |= (uint64_t)escape_value(ex[i], lo, hi, r->width, r->split) << bits;
    bits += r->width;
    for (; bits >= 8; bits -= 8, acc >>= 8, ++o)
      if (o < room) out[o] = (uint8_t)acc;
  }
  if (bits && o < room) out[o] = (uint8_t)acc;
  return sb;
}

template <typename T>
RowStats encode_row_t(const typename T::bits_t* x, uint64_t n, uint64_t capacity, uint8_t* out) {
  const DtypeCode d = T::kCode;
  const Layout L = layout_of(d, n, capacity);
  const uint64_t nb = num_blocks(n);
  const uint32_t P = T::kPlanes;
  // Zero everything the blocks do not write: padding, the tail of the last
  // plane group, the unused part of the escape section.
  std::memset(out, 0, kHeaderBytes);
  std::memset(out + L.table_off, 0, L.raw_off - L.table_off);
  const uint64_t raw_used = n * (uint64_t)T::kRawBytes;
  std::memset(out + L.raw_off + raw_used, 0, (L.plane_off - L.raw_off) - raw_used);
  // The last block's planes (its positions >= len) and the plane section's padding.
  if (nb) std::memset(out + L.plane_off + (nb - 1) * P * kPlaneBytes, 0, L.esc_off - L.plane_off - (nb - 1) * P * kPlaneBytes);

  const int nt = num_threads_for(n);
  std::vector<uint64_t> t_b0(nt + 1);
  for (int t = 0; t <= nt; ++t) t_b0[t] = nb * t / nt;
  std::vector<uint64_t> t_count(nt, 0);   // escape-section bytes of the thread's blocks
  std::vector<uint64_t> t_escapes(nt, 0);
  std::vector<uint64_t> t_cs(nt, 0);
  std::vector<std::vector<uint8_t>> t_esc(nt);
  uint8_t* esc_sec = out + L.esc_off;

  parallel_for(nt, [&](int t) {
    const uint64_t b0 = t_b0[t], b1 = t_b0[t + 1];
    // Thread 0's escapes start at offset 0, so it writes them in place; the others
    // stage theirs until the prefix over threads is known.
    uint8_t* esc;
    uint64_t esc_cap;
    if (t == 0) {
      esc = esc_sec;
      esc_cap = capacity;
    } else {
      esc_cap = std::min<uint64_t>(capacity, (b1 - b0) * kBlock);
      t_esc[t].resize(esc_cap);
      esc = t_esc[t].data();
    }
    uint64_t have = 0, escapes = 0;
    uint64_t acc = 0;
    alignas(32) uint8_t ex[kBlock];  // the block's escaped exponents
    for (uint64_t b = b0; b < b1; ++b) {
      const uint64_t i0 = b * kBlock;
      const uint32_t len = (uint32_t)std::min<uint64_t>(kBlock, n - i0);
      uint8_t* raw = out + L.raw_off + i0 * T::kRawBytes;
      uint8_t* planes = out + L.plane_off + b * P * kPlaneBytes;
      BlockOut o = encode_block<T>(x + i0, len, raw, planes, ex);
      Record r = o.rec;
      const uint64_t at = std::min(have, esc_cap);
      const uint32_t sb = code_escapes(ex, &r, esc + at, esc_cap - at);
      r.esc_offset = (uint32_t)have;  // local; fixed up below
      store_record(out + L.table_off + b * kRecordBytes, r);
      have += sb;
      escapes += r.esc_count;
      // Checksum of this block's raw bytes (the last block: up to the raw section's
      // end, padding included) and planes, while they are in L1.
      const uint64_t raw_pos = L.raw_off + i0 * T::kRawBytes;
      const uint64_t raw_len = (b + 1 == nb) ? L.plane_off - raw_pos : (uint64_t)kBlock * T::kRawBytes;
      acc += cs_bytes(raw, raw_pos, raw_len);
      acc += cs_bytes(planes, L.plane_off + b * P * kPlaneBytes, plane_span(L, P, b, nb));
    }
    t_count[t] = have;
    t_escapes[t] = escapes;
    t_cs[t] = acc;
  });

  // Prefix over threads; place staged escapes; fix record offsets.
  uint64_t total = 0, escapes = 0;   // escape-section bytes, escapes
  std::vector<uint64_t> t_pre(nt);
  for (int t = 0; t < nt; ++t) {
    t_pre[t] = total;
    total += t_count[t];
    escapes += t_escapes[t];
  }
  const uint64_t written = std::min(total, capacity);
  // The escape area past the escapes: most of a worst-case buffer's tail (~19 MiB
  // for 64 MiB of bf16 under jit); fresh pages are left to the kernel's zero fill.
  if (written < align_up(capacity)) cpu_handler::zero_tail(esc_sec + written, align_up(capacity) - written);
  parallel_for(nt, [&](int t) {
    if (t > 0 && t_pre[t] < capacity) {
      uint64_t m = std::min<uint64_t>(t_count[t], capacity - t_pre[t]);
      std::memcpy(esc_sec + t_pre[t], t_esc[t].data(), m);
    }
    if (t > 0) {
      for (uint64_t b = t_b0[t]; b < t_b0[t + 1]; ++b) {
        uint8_t* p = out + L.table_off + b * kRecordBytes;
        store_u32(p, (uint32_t)(load_u32(p) + t_pre[t]));
      }
    }
  });

  // A row that fits uses esc_off + align128(total) bytes; the escape bytes past
  // `total` are zero (above), so the checksum over the whole escape section equals
  // the one over [0, used). A row that does not fit "uses" its whole buffer.
  const uint8_t status = total > capacity ? kEncDoesNotFit : kEncOk;
  const Header h{d, status, n, status == kEncOk ? L.esc_off + align_up(total) : L.total, capacity, escapes, total};
  uint64_t cs = header_checksum(h);
  for (int t = 0; t < nt; ++t) cs += t_cs[t];
  cs += cs_span(out + L.table_off, L.table_off, L.raw_off - L.table_off);  // table + padding
  // Zero words add nothing to the position-weighted sum, so only the escape bytes
  // written count; summing the zeroed rest of a worst-case buffer (~19 MiB for 64 MiB
  // of bf16 under jit, which encodes with max_escape_capacity) doubled encode time.
  cs += cs_span(esc_sec, L.esc_off, align_up(written));
  store_header(out, h, cs);
  RowStats s;
  s.status = status;
  s.escape_count = escapes;
  s.used_nbytes = h.used;
  return s;
}

}  // namespace

RowStats encode_row(DtypeCode d, const void* x, uint64_t n, uint64_t capacity, uint8_t* out) {
  switch (d) {
    case kBF16: return encode_row_t<BF16Traits>(static_cast<const uint16_t*>(x), n, capacity, out);
    case kF16: return encode_row_t<F16Traits>(static_cast<const uint16_t*>(x), n, capacity, out);
    default: return encode_row_t<F32Traits>(static_cast<const uint32_t*>(x), n, capacity, out);
  }
}

int32_t decode_row(DtypeCode d, const uint8_t* in, uint64_t nbytes, uint64_t n, void* y) {
  switch (d) {
    case kBF16: return decode_row_t<BF16Traits>(in, nbytes, n, static_cast<uint16_t*>(y));
    case kF16: return decode_row_t<F16Traits>(in, nbytes, n, static_cast<uint16_t*>(y));
    default: return decode_row_t<F32Traits>(in, nbytes, n, static_cast<uint32_t*>(y));
  }
}

}  // namespace cpu
}  // namespace zipccl

// ---------------------------------------------------------------------------------
// XLA FFI handlers (signatures and shape checks: handler_common.h). The workspace is
// unused on the CPU; the CUDA handlers of the same name use it.

namespace ffi = xla::ffi;

namespace {

using zipccl::handler::Shape;

using zipccl::cpu_handler::advise_hugepages;

ffi::Error EncodeCpuImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::U8> skip, ffi::Result<ffi::Buffer<ffi::U8>> payload,
                         ffi::Result<ffi::Buffer<ffi::S32>> stats,
                         ffi::Result<ffi::Buffer<ffi::U8>> workspace) {
  Shape s;
  if (ffi::Error e = zipccl::handler::check_encode(x.element_type(), x.dimensions(), payload->dimensions(),
                                                   stats->dimensions(), workspace->dimensions(), &s);
      e.failure())
    return e;
  if (ffi::Error e = zipccl::handler::check_skip(zipccl::handler::kEncodeTarget, skip.element_count(), s.rows);
      e.failure())
    return e;
  const uint8_t* xb = static_cast<const uint8_t*>(x.untyped_data());
  const uint8_t* sk = skip.typed_data();
  const uint64_t esize = (uint64_t)zipccl::elem_bytes_of(s.d);
  const uint64_t cap = zipccl::max_escape_capacity(s.d, s.n);
  uint8_t* out = payload->typed_data();
  advise_hugepages(out, s.rows * s.nbytes);
  int32_t* st = stats->typed_data();
  for (uint64_t r = 0; r < s.rows; ++r) {
    if (sk[r]) {  // not needed by the caller: payload row left unwritten, stats zero
      zipccl::store_row_stats(st + zipccl::handler::kStatsWidth * r, 0, 0, 0, s.nbytes);
      continue;
    }
    const zipccl::cpu::RowStats rs = zipccl::cpu::encode_row(s.d, xb + r * s.n * esize, s.n, cap, out + r * s.nbytes);
    zipccl::store_row_stats(st + zipccl::handler::kStatsWidth * r, rs.status, rs.escape_count, rs.used_nbytes,
                            s.nbytes);
  }
  return ffi::Error::Success();
}

ffi::Error DecodeCpuImpl(ffi::Buffer<ffi::U8> payload, ffi::Buffer<ffi::U8> skip, ffi::AnyBuffer fill,
                         ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::Buffer<ffi::S32>> status,
                         ffi::Result<ffi::Buffer<ffi::U8>> workspace) {
  Shape s;
  if (ffi::Error e = zipccl::handler::check_decode(payload.dimensions(), y->element_type(), y->dimensions(),
                                                   status->element_count(), workspace->dimensions(), &s);
      e.failure())
    return e;
  uint64_t group = 0;
  if (ffi::Error e = zipccl::handler::check_skip(zipccl::handler::kDecodeTarget, skip.element_count(), s.rows);
      e.failure())
    return e;
  if (ffi::Error e = zipccl::handler::check_fill(zipccl::handler::kDecodeTarget, fill.element_type(),
                                                 y->element_type(), fill.dimensions(), s.rows, s.n, &group);
      e.failure())
    return e;
  const uint8_t* in = payload.typed_data();
  const uint8_t* sk = skip.typed_data();
  const uint8_t* fb = static_cast<const uint8_t*>(fill.untyped_data());
  uint8_t* yb = static_cast<uint8_t*>(y->untyped_data());
  const uint64_t esize = (uint64_t)zipccl::elem_bytes_of(s.d);
  advise_hugepages(yb, s.rows * s.n * esize);
  int32_t* st = status->typed_data();
  for (uint64_t r = 0; r < s.rows; ++r) {
    if (sk[r]) {  // the caller's own row: copied from fill, never decoded
      if (s.n && group) std::memcpy(yb + r * s.n * esize, fb + (r / group) * s.n * esize, s.n * esize);
      st[r] = 0;
      continue;
    }
    st[r] = zipccl::cpu::decode_row(s.d, in + r * s.nbytes, s.nbytes, s.n, yb + r * s.n * esize);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEncodeCpu, EncodeCpuImpl,
                              zipccl::handler::bind_encode(ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecodeCpu, DecodeCpuImpl,
                              zipccl::handler::bind_decode(ffi::Ffi::Bind()));
