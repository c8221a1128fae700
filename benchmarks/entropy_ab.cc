// A/B timing of the entropy row codec: a base revision's ffi/entropy_cpu.cc (built
// with its namespace renamed to zbase, see entropy_ab.sh) against this tree's, in
// one process, alternating rounds of `reps` encodes and decodes of the same 64 MiB
// Gaussian row (thread CPU time). On a machine whose speed drifts from minute to
// minute, the ratio of the two medians taken in the same minutes is steadier than
// two separate runs. Prints whether both encodings are identical, both round
// trips, and per build best / p75 / median / p25 / worst GB/s and the time ratios.
// Usage: entropy_ab n rounds reps [dtype 1 bf16 / 2 fp16] [fresh 0/1] (built and
// run by entropy_ab.sh). fresh = 1 times every call on a newly mapped output
// buffer, as XLA:CPU hands one to its FFI handlers (glibc mmaps allocations this
// large; 64 bytes past the mapping's start, huge pages advised on its 2 MiB-aligned
// interior like ffi/cpu_handler.h): the first-touch page faults are then part of
// the time, as through jax.jit. The build that runs second in a round tends to read a few %
// faster: A/A runs of one build gave median time ratios 0.93-1.03 (encode) and
// 0.96-0.97 (decode).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <time.h>
#include <sys/mman.h>
#include "entropy_cpu.h"
#include "entropy_base.h"
using namespace zipccl::ent;
static double now() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char** argv) {
  uint64_t n = argc > 1 ? strtoull(argv[1], 0, 0) : (1u << 25);
  int rounds = argc > 2 ? atoi(argv[2]) : 8, reps = argc > 3 ? atoi(argv[3]) : 3;
  DtypeCode d = (DtypeCode)(argc > 4 ? atoi(argv[4]) : 1);
  const bool fresh = argc > 5 && atoi(argv[5]) != 0;
  std::vector<uint16_t> x(n), y(n);
  uint64_t s = 88172645463325252ull;
  for (uint64_t i = 0; i < n; i += 2) {  // Box-Muller, sigma 0.02
    auto u = [&] { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return ((s >> 11) + 0.5) * (1.0 / 9007199254740992.0); };
    double r = std::sqrt(-2 * std::log(u())), th = 6.283185307179586 * u();
    float f[2] = {(float)(0.02 * r * std::cos(th)), (float)(0.02 * r * std::sin(th))};
    for (int k = 0; k < 2 && i + k < n; ++k) {
      uint32_t w; memcpy(&w, &f[k], 4);
      if (d == kBF16) x[i + k] = (uint16_t)(w >> 16);
      else { _Float16 h = (_Float16)f[k]; memcpy(&x[i + k], &h, 2); }
    }
  }
  uint64_t M = max_nbytes(d, n);
  std::vector<uint8_t> oa(M, 1), ob(M, 2);
  auto ra = zbase::ent::cpu::encode_row((zbase::ent::DtypeCode)d, x.data(), n, oa.data());
  auto rb = cpu::encode_row(d, x.data(), n, ob.data());
  bool same = ra.used == rb.used && memcmp(oa.data(), ob.data(), M) == 0;
  int da = zbase::ent::cpu::decode_row((zbase::ent::DtypeCode)d, oa.data(), M, n, y.data());
  bool oka = memcmp(x.data(), y.data(), 2 * n) == 0;
  int db = cpu::decode_row(d, ob.data(), M, n, y.data());
  bool okb = memcmp(x.data(), y.data(), 2 * n) == 0;
  printf("n=%llu identical=%d dec %d/%d roundtrip %d/%d output buffers %s\n", (unsigned long long)n, same, da, db, oka, okb,
         fresh ? "fresh (mmap per call)" : "reused");
  // A fresh output buffer of `bytes` (fresh = 1) or the given one.
  auto get = [&](uint8_t* reuse, uint64_t bytes, void** map, uint64_t* len) -> uint8_t* {
    if (!fresh) return reuse;
    *len = bytes + 4096;
    *map = mmap(nullptr, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (*map == MAP_FAILED) { perror("mmap"); exit(2); }
    uint8_t* p = static_cast<uint8_t*>(*map) + 64;
    const uint64_t huge = 2ull << 20, a = ((uint64_t)p + huge - 1) & ~(huge - 1), b = ((uint64_t)p + bytes) & ~(huge - 1);
    if (bytes >= 4 * huge && b > a) madvise((void*)a, b - a, MADV_HUGEPAGE);
    return p;
  };
  auto put = [&](void* map, uint64_t len) { if (fresh) munmap(map, len); };
  std::vector<double> ea, eb, dA, dB;
  for (int r = 0; r < rounds; ++r) {
    void* mp = nullptr;
    uint64_t ml = 0;
    for (int k = 0; k < reps; ++k) { uint8_t* o = get(oa.data(), M, &mp, &ml); double t = now(); zbase::ent::cpu::encode_row((zbase::ent::DtypeCode)d, x.data(), n, o); ea.push_back(now() - t); put(mp, ml); }
    for (int k = 0; k < reps; ++k) { uint8_t* o = get(ob.data(), M, &mp, &ml); double t = now(); cpu::encode_row(d, x.data(), n, o); eb.push_back(now() - t); put(mp, ml); }
    for (int k = 0; k < reps; ++k) { uint16_t* o = (uint16_t*)get((uint8_t*)y.data(), 2 * n, &mp, &ml); double t = now(); zbase::ent::cpu::decode_row((zbase::ent::DtypeCode)d, oa.data(), M, n, o); dA.push_back(now() - t); put(mp, ml); }
    for (int k = 0; k < reps; ++k) { uint16_t* o = (uint16_t*)get((uint8_t*)y.data(), 2 * n, &mp, &ml); double t = now(); cpu::decode_row(d, ob.data(), M, n, o); dB.push_back(now() - t); put(mp, ml); }
  }
  auto pr = [&](const char* nm, std::vector<double> a, std::vector<double> b) {
    std::sort(a.begin(), a.end()); std::sort(b.begin(), b.end());
    auto q = [](const std::vector<double>& v, double f) { return v[(size_t)(f * (v.size() - 1) + 0.5)]; };
    double g = 2e-9 * n;
    printf("%s GB/s base: best %.2f p75 %.2f med %.2f p25 %.2f worst %.2f | new: best %.2f p75 %.2f med %.2f p25 %.2f worst %.2f | time new/base med %.3f best %.3f\n", nm,
           g / a[0], g / q(a, .25), g / q(a, .5), g / q(a, .75), g / a.back(),
           g / b[0], g / q(b, .25), g / q(b, .5), g / q(b, .75), g / b.back(), q(b, .5) / q(a, .5), b[0] / a[0]);
  };
  pr("enc", ea, eb);
  pr("dec", dA, dB);
}
