// The CUDA codec (cuda/window.cu) run on the CPU: its kernels, launch code and FFI
// handler functions, compiled unchanged for the SIMT emulator of tests/cuda/simt_host.h
// (fibers for threads, adversarial cp.async, strict barriers and warp ops, several
// CTAs at once). Every payload byte, encoder stat, decoded word and decoder status
// is compared with the CPU codec (ffi/window_cpu.cc), including corrupted payloads.
// Device buffers are page-guarded (an access past a buffer's end faults) and start
// as garbage. What this cannot show is listed in tests/cuda/simt_host.h; the GPU itself
// is exercised by benchmarks/gpu_check.py.
//
// Build and run (tests/test_cuda_build.py does this), with INC = jax.ffi.include_dir():
//   g++ -O2 -std=c++17 -Iffi -Icuda -Itests/cuda -isystem $INC tests/cuda/emulate_window.cc ffi/window_cpu.cc -lpthread
//   ./a.out [--quick] [--stop]     (--stop: end at the first failure)
// simt_host.h switches fibers with _longjmp, which the fortified libc refuses
// between stacks; this must precede every #include.
#undef _FORTIFY_SOURCE
#define ZIPCCL_SIMT_HOST 1
#include "window.cu"  // after simt_host.h (included by window.cu in this mode)

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "window_cpu.h"
#include "window_format.h"
#include "emulate_common.h"

using namespace zipccl;
namespace ffi = ::xla::ffi;

namespace {

using zipccl_emulate::DevBuf;
using zipccl_emulate::FfiBuf;
using zipccl_emulate::kGarbage;

template <typename T>
XLA_FFI_DataType ffi_dtype() {
  return T::kCode == kBF16 ? XLA_FFI_DataType_BF16 : T::kCode == kF16 ? XLA_FFI_DataType_F16 : XLA_FFI_DataType_F32;
}

cudaStream_t kStream = nullptr;

int groups_used[5] = {0};  // calls per tile-kernel variant (8-element groups per thread)

// Sets the emulated machine for one handler call: CTAs resident at once, the
// schedule, and the tile kernels' variant (gpu::set_tile_groups, read by the
// handler; drawn per call, so payloads of one variant are decoded by another).
void machine(std::mt19937_64& rng) {
  simt::config().resident = 1 + (unsigned)(rng() % 4);
  simt::config().seed = rng();
  static const int kGroups[] = {1, 2, 4};
  const int g = kGroups[rng() % 3];
  gpu::set_tile_groups(g);
  ++groups_used[g];
}

// zipccl_zipccl_encode on the emulated GPU: rows x [rows, n] -> out [rows,
// max_nbytes], stats [rows, 4]. Returns false (after printing) if the handler
// returned an error.
template <typename T>
bool gpu_encode(const typename T::bits_t* x, uint64_t rows, uint64_t n, uint8_t* out, int32_t* stats,
                size_t x_shift, std::mt19937_64& rng, zipccl_emulate::SkipFill sf = {}) {
  return zipccl_emulate::call_encode(gpu::EncodeCudaImpl, [&] { machine(rng); }, ffi_dtype<T>(), x,
                                     sizeof(typename T::bits_t), {x_shift, 16}, rows, n, max_nbytes(T::kCode, n),
                                     workspace_nbytes(n), out, stats, sf);
}

// zipccl_zipccl_decode on the emulated GPU: payload rows of any length nbytes.
template <typename T>
bool gpu_decode(const uint8_t* in, uint64_t rows, uint64_t nbytes, uint64_t n, typename T::bits_t* y,
                int32_t* status, size_t y_shift, std::mt19937_64& rng, zipccl_emulate::SkipFill sf = {}) {
  return zipccl_emulate::call_decode(gpu::DecodeCudaImpl, [&] { machine(rng); }, ffi_dtype<T>(), in, {0, 16}, rows,
                                     nbytes, n, sizeof(typename T::bits_t), {y_shift, 16}, workspace_nbytes(n), y,
                                     status, sf);
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
    } else if (kind == "mixed") {  // gauss, with wide exponents in a row-dependent share
      e = center + (int)std::floor(std::log2(std::fabs(gauss(rng)) + 1e-30));
      if (rng() % 64 < (i / 1000) % 24) e = (int)(rng() % (uint64_t)(emax + 1));
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
bool stop_early = false;   // --stop: skip every case after the first failure
int status_seen[10] = {0};  // decoder statuses met in the corruption checks

// Decodes `bad` (one row of nbytes) on the CPU and the emulated GPU; the statuses
// and the values (all-one bits on an error) must agree.
template <typename T>
bool same_decode(const char* what, const char* name, const std::vector<uint8_t>& bad, uint64_t nbytes, uint64_t n,
                 std::mt19937_64& rng) {
  using B = typename T::bits_t;
  std::vector<B> yc(n), ye(n);
  int32_t se = -1;
  const int32_t sc = cpu::decode_row(T::kCode, bad.data(), nbytes, n, yc.data());
  if (!gpu_decode<T>(bad.data(), 1, nbytes, n, ye.data(), &se, 0, rng)) {
    printf("FAIL %s %s: handler error\n", what, name);
    ++failures;
    return false;
  }
  if (sc >= 0 && sc <= 9) ++status_seen[sc];
  if (sc != se || memcmp(yc.data(), ye.data(), n * sizeof(B)) != 0) {
    printf("FAIL %s %s: cpu status %d, emulated GPU status %d%s\n", what, name, sc, se,
           sc == se ? " (values differ)" : "");
    ++failures;
    return false;
  }
  return true;
}

// The row with its checksum recomputed over [0, used) (crafted defects the
// checksum would otherwise catch first).
std::vector<uint8_t> reseal(std::vector<uint8_t> b, uint64_t used) {
  const uint64_t cs = checksum_span(b.data(), 0, kOffChecksum / 4) +
                      checksum_span(b.data() + kOffChecksum + 8, (kOffChecksum + 8) / 4, (used - kOffChecksum - 8) / 4);
  store_u64(b.data() + kOffChecksum, cs);
  return b;
}

// Encode `rows` rows of `kind` data on both sides, compare bytes and stats, decode
// back (whole rows and a prefix), then decode corrupted copies. `corrupt`:
// corruption attempts per section.
template <typename T>
void check_case(const std::string& kind, uint64_t rows, uint64_t n, int corrupt, std::mt19937_64& rng) {
  using B = typename T::bits_t;
  if (stop_early && failures) return;
  ++cases;
  const uint64_t cap = max_escape_capacity(T::kCode, n);
  const uint64_t nbytes = max_nbytes(T::kCode, n);
  std::vector<B> x = gen<T>(kind, rows * n, rng);
  std::vector<uint8_t> ref(rows * nbytes, 0x5A), emu(rows * nbytes, kGarbage);
  std::vector<int32_t> emu_stats(4 * rows, -7), ref_stats(4 * rows);
  uint64_t used_max = 0;
  for (uint64_t r = 0; r < rows; ++r) {
    const cpu::RowStats rs = cpu::encode_row(T::kCode, x.data() + r * n, n, cap, ref.data() + r * nbytes);
    store_row_stats(ref_stats.data() + 4 * r, rs.status, rs.escape_count, rs.used_nbytes, nbytes);
    used_max = std::max(used_max, rs.used_nbytes);
  }
  const size_t shift = (rng() % 4 == 0) ? 2 * sizeof(B) : 0;  // sometimes a misaligned x / y
  char name[200];
  snprintf(name, sizeof name, "dtype=%d kind=%s rows=%llu n=%llu shift=%zu", (int)T::kCode, kind.c_str(),
           (unsigned long long)rows, (unsigned long long)n, shift);
  if (!gpu_encode<T>(x.data(), rows, n, emu.data(), emu_stats.data(), shift, rng)) {
    printf("FAIL encode %s: handler error\n", name);
    ++failures;
    return;
  }
  for (uint64_t i = 0; i < rows * nbytes; ++i) {
    if (ref[i] != emu[i]) {
      printf("FAIL encode bytes %s: first mismatch at row %llu byte %llu: cpu %02x emulated GPU %02x\n", name,
             (unsigned long long)(i / nbytes), (unsigned long long)(i % nbytes), ref[i], emu[i]);
      ++failures;
      return;
    }
  }
  for (uint64_t r = 0; r < rows; ++r) {
    const int32_t* w = ref_stats.data() + 4 * r;
    const int32_t* g = emu_stats.data() + 4 * r;
    if (memcmp(w, g, 16) != 0) {
      printf("FAIL encode stats %s row %llu: cpu (%d, %d, %d, %d), emulated GPU (%d, %d, %d, %d)\n", name,
             (unsigned long long)r, w[0], w[1], w[2], w[3], g[0], g[1], g[2], g[3]);
      ++failures;
      return;
    }
  }
  // Decode the (identical) payload, whole and cut to a prefix of L >= every used
  // size (a multiple of 16): statuses and values as on the CPU, the data exact where
  // the row fits (rows that do not fit report 4).
  const uint64_t span16 = (nbytes - std::min(used_max, nbytes)) / 16;
  const uint64_t cut = std::min(used_max, nbytes) + 16 * (span16 ? rng() % (span16 + 1) : 0);
  for (uint64_t L : {nbytes, cut}) {
    std::vector<uint8_t> in(rows * L);
    for (uint64_t r = 0; r < rows; ++r) memcpy(in.data() + r * L, ref.data() + r * nbytes, L);
    std::vector<B> y(rows * n, (B)0x7777);
    std::vector<int32_t> st(rows, -1);
    if (!gpu_decode<T>(in.data(), rows, L, n, y.data(), st.data(), shift, rng)) {
      printf("FAIL decode %s L=%llu: handler error\n", name, (unsigned long long)L);
      ++failures;
      return;
    }
    for (uint64_t r = 0; r < rows; ++r) {
      std::vector<B> yc(n);
      const int32_t want = cpu::decode_row(T::kCode, in.data() + r * L, L, n, yc.data());
      const bool fits = ref_stats[4 * r] == kEncOk;
      if (st[r] != want || want != (fits ? kDecOk : kDecNotDecodable)) {
        printf("FAIL decode status %s L=%llu row %llu: cpu %d emulated GPU %d\n", name, (unsigned long long)L,
               (unsigned long long)r, want, st[r]);
        ++failures;
        return;
      }
      if (memcmp(y.data() + r * n, fits ? x.data() + r * n : yc.data(), n * sizeof(B)) != 0) {
        printf("FAIL decode values %s L=%llu row %llu\n", name, (unsigned long long)L, (unsigned long long)r);
        ++failures;
        return;
      }
    }
  }
  // Skipped rows (cuda/device_util.h), where every row fits (so every coded row decodes exactly).
  bool all_fit = rows >= 2;
  for (uint64_t r = 0; r < rows; ++r) all_fit = all_fit && ref_stats[4 * r] == kEncOk;
  if (all_fit) {
    ++cases;
    auto enc = [&](const uint8_t* skip, uint8_t* out, int32_t* st) {
      return gpu_encode<T>(x.data(), rows, n, out, st, shift, rng, {skip, nullptr, 0});
    };
    auto dec = [&](const uint8_t* in, zipccl_emulate::SkipFill sf, uint8_t* y, int32_t* st) {
      return gpu_decode<T>(in, rows, nbytes, n, reinterpret_cast<B*>(y), st, shift, rng, sf);
    };
    if (!zipccl_emulate::check_skipped_rows(name, enc, dec, x.data(), sizeof(B), rows, n, nbytes, ref.data(),
                                            ref_stats.data(), rng)) {
      ++failures;
      return;
    }
  }
  if (rows != 1 || n == 0 || corrupt == 0) return;
  // Corruptions: flip bits in every section, compare statuses with the CPU.
  const tile::Geom g = tile::geom_of<T>(n, cap);
  const uint64_t used = (uint64_t)ref_stats[2] * kAlign <= nbytes ? (uint64_t)ref_stats[2] * kAlign : nbytes;
  const uint64_t esc_count = load_u64(ref.data() + kOffEscBytes);  // escape-section bytes (v4)
  struct Region {
    uint64_t lo, hi;
  };
  const Region regions[] = {{0, kHeaderUsed},
                            {kHeaderUsed, kHeaderBytes},
                            {g.table_off, g.table_off + 8 * (uint64_t)g.nb},
                            {g.table_off, g.raw_off},
                            {g.raw_off, g.plane_off},
                            {g.plane_off, g.esc_off},
                            {g.esc_off, g.esc_off + std::min<uint64_t>(g.cap, esc_count + 1)},
                            {g.esc_off, used},
                            {used, nbytes}};  // past used: never read (status 0 on both)
  for (const Region& rg : regions) {
    if (rg.hi <= rg.lo) continue;
    for (int it = 0; it < corrupt; ++it) {
      std::vector<uint8_t> bad = ref;
      const int flips = 1 + (int)(rng() % 3);
      for (int f = 0; f < flips; ++f) bad[rg.lo + rng() % (rg.hi - rg.lo)] ^= (uint8_t)(1u << (rng() % 8));
      char what[64];
      snprintf(what, sizeof what, "corrupt [%llu,%llu)", (unsigned long long)rg.lo, (unsigned long long)rg.hi);
      if (!same_decode<T>(what, name, bad, nbytes, n, rng)) return;
    }
  }
  if (ref_stats[0] != kEncOk) return;
  // Crafted defects with a re-sealed checksum (random flips almost never keep it
  // valid): statuses 6, 7 and 9, and a window shift the planes survive.
  for (int it = 0; it < 13 && g.nb > 0; ++it) {
    std::vector<uint8_t> bad = ref;
    const uint64_t b = rng() % g.nb;
    Record r = load_record(bad.data() + g.table_off + 8 * b);
    switch (it) {
      case 0: r.esc_count += 1; break;
      case 1: r.esc_offset += 1; break;
      case 2: r.mode = 2; break;
      case 3: r.base = T::kExpMax; break;
      case 4: r.base = r.base > 0 ? r.base - 1 : r.base + 1; break;
      case 5: bad[g.plane_off + b * T::kPlanes * kPlaneBytes + (rng() % (T::kPlanes * plane_bytes_of(block_len(n, b))))] ^= 0xFF; break;
      case 6: if (g.table_off + 8ull * g.nb < g.raw_off) bad[g.raw_off - 1] = 1; break;         // table padding
      case 7: if (g.raw_off + n * T::kRawBytes < g.plane_off) bad[g.plane_off - 1] = 0x80; break;  // raw padding
      case 8: if (g.esc_off + esc_count < used) bad[used - 1] = 2; break;                       // escape padding
      case 9: if (g.plane_end < g.esc_off) bad[g.esc_off - 1] = 4; break;                          // plane padding (v3)
      case 10: r.width = r.width == 8 ? 7 : r.width + 1; break;                                   // escape width (v4)
      case 11: r.split = (r.split + 1) & 0x7F; break;                                             // escape split (v4)
      default: if (esc_count) bad[g.esc_off + rng() % esc_count] = (uint8_t)(T::kExpMax + 1 + rng() % (255 - T::kExpMax + (T::kExpMax == 255))); break;
    }
    store_record(bad.data() + g.table_off + 8 * b, r);
    bad = reseal(bad, used);
    char what[64];
    snprintf(what, sizeof what, "crafted case %d", it);
    if (!same_decode<T>(what, name, bad, nbytes, n, rng)) return;
  }
  // Buffers too short for the row, down to none: the handler's header-only path.
  for (uint64_t nb2 : {(uint64_t)0, (uint64_t)64, used - 128}) {
    std::vector<uint8_t> short_row(ref.begin(), ref.begin() + (ptrdiff_t)nb2);
    if (!same_decode<T>("short buffer", name, short_row, nb2, n, rng)) return;
  }
}

// The handlers' own argument checks (an ffi::Error, no launch).
template <typename T>
void check_handler_errors(std::mt19937_64& rng) {
  using B = typename T::bits_t;
  const uint64_t n = 100, nbytes = max_nbytes(T::kCode, n), W = workspace_nbytes(n);
  DevBuf dx(n * sizeof(B)), dp(nbytes + 16), ds(16), dw(W + 16), dy(n * sizeof(B) + 16), dk(16),
      df(2 * n * sizeof(B));
  struct Try {
    const char* what;
    uint64_t nbytes, w, width, skips;
    size_t pshift;
  };
  const Try tries[] = {{"payload size", nbytes + 128, W, 4, 1, 0},
                       {"workspace size", nbytes, W + 8, 4, 1, 0},
                       {"stats width", nbytes, W, 2, 1, 0},
                       {"misaligned payload", nbytes, W, 4, 1, 8},
                       {"skip count", nbytes, W, 4, 3, 0}};
  for (const Try& t : tries) {
    ++cases;
    FfiBuf fx(ffi_dtype<T>(), dx.data(), 1, n), fp(XLA_FFI_DataType_U8, dp.data() + t.pshift, 1, t.nbytes),
        fs(XLA_FFI_DataType_S32, ds.data(), 1, t.width), fw(XLA_FFI_DataType_U8, dw.data(), 1, t.w),
        fk(XLA_FFI_DataType_U8, dk.data(), t.skips, 1);
    machine(rng);
    const ffi::Error e = gpu::EncodeCudaImpl(kStream, ffi::AnyBuffer(&fx.b), ffi::Buffer<ffi::U8>(&fk.b),
                                             ffi::Buffer<ffi::U8>(&fp.b), ffi::Buffer<ffi::S32>(&fs.b),
                                             ffi::Buffer<ffi::U8>(&fw.b));
    if (!e.failure()) {
      printf("FAIL handler accepted a bad %s\n", t.what);
      ++failures;
    }
  }
  // The decoder refuses a row length that is not a multiple of 16 (16-byte loads),
  // a fill whose rows do not divide the output's, and a skip mask of another size.
  struct DecTry {
    const char* what;
    uint64_t nbytes, fill_rows, skips;
  };
  const DecTry dtries[] = {{"a row length that is not a multiple of 16", nbytes - 8, 1, 1},
                           {"a fill of 2 rows for 1 output row", nbytes, 2, 1},
                           {"a skip mask of 2 rows for 1 output row", nbytes, 1, 2}};
  for (const DecTry& t : dtries) {
    ++cases;
    FfiBuf fp(XLA_FFI_DataType_U8, dp.data(), 1, t.nbytes), fy(ffi_dtype<T>(), dy.data(), 1, n),
        fw(XLA_FFI_DataType_U8, dw.data(), 1, W), fk(XLA_FFI_DataType_U8, dk.data(), t.skips, 1),
        ff(ffi_dtype<T>(), df.data(), t.fill_rows, n);
    int64_t sdim[1] = {1};
    XLA_FFI_Buffer fs{XLA_FFI_Buffer_STRUCT_SIZE, nullptr, XLA_FFI_DataType_S32, ds.data(), 1, sdim};
    const ffi::Error e = gpu::DecodeCudaImpl(kStream, ffi::Buffer<ffi::U8>(&fp.b), ffi::Buffer<ffi::U8>(&fk.b),
                                             ffi::AnyBuffer(&ff.b), ffi::AnyBuffer(&fy.b), ffi::Buffer<ffi::S32>(&fs),
                                             ffi::Buffer<ffi::U8>(&fw.b));
    if (!e.failure()) {
      printf("FAIL decode handler accepted %s\n", t.what);
      ++failures;
    }
  }
}

template <typename T>
void suite(std::mt19937_64& rng, bool big) {
  const char* kinds[] = {"gauss", "laplace", "zeros", "bits", "specials", "relu", "outlier", "wide"};
  const uint64_t sizes[] = {0, 1, 7, 8, 9, 255, 2047, 2048, 2049, 4097, 6145, 12345, 70001};
  for (const char* k : kinds)
    for (uint64_t n : sizes) check_case<T>(k, 1, n, n <= 6145 ? (big ? 6 : 2) : (big ? 2 : 0), rng);
  // Rows near the escape area's limit: some fit, some do not.
  for (uint64_t n : {300, 2049, 9000, 20001, 40000}) check_case<T>("mixed", 1, n, 1, rng);
  // several rows (odd n: misaligned rows in the kernels), incl. n = 0
  for (uint64_t n : {0, 1, 7, 2049, 5000})
    for (uint64_t rows : {2, 3, 5}) check_case<T>(rows == 3 ? "mixed" : "gauss", rows, n, 0, rng);
  check_case<T>("wide", 3, 3000, 0, rng);   // rows that do not fit, several at once
  check_case<T>("mixed", 5, 4000, 0, rng);  // fitting and non-fitting rows in one call
  check_case<T>("mixed", 2, 70001, 0, rng);  // 35 tiles per row, near the escape area's limit
  check_handler_errors<T>(rng);
  if (big) {
    check_case<T>("gauss", 1, (1u << 20) + 3, 0, rng);  // 513 tiles: many 32-tile look-back windows
    check_case<T>("outlier", 2, 300000, 0, rng);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool big = true;
  if (!zipccl_emulate::parse_args(argc, argv, &big, &stop_early)) return 2;
  std::mt19937_64 rng(12345);
  suite<BF16Traits>(rng, big);
  suite<F16Traits>(rng, big);
  suite<F32Traits>(rng, big);
  printf("decoder statuses compared on corrupted payloads:");
  for (int i = 0; i <= 9; ++i) printf(" %d:%d", i, status_seen[i]);
  printf("\nhandler calls per variant: G=1 %d, G=2 %d, G=4 %d", groups_used[1], groups_used[2], groups_used[4]);
  printf("\n%d cases, %d failures\n", cases, failures);
  for (int i = 1; i <= 9; ++i)
    if (!status_seen[i]) {
      printf("FAIL: status %d never produced\n", i);
      ++failures;
    }
  return failures ? 1 : 0;
}
