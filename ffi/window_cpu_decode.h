// Part of the CPU window codec (window_cpu.cc, the only file that includes it): the
// block and row decoders (portable and AVX2; every read is bounds-checked against
// the row and returns a status on malformed data, docs/format.md).
#pragma once

#include "env.h"
#include "window_cpu_common.h"

#include <cstring>
#include <type_traits>

namespace zipccl {
namespace cpu {
namespace {

// ---------------------------------------------------------------------------------
// Block decoder. The caller has validated the record; here the block's escape count
// is checked against the planes before any escape byte is read.

template <typename T>
bool decode_block_generic(const uint8_t* raw, const uint8_t* planes, const uint8_t* esc, Record r,
                          uint32_t len, typename T::bits_t* y) {
  const Window w{r.base, r.mode};
  const uint32_t ps = plane_bytes_of(len);  // bytes per plane (256 for a full block)
  const uint8_t* p0 = planes;
  const uint8_t* p1 = planes + ps;
  const uint8_t* p2 = planes + 2 * ps;
  // Count escapes and check padding bits first: no escape byte is read unless the
  // block's planes agree with its record.
  uint32_t count = 0;
  for (uint32_t t = 0; t < ps; ++t) {
    const uint32_t lo = 8 * t;
    const uint32_t valid = lo >= len ? 0u : (len - lo >= 8 ? 0xFFu : (1u << (len - lo)) - 1);
    uint32_t any = p0[t] | p1[t] | p2[t];
    for (uint32_t p = 3; p < (uint32_t)T::kPlanes; ++p) any |= planes[p * ps + t];
    if (any & ~valid) return false;  // a padding bit is set
    count += __builtin_popcount(~(p0[t] | p1[t] | p2[t]) & valid);
  }
  if (count != r.esc_count) return false;
  if constexpr (T::kExpMax < 255) {  // fp16: an escape byte > 31 would spill into the sign
    for (uint32_t k = 0; k < count; ++k)
      if (esc[k] > T::kExpMax) return false;
  }
  uint8_t lut[8];
  for (uint32_t c = 0; c < 8; ++c) lut[c] = c ? (uint8_t)exp_of(c, w) : 0;
  uint32_t used = 0;
  for (uint32_t t = 0; t < ps && 8 * t < len; ++t) {
    const uint64_t c8 = spread8(p0[t]) | (spread8(p1[t]) << 1) | (spread8(p2[t]) << 2);
    uint64_t r89 = 0;
    if (T::kRawPlanes) {
      r89 = spread8(planes[3 * ps + t]) | (spread8(planes[4 * ps + t]) << 1) |
            (spread8(planes[5 * ps + t]) << 2);
    }
    const uint32_t kend = std::min<uint32_t>(8, len - 8 * t);
    for (uint32_t k = 0; k < kend; ++k) {
      const uint32_t j = 8 * t + k;
      const uint32_t c = (uint32_t)(c8 >> (8 * k)) & 7;
      const uint32_t e = c ? lut[c] : esc[used++];
      uint32_t rv;
      if (T::kRawBytes == 1) {
        rv = raw[j];
      } else {
        rv = (uint32_t)raw[3 * j] | ((uint32_t)raw[3 * j + 1] << 8) | ((uint32_t)raw[3 * j + 2] << 16);
      }
      if (T::kRawPlanes) rv |= (uint32_t)((r89 >> (8 * k)) & 7) << 8;
      y[j] = (typename T::bits_t)T::join(rv, e);
    }
  }
  return true;
}

#if ZIPCCL_X86
// 32 plane bits -> 32 bytes of 0xFF (bit set) / 0x00.
__attribute__((target("avx2"), always_inline)) inline __m256i expand32_avx2(uint32_t m, __m256i spread_idx,
                                                                            __m256i bitsel) {
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), spread_idx);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, bitsel), bitsel);
}

// A full block (len == kBlock) of bf16 or fp16, AVX2. Same words (and the same
// verdict on a block that disagrees with its record) as decode_block_generic<T>.
template <typename T>
__attribute__((target("avx2,bmi,popcnt"))) bool decode_block_avx2(
    const uint8_t* raw, const uint8_t* planes, const uint8_t* esc, Record r, uint16_t* y) {
  static_assert(std::is_same<T, BF16Traits>::value || std::is_same<T, F16Traits>::value,
                "the AVX2 block paths cover the 16-bit dtypes");
  constexpr bool kF16 = std::is_same<T, F16Traits>::value;
  const Window w{r.base, r.mode};
  const uint32_t* p0 = reinterpret_cast<const uint32_t*>(planes);
  const uint32_t* p1 = reinterpret_cast<const uint32_t*>(planes + kPlaneBytes);
  const uint32_t* p2 = reinterpret_cast<const uint32_t*>(planes + 2 * kPlaneBytes);
  uint32_t count = 0;
  for (uint32_t g = 0; g < kBlock / 32; ++g) {
    uint32_t a, b, c;
    std::memcpy(&a, p0 + g, 4);
    std::memcpy(&b, p1 + g, 4);
    std::memcpy(&c, p2 + g, 4);
    count += __builtin_popcount(~(a | b | c));
  }
  if (count != r.esc_count) return false;
  if constexpr (kF16) {  // an escape byte > 31 would spill into the sign (as in the generic path)
    uint32_t high = 0;
    for (uint32_t k = 0; k < count; ++k) high |= esc[k] & ~T::kExpMax;
    if (high) return false;
  }
  // The record was validated (window_valid<T>), so every table entry is <= kExpMax.
  alignas(16) uint8_t lut[16] = {0};
  for (uint32_t cc = 1; cc < 8; ++cc) lut[cc] = (uint8_t)exp_of(cc, w);
  const __m256i vlut = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(lut)));
  // Byte j of a 32-bit plane word -> byte j/8 broadcast, then test bit j%8.
  const __m256i spread_idx = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                              2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bitsel = _mm256_set1_epi64x((long long)0x8040201008040201ull);
  const __m256i m7f = _mm256_set1_epi16(0x7F);
  const __m256i m80 = _mm256_set1_epi16(0x80);
  const __m256i one = _mm256_set1_epi8(1), two = _mm256_set1_epi8(2), four = _mm256_set1_epi8(4);
  const __m256i b80 = _mm256_set1_epi8((char)0x80);
  const uint32_t* p3 = reinterpret_cast<const uint32_t*>(planes + 3 * kPlaneBytes);
  const uint32_t* p4 = reinterpret_cast<const uint32_t*>(planes + 4 * kPlaneBytes);
  const uint32_t* p5 = reinterpret_cast<const uint32_t*>(planes + 5 * kPlaneBytes);
  uint32_t used = 0;
  alignas(32) uint8_t ebuf[32];
  for (uint32_t g = 0; g < kBlock / 32; ++g) {
    uint32_t a, b, c;
    std::memcpy(&a, p0 + g, 4);
    std::memcpy(&b, p1 + g, 4);
    std::memcpy(&c, p2 + g, 4);
    __m256i code = _mm256_or_si256(
        _mm256_and_si256(expand32_avx2(a, spread_idx, bitsel), one),
        _mm256_or_si256(_mm256_and_si256(expand32_avx2(b, spread_idx, bitsel), two),
                        _mm256_and_si256(expand32_avx2(c, spread_idx, bitsel), four)));
    __m256i e = _mm256_shuffle_epi8(vlut, code);
    uint32_t escm = ~(a | b | c);
    if (escm) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(ebuf), e);
      while (escm) {
        const uint32_t k = __builtin_ctz(escm);
        escm &= escm - 1;
        ebuf[k] = esc[used++];
      }
      e = _mm256_load_si256(reinterpret_cast<const __m256i*>(ebuf));
    }
    __m256i rb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(raw + 32 * g));
    if constexpr (kF16) {
      // High byte of each word = s<<7 | e<<2 | m9<<1 | m8 (e <= 31: e<<2 stays in
      // its byte); low byte = the raw byte m[7:0].
      uint32_t m8, m9, ms;
      std::memcpy(&m8, p3 + g, 4);
      std::memcpy(&m9, p4 + g, 4);
      std::memcpy(&ms, p5 + g, 4);
      const __m256i e2 = _mm256_add_epi8(e, e);
      __m256i hb = _mm256_or_si256(
          _mm256_or_si256(_mm256_add_epi8(e2, e2), _mm256_and_si256(expand32_avx2(m8, spread_idx, bitsel), one)),
          _mm256_or_si256(_mm256_and_si256(expand32_avx2(m9, spread_idx, bitsel), two),
                          _mm256_and_si256(expand32_avx2(ms, spread_idx, bitsel), b80)));
      // unpack works per 128-bit lane: lo = words 0-7 | 16-23, hi = 8-15 | 24-31.
      const __m256i lo = _mm256_unpacklo_epi8(rb, hb);
      const __m256i hi = _mm256_unpackhi_epi8(rb, hb);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + 32 * g), _mm256_permute2x128_si256(lo, hi, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + 32 * g + 16), _mm256_permute2x128_si256(lo, hi, 0x31));
    } else {
      __m256i r_lo = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(rb));
      __m256i r_hi = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(rb, 1));
      __m256i e_lo = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(e));
      __m256i e_hi = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(e, 1));
      __m256i y_lo = _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(r_lo, m80), 8),
                                                     _mm256_slli_epi16(e_lo, 7)),
                                     _mm256_and_si256(r_lo, m7f));
      __m256i y_hi = _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(r_hi, m80), 8),
                                                     _mm256_slli_epi16(e_hi, 7)),
                                     _mm256_and_si256(r_hi, m7f));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + 32 * g), y_lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + 32 * g + 16), y_hi);
    }
  }
  return true;
}
#endif

// A block's escape stream (window_format.h, "escape coding") -> the exponents
// ex[0..count). False when a value names no exponent of the dtype or a bit past
// count * width is set. Reads exactly stream_bytes(count, width) bytes.
template <typename T>
bool unpack_escapes(const uint8_t* in, const Record& r, uint8_t* ex) {
  const uint32_t count = r.esc_count, w = r.width, lo = r.base, hi = window_hi(r.base, r.mode);
  if (w == 8) {
    uint32_t high = 0;
    for (uint32_t i = 0; i < count; ++i) high |= in[i] & ~T::kExpMax;
    std::memcpy(ex, in, count);
    return high == 0;
  }
  // Value -> exponent table of the block (2^w <= 128 entries; 0x100 marks a value
  // that names no exponent), then one lookup per escape.
  uint16_t lut[128];
  for (uint32_t v = 0; v < (1u << w); ++v) {
    uint32_t e;
    lut[v] = escape_exponent<T>(v, lo, hi, r.mode, w, r.split, &e) ? (uint16_t)e : (uint16_t)0x100;
  }
  const uint32_t sb = stream_bytes(count, w);
  const uint64_t mask = (1u << w) - 1;
  uint64_t acc = 0;
  uint32_t bits = 0, o = 0, bad = 0;
  for (uint32_t i = 0; i < count; ++i) {
    if (bits < w)  // refill to 57+ bits, never past the stream
      for (; bits <= 56 && o < sb; bits += 8) acc |= (uint64_t)in[o++] << bits;
    const uint32_t x = lut[acc & mask];
    bad |= x;
    ex[i] = (uint8_t)x;
    acc >>= w;
    bits -= w;
  }
  return !(bad & 0x100) && acc == 0;  // acc: the stream's last bits past count * w
}

template <typename T>
bool decode_block(const uint8_t* raw, const uint8_t* planes, const uint8_t* stream, Record r,
                  uint32_t len, typename T::bits_t* y) {
  // The escapes first, as exponent bytes: the block decoders read esc[0..count).
  alignas(32) uint8_t esc[kBlock];
  if (r.esc_count > len || !unpack_escapes<T>(stream, r, esc)) return false;
#if ZIPCCL_X86
  if constexpr (std::is_same<T, BF16Traits>::value || std::is_same<T, F16Traits>::value) {
    if (len == kBlock && have_avx2() && !env::simd_disabled())
      return decode_block_avx2<T>(raw, planes, esc, r, y);
  }
#endif
  return decode_block_generic<T>(raw, planes, esc, r, len, y);
}

// True when bytes [lo, hi) are all zero.
inline bool all_zero(const uint8_t* p, uint64_t lo, uint64_t hi) {
  for (uint64_t i = lo; i < hi; ++i)
    if (p[i]) return false;
  return true;
}

template <typename T>
int32_t decode_row_checked(const uint8_t* in, uint64_t nbytes, uint64_t n, typename T::bits_t* y) {
  const DtypeCode d = T::kCode;
  Layout L;  // offsets of the fixed part (the escape section's size is the header's)
  if (nbytes < kHeaderBytes || !layout_checked(d, n, 0, &L)) return kDecBadSize;
  // 1-5: header; afterwards used <= nbytes, and [0, used) holds every section.
  HeaderInfo hi;
  const int32_t hs = check_header<T>(in, n, nbytes, &hi);
  if (hs != kDecOk) return hs;
  const uint64_t esc_total = hi.esc_bytes;
  // 6: block table (sequential, nb records): each record consistent, the streams
  // back to back from 0, their bytes and counts summing to the header's.
  const uint64_t nb = num_blocks(n);
  uint64_t run = 0, escapes = 0;
  for (uint64_t b = 0; b < nb; ++b) {
    const Record r = load_record(in + L.table_off + b * kRecordBytes);
    const uint32_t len = (uint32_t)std::min<uint64_t>(kBlock, n - b * kBlock);
    if (!window_valid<T>(r.base, r.mode) || !record_codes_ok(r, len) || r.esc_offset != run) return kDecBadTable;
    run += stream_bytes(r.esc_count, r.width);
    escapes += r.esc_count;
  }
  if (run != esc_total || escapes != hi.esc_count) return kDecBadTable;
  // 7: blocks (parallel); every stream read is within [0, esc_total), inside [0, used).
  const int nt = num_threads_for(n);
  const uint32_t P = T::kPlanes;
  std::atomic<bool> bad{false};
  std::vector<uint64_t> t_cs(nt, 0);
  parallel_for(nt, [&](int t) {
    const uint64_t b0 = nb * t / nt, b1 = nb * (t + 1) / nt;
    uint64_t acc = 0;
    for (uint64_t b = b0; b < b1; ++b) {
      const uint64_t i0 = b * kBlock;
      const uint32_t len = (uint32_t)std::min<uint64_t>(kBlock, n - i0);
      const Record r = load_record(in + L.table_off + b * kRecordBytes);
      const uint8_t* raw = in + L.raw_off + i0 * T::kRawBytes;
      const uint8_t* planes = in + L.plane_off + b * P * kPlaneBytes;
      if (!decode_block<T>(raw, planes, in + L.esc_off + r.esc_offset, r, len, y + i0)) {
        bad.store(true, std::memory_order_relaxed);
        return;
      }
      const uint64_t raw_pos = L.raw_off + i0 * T::kRawBytes;
      const uint64_t raw_len = (b + 1 == nb) ? L.plane_off - raw_pos : (uint64_t)kBlock * T::kRawBytes;
      acc += cs_bytes(raw, raw_pos, raw_len);
      acc += cs_bytes(planes, L.plane_off + b * P * kPlaneBytes, plane_span(L, P, b, nb));
    }
    t_cs[t] = acc;
  });
  if (bad.load()) return kDecBadEscapes;
  // 8: checksum over [0, used) (header with its checksum field as zero).
  uint64_t cs = 0;
  for (int t = 0; t < nt; ++t) cs += t_cs[t];
  cs += cs_span(in, 0, kOffChecksum);
  cs += cs_span(in + kOffChecksum + 8, kOffChecksum + 8, L.raw_off - kOffChecksum - 8);
  cs += cs_span(in + L.esc_off, L.esc_off, hi.used - L.esc_off);
  if (cs != load_u64(in + kOffChecksum)) return kDecBadChecksum;
  // 9: the padding of the table, raw, plane and escape sections (< 128 bytes each).
  if (!all_zero(in, L.table_off + nb * kRecordBytes, L.raw_off) ||
      !all_zero(in, L.raw_off + n * T::kRawBytes, L.plane_off) ||
      !all_zero(in, L.plane_off + plane_section_bytes(d, n), L.esc_off) ||
      !all_zero(in, L.esc_off + esc_total, hi.used))
    return kDecBadPadding;
  return kDecOk;
}

// On any error the row is filled with all-one bits (a NaN of every dtype): the
// output is deterministic, never partly decoded or uninitialised.
template <typename T>
int32_t decode_row_t(const uint8_t* in, uint64_t nbytes, uint64_t n, typename T::bits_t* y) {
  const int32_t s = decode_row_checked<T>(in, nbytes, n, y);
  if (s != kDecOk) std::memset(y, 0xFF, n * sizeof(typename T::bits_t));
  return s;
}
}  // namespace
}  // namespace cpu
}  // namespace zipccl
