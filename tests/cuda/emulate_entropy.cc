// The CUDA entropy codec (cuda/entropy.cu) run on the CPU: its kernels, launch code
// and FFI handler functions, compiled unchanged for the SIMT emulator of
// simt_host.h (fibers for threads, strict barriers and warp ops, several CTAs at
// once, garbage-filled shared memory). Every payload byte, encoder stat, decoded
// word and decoder status is compared with the CPU codec (ffi/entropy_cpu.cc),
// including prefix-decoding (buffers cut to used_nbytes, garbage past it) and
// corrupted payloads. Device buffers are page-guarded (an access past a buffer's
// end faults) and start as garbage.
//
// Build and run (tests/test_entropy_cuda.py does this), INC = jax.ffi.include_dir(),
// SIMT = the folder of simt_host.h:
//   g++ -O2 -std=c++17 -U_FORTIFY_SOURCE -Iffi -Icuda -I$SIMT -isystem $INC
//       tests/cuda/emulate_entropy.cc ffi/entropy_cpu.cc -lpthread
//   ./a.out [--quick] [--stop]
#undef _FORTIFY_SOURCE
#define ZIPCCL_SIMT_HOST 1
#include "entropy.cu"  // includes simt_host.h in this mode

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

#include "entropy_cpu.h"
#include "entropy_format.h"
#include "emulate_common.h"

using namespace zipccl::ent;
namespace ffi = ::xla::ffi;

namespace {

using zipccl_emulate::DevBuf;
using zipccl_emulate::FfiBuf;
using zipccl_emulate::kGarbage;

XLA_FFI_DataType ffi_dtype(DtypeCode d) { return d == kBF16 ? XLA_FFI_DataType_BF16 : XLA_FFI_DataType_F16; }

cudaStream_t kStream = nullptr;
int failures = 0, cases = 0;
bool stop_early = false;
int status_seen[9] = {0};
int modes_seen[16] = {0};  // block mode bytes of the encoded rows compared (kind Z: 9 CONST-Z, 10 HUFF-Z)
int f16_modes_seen[16] = {0};  // the same, fp16 rows only (format v4 changed fp16's symbols)

void machine(std::mt19937_64& rng) {
  simt::config().resident = 1 + (unsigned)(rng() % 4);
  simt::config().seed = rng();
}

bool gpu_encode(DtypeCode d, const uint16_t* x, uint64_t rows, uint64_t n, uint8_t* out, int32_t* stats,
                std::mt19937_64& rng, zipccl_emulate::SkipFill sf = {}) {
  return zipccl_emulate::call_encode(gpu::EntropyEncodeCudaImpl, [&] { machine(rng); }, ffi_dtype(d), x, 2, {0, 2},
                                     rows, n, max_nbytes(d, n), workspace_nbytes(n), out, stats, sf);
}

bool gpu_decode(DtypeCode d, const uint8_t* in, uint64_t rows, uint64_t L, uint64_t n, uint16_t* y, int32_t* status,
                std::mt19937_64& rng, zipccl_emulate::SkipFill sf = {}) {
  return zipccl_emulate::call_decode(gpu::EntropyDecodeCudaImpl, [&] { machine(rng); }, ffi_dtype(d), in, {0, 1}, rows,
                                     L, n, 2, {0, 2}, workspace_nbytes(n), y, status, sf);
}

// ---- test data ---------------------------------------------------------------------------

// Truncating conversion of a double to bf16 / fp16 bits (subnormals flush to zero).
uint16_t to_bits(DtypeCode d, double v) {
  const int eb = d == kBF16 ? 8 : 5, mb = d == kBF16 ? 7 : 10, bias = (1 << (eb - 1)) - 1, emax = (1 << eb) - 1;
  const uint32_t s = std::signbit(v) ? 1 : 0;
  v = std::fabs(v);
  if (v == 0 || !std::isfinite(v)) return (uint16_t)((s << 15) | (v == 0 ? 0 : (uint32_t)emax << mb));
  int e2;
  const double f = std::frexp(v, &e2);  // v = f 2^e2, f in [0.5, 1)
  int e = e2 - 1 + bias;
  if (e <= 0) return (uint16_t)(s << 15);
  if (e >= emax) return (uint16_t)((s << 15) | ((uint32_t)emax << mb));
  const uint32_t m = (uint32_t)((2 * f - 1) * (1 << mb)) & ((1u << mb) - 1);
  return (uint16_t)((s << 15) | ((uint32_t)e << mb) | m);
}

std::vector<uint16_t> gen(DtypeCode d, const std::string& kind, uint64_t n, std::mt19937_64& rng) {
  std::vector<uint16_t> v(n);
  std::normal_distribution<double> gauss(0.0, 1.0);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  const uint32_t mb = d == kBF16 ? 7 : 10, emax = d == kBF16 ? 0xFF : 0x1F;
  double scale = 1.0;
  for (uint64_t i = 0; i < n; ++i) {
    if (kind == "mixscale" && i % 1024 == 0) scale = std::exp2(-20 * uni(rng));
    double x;
    if (kind == "gauss") {
      x = gauss(rng);
    } else if (kind == "laplace") {
      x = (uni(rng) < 0.5 ? -1 : 1) * -std::log(1 - uni(rng)) * 1e-3;
    } else if (kind == "heavy") {  // Student t with 3 degrees of freedom
      const double z = gauss(rng), c = gauss(rng) * gauss(rng) + gauss(rng) * gauss(rng) + gauss(rng) * gauss(rng);
      x = z / std::sqrt(c / 3 + 1e-300);
    } else if (kind == "gelu") {
      const double g = gauss(rng);
      x = 0.5 * g * (1 + std::tanh(0.7978845608 * (g + 0.044715 * g * g * g)));
    } else if (kind == "softmax") {
      x = std::exp(2 * gauss(rng)) / 1024.0;
    } else if (kind == "relu") {
      x = std::max(0.0, gauss(rng));
    } else if (kind == "mixscale") {
      x = gauss(rng) * scale;
    } else if (kind == "zeros") {
      x = 0;
    } else if (kind == "negzeros") {  // every element -0: CONST-Z with symbol 1
      x = -0.0;
    } else if (kind == "pmzeros") {  // +0 and -0 at random: HUFF-Z without raw values
      x = (rng() & 1) ? -0.0 : 0.0;
    } else if (kind == "relu_pm") {  // half +-0 (balanced signs: the z rule, not the imbalance)
      x = uni(rng) < 0.5 ? ((rng() & 1) ? -0.0 : 0.0) : gauss(rng);
    } else if (kind == "sparse") {  // 95% +0
      x = uni(rng) < 0.95 ? 0.0 : gauss(rng);
    } else if (kind == "fewzeros") {  // ~1/16 +-0: around the 16 z >= len threshold
      x = uni(rng) < 1.0 / 16 ? ((rng() & 1) ? -0.0 : 0.0) : gauss(rng);
    } else if (kind == "blockmix") {  // blocks of +0, ReLU, Gaussian, -0, ReLU with a subnormal
      const uint64_t c = (i / kBlock) % 5;
      if (c == 4 && i % kBlock == 77) {
        v[i] = 1;  // the smallest subnormal: this block is not Z-valid
        continue;
      }
      x = c == 0 ? 0.0 : c == 1 ? std::max(0.0, gauss(rng)) : c == 2 ? gauss(rng) : c == 3 ? -0.0
          : std::max(0.0, gauss(rng));
    } else if (kind == "zerosub") {  // ReLU with a subnormal per ~1000 elements: never Z-valid
      if (uni(rng) < 0.001) {
        v[i] = (uint16_t)(1 + rng() % ((1u << mb) - 1));
        continue;
      }
      x = std::max(0.0, gauss(rng));
    } else if (kind == "zerosub9") {  // ReLU, ~1/500 subnormals with m9 = 1 (format v4 fp16:
      // coded exponent 1, so the elements with coded exponent 0 are exactly the zeros, yet
      // the block is not Z-valid)
      if (uni(rng) < 0.002) {
        v[i] = (uint16_t)((1u << (mb - 1)) | (rng() % (1u << (mb - 1))));
        continue;
      }
      x = std::max(0.0, gauss(rng));
    } else if (kind == "binade") {  // +-[1, 2): one exponent, the top mantissa bit uniform
      x = (rng() & 1 ? -1 : 1) * (1 + uni(rng));
    } else if (kind == "halfbinade") {  // +-[1, 1.5): one exponent and top mantissa bit 0
      x = (rng() & 1 ? -1 : 1) * (1 + 0.5 * uni(rng));
    } else if (kind == "topbit") {  // [1.5, 2): one exponent, top mantissa bit 1, positive
      x = 1.5 + 0.5 * uni(rng);
    } else if (kind == "constant") {
      x = -3.25;
    } else if (kind == "bits") {
      v[i] = (uint16_t)rng();
      continue;
    } else if (kind == "subnormal") {
      v[i] = (uint16_t)((rng() & ((1u << mb) - 1)) | ((rng() & 1) << 15));
      continue;
    } else {  // "specials": +-0, +-inf, NaNs with payloads, subnormals among Gaussians
      const int c = (int)(rng() % 8);
      const uint32_t s = (uint32_t)(rng() & 1) << 15;
      if (c == 0) v[i] = (uint16_t)s;
      else if (c == 1) v[i] = (uint16_t)(s | (emax << mb));
      else if (c == 2) v[i] = (uint16_t)(s | (emax << mb) | (1 + rng() % ((1u << mb) - 1)));
      else if (c == 3) v[i] = (uint16_t)(s | (1 + rng() % ((1u << mb) - 1)));
      else v[i] = to_bits(d, gauss(rng));
      continue;
    }
    v[i] = to_bits(d, x);
  }
  return v;
}

// COMMON.md's checksum over [0, used) with bytes 24..31 read as zero.
uint64_t checksum(const uint8_t* p, uint64_t used) {
  uint64_t cs = 0;
  for (uint64_t j = 0; j < used / 4; ++j)
    if (j != 6 && j != 7) cs += (uint64_t)ld32(p + 4 * j) * (2 * j + 1);
  return cs;
}

// Decodes one row (L bytes) on both sides: same status, and the same words.
bool same_decode(DtypeCode d, const char* what, const char* name, const std::vector<uint8_t>& row, uint64_t L,
                 uint64_t n, std::mt19937_64& rng) {
  std::vector<uint16_t> yc(n), ye(n);
  int32_t se = -1;
  const int32_t sc = cpu::decode_row(d, row.data(), L, n, yc.data());
  if (!gpu_decode(d, row.data(), 1, L, n, ye.data(), &se, rng)) {
    printf("FAIL %s %s: handler error\n", what, name);
    ++failures;
    return false;
  }
  if (sc >= 0 && sc <= 8) ++status_seen[sc];
  if (sc != se || memcmp(yc.data(), ye.data(), 2 * n) != 0) {
    uint64_t i = 0;
    while (i < n && yc[i] == ye[i]) ++i;
    printf("FAIL %s %s L=%llu: cpu status %d, emulated GPU status %d", what, name, (unsigned long long)L, sc, se);
    if (i < n) printf("; first differing word %llu: cpu %04x gpu %04x", (unsigned long long)i, yc[i], ye[i]);
    printf("\n");
    ++failures;
    return false;
  }
  return true;
}

// Crafted block-level corruptions with a re-sealed checksum (kind Z's checks): block
// 0's mode byte set to each mode (RAW with kind bits, CONST/HUFF of kinds E, J, Z,
// kind 3), a CONST symbol of 0..2, and the last block one byte longer or shorter
// (its directory entry and data_bytes moved together: a HUFF-Z block then holds one
// raw byte too many or too few).
bool crafted_blocks(DtypeCode d, const char* name, const std::vector<uint8_t>& row, uint64_t used, uint64_t n,
                    std::mt19937_64& rng) {
  const uint64_t nb = num_blocks(n), doff = data_offset(n);
  if (nb == 0) return true;
  auto sealed = [&](std::vector<uint8_t> bad, const char* what) {
    st64(bad.data() + kOffChecksum, checksum(bad.data(), used));
    return same_decode(d, what, name, bad, used, n, rng);
  };
  for (uint32_t mode : {0u, 1u, 2u, 4u, 5u, 6u, 8u, 9u, 10u, 13u, 14u}) {
    std::vector<uint8_t> bad(row.begin(), row.begin() + (ptrdiff_t)used);
    if (bad[doff] == mode) continue;
    bad[doff] = (uint8_t)mode;
    if (!sealed(bad, "crafted mode")) return false;
  }
  if ((row[doff] & 3) == kConst)
    for (uint32_t sym = 0; sym < 3; ++sym) {
      std::vector<uint8_t> bad(row.begin(), row.begin() + (ptrdiff_t)used);
      st16(bad.data() + doff + 2, sym);
      if (!sealed(bad, "crafted const symbol")) return false;
    }
  const uint64_t data = ld64(row.data() + kOffDataBytes), dir = kHeaderBytes + 2 * (nb - 1);
  for (int delta : {1, -1}) {
    std::vector<uint8_t> bad(row.begin(), row.begin() + (ptrdiff_t)used);
    const uint32_t sz = ld16(bad.data() + dir);
    if (align128(doff + data + delta) != used || sz + delta < 4) continue;
    st16(bad.data() + dir, sz + delta);
    st64(bad.data() + kOffDataBytes, data + delta);
    if (!sealed(bad, delta > 0 ? "crafted last block +1" : "crafted last block -1")) return false;
  }
  return true;
}

void check_case(DtypeCode d, const std::string& kind, uint64_t rows, uint64_t n, int corrupt, std::mt19937_64& rng) {
  if (stop_early && failures) return;
  ++cases;
  const uint64_t nbytes = max_nbytes(d, n);
  const std::vector<uint16_t> x = gen(d, kind, rows * n, rng);
  std::vector<uint8_t> ref(rows * nbytes, 0x5A), emu(rows * nbytes, kGarbage);
  std::vector<int32_t> est(4 * rows, -7);
  std::vector<cpu::RowStats> rst(rows);
  for (uint64_t r = 0; r < rows; ++r) {
    const uint8_t* row = ref.data() + r * nbytes;
    rst[r] = cpu::encode_row(d, x.data() + r * n, n, ref.data() + r * nbytes);
    uint64_t off = data_offset(n);
    for (uint64_t b = 0; b < num_blocks(n); ++b) {
      ++modes_seen[row[off] & 15];
      if (d == kF16) ++f16_modes_seen[row[off] & 15];
      off += ld16(row + kHeaderBytes + 2 * b);
    }
  }
  char name[160];
  snprintf(name, sizeof name, "dtype=%d kind=%s rows=%llu n=%llu", (int)d, kind.c_str(), (unsigned long long)rows,
           (unsigned long long)n);
  if (!gpu_encode(d, x.data(), rows, n, emu.data(), est.data(), rng)) {
    printf("FAIL encode %s: handler error\n", name);
    ++failures;
    return;
  }
  for (uint64_t i = 0; i < rows * nbytes; ++i)
    if (ref[i] != emu[i]) {
      printf("FAIL encode bytes %s: first mismatch at row %llu byte %llu: cpu %02x emulated GPU %02x\n", name,
             (unsigned long long)(i / nbytes), (unsigned long long)(i % nbytes), ref[i], emu[i]);
      ++failures;
      return;
    }
  for (uint64_t r = 0; r < rows; ++r) {
    const int32_t want[4] = {rst[r].status, (int32_t)rst[r].raw_blocks, (int32_t)(rst[r].used / 128), 0};
    if (memcmp(want, &est[4 * r], sizeof want) != 0) {
      printf("FAIL encode stats %s row %llu: cpu (%d %d %d %d) emulated GPU (%d %d %d %d)\n", name,
             (unsigned long long)r, want[0], want[1], want[2], want[3], est[4 * r], est[4 * r + 1], est[4 * r + 2],
             est[4 * r + 3]);
      ++failures;
      return;
    }
  }
  // Decode all rows (full rows), check statuses 0 and the exact words.
  std::vector<uint16_t> y(rows * n, 0x7777);
  std::vector<int32_t> st(rows, -1);
  if (!gpu_decode(d, emu.data(), rows, nbytes, n, y.data(), st.data(), rng)) {
    printf("FAIL decode %s: handler error\n", name);
    ++failures;
    return;
  }
  for (uint64_t r = 0; r < rows; ++r) {
    if (st[r] != 0) {
      printf("FAIL decode %s row %llu: status %d\n", name, (unsigned long long)r, st[r]);
      ++failures;
      return;
    }
  }
  for (uint64_t i = 0; i < rows * n; ++i)
    if (y[i] != x[i]) {
      printf("FAIL decode values %s: word %llu: %04x != %04x\n", name, (unsigned long long)i, y[i], x[i]);
      ++failures;
      return;
    }
  if (rows != 1) {  // skipped rows (cuda/device_util.h)
    ++cases;
    auto enc = [&](const uint8_t* skip, uint8_t* out, int32_t* st) {
      return gpu_encode(d, x.data(), rows, n, out, st, rng, {skip, nullptr, 0});
    };
    auto dec = [&](const uint8_t* in, zipccl_emulate::SkipFill sf, uint8_t* yb, int32_t* st) {
      return gpu_decode(d, in, rows, nbytes, n, reinterpret_cast<uint16_t*>(yb), st, rng, sf);
    };
    std::vector<int32_t> ref_stats(4 * rows);
    for (uint64_t r = 0; r < rows; ++r) {
      const int32_t w[4] = {rst[r].status, (int32_t)rst[r].raw_blocks, (int32_t)(rst[r].used / 128), 0};
      memcpy(&ref_stats[4 * r], w, sizeof w);
    }
    if (!zipccl_emulate::check_skipped_rows(name, enc, dec, x.data(), 2, rows, n, nbytes, ref.data(),
                                            ref_stats.data(), rng))
      ++failures;
    return;
  }
  // Prefix decoding: the row cut to used_nbytes, and a longer buffer with garbage past used.
  std::vector<uint8_t> row(ref.begin(), ref.begin() + (ptrdiff_t)nbytes);
  const uint64_t used = rst[0].used;
  {
    std::vector<uint8_t> cut(row.begin(), row.begin() + (ptrdiff_t)used);
    if (!same_decode(d, "prefix", name, cut, used, n, rng)) return;
    std::vector<uint8_t> longer = cut;
    for (int i = 0; i < 200; ++i) longer.push_back((uint8_t)rng());
    if (!same_decode(d, "garbage past used", name, longer, longer.size(), n, rng)) return;
    if (used >= 256) {
      std::vector<uint8_t> shorter(row.begin(), row.begin() + (ptrdiff_t)(used - 128));
      if (!same_decode(d, "short buffer", name, shorter, shorter.size(), n, rng)) return;
    }
    std::vector<uint8_t> tiny(row.begin(), row.begin() + 64);
    if (!same_decode(d, "64-byte buffer", name, tiny, 64, n, rng)) return;
    if (!same_decode(d, "empty buffer", name, std::vector<uint8_t>(), 0, n, rng)) return;
  }
  if (corrupt == 0) return;
  // Random bit flips per section (header, directory, blocks), raw or with the
  // checksum re-sealed (so that block-level statuses 6 and 7 show, not only 8).
  const uint64_t doff = data_offset(n);
  struct Region {
    uint64_t lo, hi;
  };
  const Region regions[] = {{0, 56}, {56, 128}, {128, doff}, {doff, used}, {doff, std::min<uint64_t>(used, doff + 64)}};
  for (const Region& rg : regions) {
    if (rg.hi <= rg.lo) continue;
    for (int it = 0; it < corrupt; ++it) {
      std::vector<uint8_t> bad(row.begin(), row.begin() + (ptrdiff_t)used);
      const int flips = 1 + (int)(rng() % 3);
      for (int f = 0; f < flips; ++f) bad[rg.lo + rng() % (rg.hi - rg.lo)] ^= (uint8_t)(1u << (rng() % 8));
      const bool reseal = rg.lo >= 128 && (it & 1);
      if (reseal) st64(bad.data() + kOffChecksum, checksum(bad.data(), used));
      char what[80];
      snprintf(what, sizeof what, "corrupt [%llu,%llu)%s", (unsigned long long)rg.lo, (unsigned long long)rg.hi,
               reseal ? " resealed" : "");
      if (!same_decode(d, what, name, bad, used, n, rng)) return;
    }
  }
  // Crafted header fields.
  for (int it = 0; it < 6; ++it) {
    std::vector<uint8_t> bad(row.begin(), row.begin() + (ptrdiff_t)used);
    switch (it) {
      case 0: bad[kOffStatus] = 1; break;                                 // NOT_DECODABLE
      case 1: bad[kOffDtype] = d == kBF16 ? 2 : 1; break;                 // BAD_DTYPE
      case 2: st64(bad.data() + kOffN, n + 1); break;                     // BAD_SIZE
      case 3: bad[kOffCodec] = 1; break;                                  // BAD_MAGIC
      case 4: st32(bad.data() + kOffRawBlocks, ld32(bad.data() + kOffRawBlocks) + 1); break;
      default: bad[100] = 1; break;                                       // BAD_HEADER
    }
    st64(bad.data() + kOffChecksum, checksum(bad.data(), used));
    if (!same_decode(d, "crafted header", name, bad, used, n, rng)) return;
  }
  crafted_blocks(d, name, row, used, n, rng);
}

// The handlers' own argument checks (an ffi::Error, no launch).
void check_handler_errors(DtypeCode d, std::mt19937_64& rng) {
  const uint64_t n = 100, nbytes = max_nbytes(d, n), W = workspace_nbytes(n);
  DevBuf dx(2 * n), dp(nbytes + 128), ds(16), dw(W + 128), dk(16), df(4 * n);
  struct Try {
    const char* what;
    XLA_FFI_DataType t;
    uint64_t nbytes, four, w, skips, fill_n;
  };
  const Try tries[] = {{"payload size", ffi_dtype(d), nbytes + 128, 4, W, 1, n},
                       {"stats shape", ffi_dtype(d), nbytes, 4 - 2, W, 1, n},
                       {"workspace size", ffi_dtype(d), nbytes, 4, W + 8, 1, n},
                       {"dtype", XLA_FFI_DataType_F32, nbytes, 4, W, 1, n},
                       {"skip count", ffi_dtype(d), nbytes, 4, W, 2, n},
                       {"fill length (decode)", ffi_dtype(d), nbytes, 4, W, 1, n + 1}};
  for (const Try& t : tries) {
    ++cases;
    FfiBuf fx(t.t, dx.data(), 1, n), fp(XLA_FFI_DataType_U8, dp.data(), 1, t.nbytes),
        fs(XLA_FFI_DataType_S32, ds.data(), 1, t.four), fw(XLA_FFI_DataType_U8, dw.data(), 1, t.w),
        fk(XLA_FFI_DataType_U8, dk.data(), t.skips, 1), ff(t.t, df.data(), 1, t.fill_n);
    machine(rng);
    const ffi::Error e = gpu::EntropyEncodeCudaImpl(kStream, ffi::AnyBuffer(&fx.b), ffi::Buffer<ffi::U8>(&fk.b),
                                                    ffi::Buffer<ffi::U8>(&fp.b), ffi::Buffer<ffi::S32>(&fs.b),
                                                    ffi::Buffer<ffi::U8>(&fw.b));
    if (!e.failure() && t.fill_n == n) {   // the encoder has no fill
      printf("FAIL encode handler accepted a bad %s\n", t.what);
      ++failures;
    }
    FfiBuf gy(t.t, dx.data(), 1, n), gp(XLA_FFI_DataType_U8, dp.data(), 1, nbytes),
        gw(XLA_FFI_DataType_U8, dw.data(), 1, t.w);
    int64_t sdim[1] = {t.four == 4 ? 1 : 2};
    XLA_FFI_Buffer gs{XLA_FFI_Buffer_STRUCT_SIZE, nullptr, XLA_FFI_DataType_S32, ds.data(), 1, sdim};
    if (t.nbytes != nbytes) continue;  // any payload length is valid for the decoder
    const ffi::Error e2 = gpu::EntropyDecodeCudaImpl(kStream, ffi::Buffer<ffi::U8>(&gp.b), ffi::Buffer<ffi::U8>(&fk.b),
                                                     ffi::AnyBuffer(&ff.b), ffi::AnyBuffer(&gy.b),
                                                     ffi::Buffer<ffi::S32>(&gs), ffi::Buffer<ffi::U8>(&gw.b));
    if (!e2.failure()) {
      printf("FAIL decode handler accepted a bad %s\n", t.what);
      ++failures;
    }
  }
}

void suite(DtypeCode d, std::mt19937_64& rng, bool big) {
  const char* kinds[] = {"gauss", "laplace", "heavy", "gelu", "softmax", "relu", "mixscale",
                         "zeros", "constant", "bits", "subnormal", "specials", "binade"};
  const uint64_t sizes[] = {0, 1, 7, 8, 513, 4095, 4096, 4097, 8192 + 1000};
  for (const char* k : kinds)
    for (uint64_t n : sizes) check_case(d, k, 1, n, n >= 1000 ? (big ? 4 : 2) : 1, rng);
  // Kind Z (zero elision): elements with exponent 0 and no subnormal in the block.
  const char* zkinds[] = {"negzeros", "pmzeros", "relu_pm", "sparse", "fewzeros", "zerosub", "zerosub9"};
  const uint64_t zsizes[] = {1, 9, 513, 4096, 8192 + 1000};
  for (const char* k : zkinds)
    for (uint64_t n : zsizes) check_case(d, k, 1, n, n >= 1000 ? (big ? 4 : 2) : 1, rng);
  check_case(d, "blockmix", 1, 5 * 4096 + 333, big ? 6 : 3, rng);
  check_case(d, "blockmix", 3, 2 * 4096 + 1, 0, rng);
  check_case(d, "relu", 2, 4097, 0, rng);
  for (uint64_t n : {(uint64_t)1, (uint64_t)4099, (uint64_t)3 * 4096 + 5})
    for (uint64_t rows : {2, 3}) check_case(d, "gauss", rows, n, 0, rng);
  check_case(d, "gelu", 3, 0, 0, rng);
  // One (coded) exponent per block: fp16 CONST blocks with the v4 raw widths (E: byte plane
  // + w 2, J: byte plane + w 1) and two-symbol HUFF blocks where v3 had CONST ones.
  for (const char* k : {"halfbinade", "topbit"})
    for (uint64_t n : {(uint64_t)9, (uint64_t)4096, (uint64_t)4096 + 513}) check_case(d, k, 1, n, n > 4096 ? 2 : 1, rng);
  check_handler_errors(d, rng);
  if (big) {
    check_case(d, "gauss", 1, (1u << 20) + 3, 0, rng);  // 257 blocks: long look-back chains
    check_case(d, "mixscale", 2, 70001, 3, rng);
  }
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive a crash of a broken kernel
  bool big = true;
  if (!zipccl_emulate::parse_args(argc, argv, &big, &stop_early)) return 2;
  for (uint64_t n : {0ull, 1ull, 4096ull, 4097ull, 1000000ull})
    printf("workspace_nbytes n=%llu W=%llu\n", (unsigned long long)n, (unsigned long long)workspace_nbytes(n));
  std::mt19937_64 rng(2026);
  suite(kBF16, rng, big);
  suite(kF16, rng, big);
  printf("decoder statuses compared on corrupted payloads:");
  for (int i = 0; i <= 8; ++i) printf(" %d:%d", i, status_seen[i]);
  printf("\nblock modes of the encoded rows:");
  for (int i = 0; i < 16; ++i)
    if (modes_seen[i]) printf(" %d:%d", i, modes_seen[i]);
  printf("\nfp16 rows' modes:");
  for (int i = 0; i < 16; ++i)
    if (f16_modes_seen[i]) printf(" %d:%d", i, f16_modes_seen[i]);
  printf("\n%d cases, %d failures\n", cases, failures);
  for (int i = 1; i <= 8; ++i)
    if (!status_seen[i]) {
      printf("FAIL: status %d never produced\n", i);
      ++failures;
    }
  return failures ? 1 : 0;
}
