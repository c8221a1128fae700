// Checks that the encoder's package-merge variants give identical code lengths on
// random and adversarial histograms: the normative code_lengths (entropy_format.h),
// the scalar merge code_lengths_fast and the AVX2 sorting networks
// (code_lengths_pick<true>, ffi/entropy_cpu.cc) on the same counts. This file
// includes ffi/entropy_cpu.cc to reach its internal functions (built by
// tests/test_entropy.py: test_code_lengths_network_equals_merge).
// Usage: entropy_pm_check [cases = 200000] [seed = 1]; prints "cases=N
// network=M mismatches=0" (M: cases with 2..64 present symbols, the networks'
// range) and the first mismatch, if any, with its counts.
#include "entropy_cpu.cc"

#include <cstdio>
#include <random>

using namespace zipccl::ent;

namespace {

// One histogram over A symbols: shape chosen by `kind`, counts summing to <= 4096
// (a block's elements) unless `big` (up to 11 * 4096: the weights the scalar code's
// comment bounds, not reachable from a block).
void make_counts(std::mt19937_64& g, uint32_t kind, uint32_t A, uint32_t* c) {
  auto U = [&](uint64_t n) { return (uint32_t)(g() % n); };
  for (uint32_t a = 0; a < A; ++a) c[a] = 0;
  const uint32_t k = 2 + U(std::min<uint32_t>(A - 1, 80));  // present symbols: 2..81 (past the networks' 64 too)
  const uint32_t a0 = U(A - k + 1);
  const bool gaps = U(2);
  uint32_t at = a0;
  std::vector<uint32_t> pos;
  for (uint32_t i = 0; i < k && at < A; ++i) {
    pos.push_back(at);
    at += gaps ? 1 + U(3) : 1;
  }
  uint32_t budget = 4096;
  for (size_t i = 0; i < pos.size(); ++i) {
    uint32_t v;
    switch (kind) {
      case 0: v = 1 + U(4); break;                                   // small values: many ties
      case 1: v = 1u << U(12); break;                                // powers of two: leaf = package ties
      case 2: v = 1 + U(4096 / (uint32_t)pos.size()); break;         // uniform
      case 3: v = std::max<uint32_t>(1, 2048u >> std::min<uint32_t>((uint32_t)i, 11)); break;  // geometric
      case 4: {                                                      // Fibonacci: deepest trees
        uint32_t f0 = 1, f1 = 1;
        for (size_t j = 0; j < i; ++j) { const uint32_t t = f0 + f1; f0 = f1; f1 = t; }
        v = f0;
        break;
      }
      case 5: v = 7; break;                                          // all equal
      case 6: v = (uint32_t)(4096.0 * std::exp(-0.5 * std::pow(((double)i - pos.size() / 2.0) / (1 + U(4)), 2)) / 8) + U(2);
        break;                                                       // Gaussian-like exponent counts
      default: v = U(3) ? 1 + U(16) : 1 + U(600); break;             // mixed
    }
    if (v == 0) v = 1;
    v = std::min(v, budget > pos.size() ? budget - (uint32_t)(pos.size() - i - 1) : 1u);
    if (v == 0) v = 1;
    c[pos[i]] = v;
    budget -= std::min(budget, v);
  }
  // A random permutation of the values over the positions (shapes in any order).
  if (U(2))
    for (size_t i = pos.size(); i > 1; --i) std::swap(c[pos[i - 1]], c[pos[U(i)]]);
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t cases = argc > 1 ? strtoull(argv[1], 0, 0) : 200000;
  std::mt19937_64 g(argc > 2 ? strtoull(argv[2], 0, 0) : 1);
#if EZ_X86
  if (!cpu::have_fast_isa()) {
    printf("no AVX2/BMI2: the networks are not used on this host\n");
    return 0;
  }
#endif
  static PMScratch ref;
  static cpu::PMFast pm;
  static uint32_t c[kMaxAlphabet];
  static uint8_t l0[kMaxAlphabet], l1[kMaxAlphabet], l2[kMaxAlphabet];
  uint64_t net = 0, bad = 0;
  for (uint64_t i = 0; i < cases; ++i) {
    const uint32_t A = (i & 1) ? 64 : 512;
    make_counts(g, (uint32_t)(i % 8), A, c);
    const uint32_t k0 = code_lengths(c, A, l0, &ref);
    const uint32_t k1 = cpu::code_lengths_fast(c, 0, A, l1, pm);
    const uint32_t k2 = cpu::code_lengths_pick<true>(c, 0, A, l2, pm);
    net += k2 >= 2 && k2 <= 64;
    if (k0 != k1 || k0 != k2 || memcmp(l0, l1, A) || memcmp(l0, l2, A)) {
      if (!bad++) {
        printf("mismatch in case %llu (k %u %u %u); counts:", (unsigned long long)i, k0, k1, k2);
        for (uint32_t a = 0; a < A; ++a)
          if (c[a]) printf(" %u:%u(%u/%u/%u)", a, c[a], l0[a], l1[a], l2[a]);
        printf("\n");
      }
    }
  }
  printf("cases=%llu network=%llu mismatches=%llu\n", (unsigned long long)cases, (unsigned long long)net,
         (unsigned long long)bad);
  return bad ? 1 : 0;
}
