// zipccl_row_sum's CUDA kernel (cuda/transport_sum.cuh) run on the CPU: the kernel and
// its launch code, compiled unchanged for the SIMT emulator of tests/cuda/simt_host.h.
// Every output word is compared with the contract of ffi/transport.h evaluated on
// the host (float32 adds in row order, flushes, NaN order), for bf16 / f16 / f32,
// 1..9 rows, batches, random words (NaNs, infinities, subnormals included) and a
// grid smaller than the columns (the grid-stride loop). Device buffers are
// page-guarded (an access past a buffer's end faults) and start as garbage.
//
// Build and run (tests/test_cuda_build.py does this), with INC = jax.ffi.include_dir():
//   g++ -O2 -std=c++17 -Iffi -Icuda -Itests/cuda -isystem $INC tests/cuda/emulate_transport.cc ffi/transport_cpu.cc -lpthread
//   ./a.out [--quick] [--stop]
// simt_host.h switches fibers with _longjmp, which the fortified libc refuses
// between stacks; this must precede every #include.
#undef _FORTIFY_SOURCE
#define ZIPCCL_SIMT_HOST 1
#include "transport_sum.cuh"  // brings in simt_host.h through device_util.h

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <random>
#include <vector>

#include "emulate_common.h"

namespace {

namespace ffi = ::xla::ffi;
namespace zt = zipccl::transport;
using zipccl_emulate::DevBuf;

struct Kind {
  XLA_FFI_DataType t;
  size_t elem;
  const char* name;
};

// The contract on the host: row order, flushes, ordered_add's NaN rules.
uint32_t widen(const Kind& k, const uint8_t* p) {
  if (k.elem == 4) {
    uint32_t w;
    memcpy(&w, p, 4);
    return w;
  }
  uint16_t h;
  memcpy(&h, p, 2);
  return k.t == XLA_FFI_DataType_BF16 ? zt::widen_bf16(h) : zt::widen_f16(h);
}

uint32_t expected(const Kind& k, const uint8_t* x, uint64_t n, uint64_t m, uint64_t b, uint64_t j) {
  const uint8_t* col = x + ((b * n) * m + j) * k.elem;
  uint32_t acc = n == 1 ? widen(k, col) : zt::flush_subnormal(widen(k, col));
  for (uint64_t i = 1; i < n; ++i) {
    const uint32_t v = zt::flush_subnormal(widen(k, col + i * m * k.elem));
    float fa, fv;
    memcpy(&fa, &acc, 4);
    memcpy(&fv, &v, 4);
    const float s = fa + fv;
    uint32_t sb;
    memcpy(&sb, &s, 4);
    acc = zt::ordered_add(acc, v, sb);
  }
  return acc;
}

// One case: x [batch, n, m] of random words (or small normals), the kernel through
// its handler with at most max_blocks blocks; false on any difference.
bool run_case(const Kind& k, uint64_t batch, uint64_t n, uint64_t m, uint64_t max_blocks, bool noise,
              std::mt19937_64& rng) {
  std::vector<uint8_t> x(batch * n * m * k.elem);
  for (size_t i = 0; i < x.size(); i += k.elem) {
    uint32_t w = (uint32_t)rng();
    if (!noise) {   // small normals with a random sign, exponents near 1: sums without overflow
      w = k.elem == 4 ? (w & 0x807fffffu) | (0x3c000000u + ((w >> 8) & 0x07800000u))
                      : k.t == XLA_FFI_DataType_BF16 ? (w & 0x807f) | 0x3c00 : (w & 0x83ff) | 0x3400;
    }
    memcpy(&x[i], &w, k.elem);
  }
  DevBuf dx(x.size()), dy(batch * m * 4);
  memcpy(dx.data(), x.data(), x.size());
  int64_t xd[3] = {(int64_t)batch, (int64_t)n, (int64_t)m}, yd[2] = {(int64_t)batch, (int64_t)m};
  XLA_FFI_Buffer bx{XLA_FFI_Buffer_STRUCT_SIZE, nullptr, k.t, dx.data(), 3, xd};
  XLA_FFI_Buffer by{XLA_FFI_Buffer_STRUCT_SIZE, nullptr, XLA_FFI_DataType_F32, dy.data(), 2, yd};
  simt::config().resident = 1 + (unsigned)(rng() % 4);
  simt::config().seed = rng();
  const ffi::Error e = zipccl::transport_sum::RowSumCudaImpl(nullptr, ffi::AnyBuffer(&bx), ffi::Buffer<ffi::F32>(&by),
                                                             max_blocks);
  if (e.failure()) {
    printf("%s [%lu, %lu, %lu]: handler error %s\n", k.name, (unsigned long)batch, (unsigned long)n,
           (unsigned long)m, e.message().c_str());
    return false;
  }
  for (uint64_t b = 0; b < batch; ++b)
    for (uint64_t j = 0; j < m; ++j) {
      uint32_t got;
      memcpy(&got, dy.data() + (b * m + j) * 4, 4);
      const uint32_t want = expected(k, x.data(), n, m, b, j);
      if (got != want) {
        printf("%s [%lu, %lu, %lu] blocks<=%lu: y[%lu, %lu] = %08x, want %08x\n", k.name, (unsigned long)batch,
               (unsigned long)n, (unsigned long)m, (unsigned long)max_blocks, (unsigned long)b, (unsigned long)j,
               got, want);
        return false;
      }
    }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  bool big = true, stop = false;
  if (!zipccl_emulate::parse_args(argc, argv, &big, &stop)) return 2;
  const Kind kinds[] = {{XLA_FFI_DataType_BF16, 2, "bf16"}, {XLA_FFI_DataType_F16, 2, "f16"},
                        {XLA_FFI_DataType_F32, 4, "f32"}};
  std::mt19937_64 rng(7);
  int cases = 0, failures = 0;
  for (const Kind& k : kinds)
    for (uint64_t n : {1, 2, 3, 8, 9})
      for (uint64_t m : {1, 7, 300, big ? 1000 : 257})
        for (uint64_t batch : {1, 3})
          for (bool noise : {true, false})
            for (uint64_t max_blocks : {65535, 2}) {   // 2: the grid-stride loop covers the rest
              ++cases;
              if (!run_case(k, batch, n, m, max_blocks, noise, rng)) {
                ++failures;
                if (stop) break;
              }
            }
  printf("%d cases, %d failures\n", cases, failures);
  return failures ? 1 : 0;
}
