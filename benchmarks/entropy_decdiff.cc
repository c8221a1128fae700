// Differential corruption test of the entropy codec's CPU row decoder: a base
// revision's ffi/entropy_cpu.cc (namespace renamed to zbase, see entropy_decdiff.sh)
// against this tree's. Each row is encoded, then decoded many times after 1-4
// random bit flips in its blocks (directory and header left alone half of the
// time), with the checksum recomputed in half of the trials so that stream
// corruption that decodes to other symbols is compared word for word instead of
// stopping at BAD_CHECKSUM. The buffer is exactly used_nbytes long (a fresh
// allocation: out-of-bounds reads show under AddressSanitizer or valgrind). Both
// decoders must return the same status and the same words.
// Usage: entropy_decdiff TRIALS FILE... (FILE: little-endian u16 words; its name
// ends in .bf16 or .fp16). Exit status 1 on any difference.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>
#include "entropy_cpu.h"
#include "entropy_base.h"
using namespace zipccl::ent;
static uint64_t checksum(const uint8_t* p, uint64_t used) {
  uint64_t s = 0;
  for (uint64_t j = 0; j < used / 4; ++j) {
    uint32_t w;
    std::memcpy(&w, p + 4 * j, 4);
    if (j == 6 || j == 7) w = 0;
    s += (uint64_t)w * (2 * j + 1);
  }
  return s;
}
int main(int argc, char** argv) {
  const int trials = atoi(argv[1]);
  int bad = 0;
  uint64_t total = 0, hist[16] = {};
  std::mt19937_64 g(12345);
  for (int a = 2; a < argc; ++a) {
    const std::string path = argv[a];
    bool fp16;
    std::vector<uint16_t> x;
    if (!zbase::read_row(path, &fp16, &x)) { printf("cannot read %s\n", path.c_str()); return 2; }
    const DtypeCode d = fp16 ? kF16 : kBF16;
    const uint64_t n = x.size(), M = max_nbytes(d, n);
    std::vector<uint8_t> enc(M);
    const auto r = cpu::encode_row(d, x.data(), n, enc.data());
    const uint64_t used = r.used, nb = (n + 4095) / 4096;
    const uint64_t doff = 128 + (2 * nb + 127) / 128 * 128;
    std::vector<uint16_t> ya(n + 1), yb(n + 1);
    for (int t = 0; t < trials; ++t) {
      std::unique_ptr<uint8_t[]> buf(new uint8_t[used ? used : 1]);
      std::memcpy(buf.get(), enc.data(), used);
      const int flips = 1 + (int)(g() % 4);
      const uint64_t lo = (g() & 1) || used <= doff ? 0 : doff;
      for (int k = 0; k < flips && used > lo; ++k) {
        const uint64_t at = lo + g() % (used - lo);
        buf[at] ^= (uint8_t)(1u << (g() % 8));
      }
      if ((g() & 1) && used >= 32) {
        const uint64_t cs = checksum(buf.get(), used);
        std::memcpy(buf.get() + 24, &cs, 8);
      }
      const int da = zbase::ent::cpu::decode_row((zbase::ent::DtypeCode)d, buf.get(), used, n, ya.data());
      const int db = cpu::decode_row(d, buf.get(), used, n, yb.data());
      ++total;
      ++hist[db & 15];
      if (da != db || std::memcmp(ya.data(), yb.data(), 2 * n) != 0) {
        if (bad < 10) printf("%s trial %d: status base %d new %d, words %s\n", path.c_str(), t, da, db,
                             std::memcmp(ya.data(), yb.data(), 2 * n) ? "differ" : "equal");
        ++bad;
      }
    }
  }
  printf("%llu decodes, statuses:", (unsigned long long)total);
  for (int s = 0; s < 16; ++s)
    if (hist[s]) printf(" %d:%llu", s, (unsigned long long)hist[s]);
  printf("; %d differ\n", bad);
  return bad ? 1 : 0;
}
