// Instruction counts and thread CPU time of the entropy row codec without Python or
// XLA: one Gaussian bf16 (or fp16) row, encoded and decoded through the host-buffer
// entry points. Built and run by benchmarks/entropy_instr.sh (callgrind
// --toggle-collect on encode_row / decode_row gives instructions per element).
// Usage: entropy_instr [n = 2^21] [reps = 1] [dtype 1 bf16 / 2 fp16] [data: gauss
// (default) / relu = max(gauss, 0), about half the elements +0 / skew = |gauss|
// with every 10th element negated: sign-skewed, HUFF-J blocks]; prints the
// payload size, a hash of its bytes (equal hashes = identical encodings across
// builds and ISA paths), round-trip status and the best-of-reps GB/s.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include <time.h>
#include "entropy_cpu.h"
using namespace zipccl::ent;
static double cpu_s() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char** argv) {
  uint64_t n = argc > 1 ? strtoull(argv[1], 0, 0) : (1u << 21);
  int reps = argc > 2 ? atoi(argv[2]) : 1;
  int dt = argc > 3 ? atoi(argv[3]) : 1;
  const bool relu = argc > 4 && strcmp(argv[4], "relu") == 0;
  const bool skew = argc > 4 && strcmp(argv[4], "skew") == 0;  // every 10th element negative: HUFF-J blocks
  DtypeCode d = (DtypeCode)dt;
  std::mt19937_64 g(1);
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::vector<uint16_t> x(n), y(n);
  for (uint64_t i = 0; i < n; ++i) {
    float f = nd(g);
    if (relu && f < 0) f = 0;
    if (skew) f = i % 10 == 0 ? -std::fabs(f) : std::fabs(f);
    uint32_t u; memcpy(&u, &f, 4);
    if (d == kBF16) x[i] = (uint16_t)(u >> 16);
    else { _Float16 h = (_Float16)f; memcpy(&x[i], &h, 2); }
  }
  std::vector<uint8_t> out(max_nbytes(d, n));
  cpu::RowStats s{};
  double te = 1e9, td = 1e9;
  for (int r = 0; r < reps; ++r) { double t0 = cpu_s(); s = cpu::encode_row(d, x.data(), n, out.data()); te = std::min(te, cpu_s() - t0); }
  int st = 0;
  for (int r = 0; r < reps; ++r) { double t0 = cpu_s(); st = cpu::decode_row(d, out.data(), s.used, n, y.data()); td = std::min(td, cpu_s() - t0); }
  uint64_t h = 1469598103934665603ull;
  for (uint64_t i = 0; i < s.used; ++i) h = (h ^ out[i]) * 1099511628211ull;
  printf("n=%llu used=%llu ratio=%.4f status=%d match=%d hash=%016llx enc %.3f GB/s dec %.3f GB/s (min thread cpu)\n",
         (unsigned long long)n, (unsigned long long)s.used, 2.0 * n / s.used, st, (int)(memcmp(x.data(), y.data(), 2 * n) == 0),
         (unsigned long long)h, 2e-9 * n / te, 2e-9 * n / td);
}
