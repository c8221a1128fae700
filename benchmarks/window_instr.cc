// Instruction counts and thread CPU time of the window codec's CPU row encoder and
// decoder (ffi/codec_cpu.cc) without Python or XLA: one row of n elements, encoded
// and decoded through encode_row / decode_row with the FFI encoder's escape capacity
// (max_escape_capacity). Built and run by benchmarks/window_speed.py (callgrind
// --toggle-collect on encode_row / decode_row gives instructions per element).
// Usage: window_instr [n = 2^20] [reps = 1] [dtype 1 bf16 / 2 fp16] [data: gauss
// (default, sigma 0.02) / laplace (scale 0.02, ~5% escapes) / relu = max(gauss, 0),
// the zero mode]; prints used_nbytes, a hash of the payload's bytes (equal hashes =
// identical encodings across builds and ISA paths), the round-trip status and the
// best-of-reps GB/s in thread CPU time.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "codec_cpu.h"

using namespace zipccl;

static double cpu_s() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char** argv) {
  const uint64_t n = argc > 1 ? strtoull(argv[1], 0, 0) : (1u << 20);
  const int reps = argc > 2 ? std::max(1, atoi(argv[2])) : 1;
  const DtypeCode d = (argc > 3 && atoi(argv[3]) == 2) ? kF16 : kBF16;
  const char* data = argc > 4 ? argv[4] : "gauss";
  std::mt19937_64 g(1);
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::exponential_distribution<float> ed(50.f);  // Laplace scale 0.02 = sign * Exp(1/0.02)
  std::vector<uint16_t> x(n), y(n);
  for (uint64_t i = 0; i < n; ++i) {
    float f;
    if (strcmp(data, "laplace") == 0) {
      f = ed(g);
      if (g() & 1) f = -f;
    } else {
      f = nd(g);
      if (strcmp(data, "relu") == 0 && f < 0) f = 0;
    }
    uint32_t u;
    memcpy(&u, &f, 4);
    if (d == kBF16) {
      x[i] = (uint16_t)(u >> 16);  // truncation: any bf16 pattern will do
    } else {
      _Float16 h = (_Float16)f;
      memcpy(&x[i], &h, 2);
    }
  }
  const uint64_t cap = max_escape_capacity(d, n);
  std::vector<uint8_t> out(max_nbytes(d, n));
  cpu::RowStats s{};
  double te = 1e9, td = 1e9;
  for (int r = 0; r < reps; ++r) {
    const double t0 = cpu_s();
    s = cpu::encode_row(d, x.data(), n, cap, out.data());
    te = std::min(te, cpu_s() - t0);
  }
  int st = 0;
  for (int r = 0; r < reps; ++r) {
    const double t0 = cpu_s();
    st = cpu::decode_row(d, out.data(), s.used_nbytes, n, y.data());
    td = std::min(td, cpu_s() - t0);
  }
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the used bytes
  for (uint64_t i = 0; i < s.used_nbytes; ++i) h = (h ^ out[i]) * 1099511628211ull;
  printf("n=%llu used=%llu escapes=%llu enc_status=%d status=%d match=%d hash=%016llx "
         "enc %.3f GB/s dec %.3f GB/s (min thread cpu)\n",
         (unsigned long long)n, (unsigned long long)s.used_nbytes, (unsigned long long)s.escape_count,
         (int)s.status, st, (int)(memcmp(x.data(), y.data(), 2 * n) == 0), (unsigned long long)h,
         2e-9 * n / te, 2e-9 * n / td);
  return 0;
}
