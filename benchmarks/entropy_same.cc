// Byte-identity check of the entropy codec's CPU row encoder: a base revision's
// ffi/entropy_cpu.cc (namespace renamed to zbase, see entropy_same.sh) against this
// tree's, on rows read from files. Each output buffer starts with different garbage,
// so the whole max_nbytes row (the zeroed tail included) must come out equal; both
// decoders must return the input. Prints one line per row with the payload's
// FNV-1a 64 hash and a final verdict; exit status 1 on any difference.
// Usage: entropy_same FILE... (FILE: little-endian u16 words; its name ends in
// .bf16 or .fp16).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "entropy_cpu.h"
#include "entropy_base.h"
using namespace zipccl::ent;
static uint64_t fnv(const uint8_t* p, uint64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}
int main(int argc, char** argv) {
  int bad = 0;
  for (int a = 1; a < argc; ++a) {
    const std::string path = argv[a];
    bool fp16;
    std::vector<uint16_t> x;
    if (!zbase::read_row(path, &fp16, &x)) { printf("cannot read %s\n", path.c_str()); return 2; }
    const DtypeCode d = fp16 ? kF16 : kBF16;
    const uint64_t n = x.size(), M = max_nbytes(d, n);
    std::vector<uint8_t> oa(M + 1, 0x11), ob(M + 1, 0x22);
    const auto ra = zbase::ent::cpu::encode_row((zbase::ent::DtypeCode)d, x.data(), n, oa.data());
    const auto rb = cpu::encode_row(d, x.data(), n, ob.data());
    const bool same = ra.used == rb.used && ra.raw_blocks == rb.raw_blocks && std::memcmp(oa.data(), ob.data(), M) == 0 &&
                      oa[M] == 0x11 && ob[M] == 0x22;
    std::vector<uint16_t> ya(n + 1, 0), yb(n + 1, 0);
    const int da = zbase::ent::cpu::decode_row((zbase::ent::DtypeCode)d, ob.data(), M, n, ya.data());
    const int db = cpu::decode_row(d, ob.data(), M, n, yb.data());
    const bool rt = da == 0 && db == 0 && std::memcmp(ya.data(), x.data(), 2 * n) == 0 &&
                    std::memcmp(yb.data(), x.data(), 2 * n) == 0;
    uint64_t first = 0;
    while (first < M && oa[first] == ob[first]) ++first;
    printf("%s n=%llu used=%llu hash base %016llx new %016llx %s%s\n", path.c_str(), (unsigned long long)n,
           (unsigned long long)rb.used, (unsigned long long)fnv(oa.data(), M), (unsigned long long)fnv(ob.data(), M),
           same ? "same" : "DIFFERENT", rt ? "" : " ROUND TRIP FAILED");
    if (!same && first < M) printf("  first difference at byte %llu: base %02x new %02x\n", (unsigned long long)first, oa[first], ob[first]);
    bad += !same || !rt;
  }
  printf("%d of %d rows identical and round-tripping\n", argc - 1 - bad, argc - 1);
  return bad ? 1 : 0;
}
