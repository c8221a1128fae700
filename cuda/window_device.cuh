// Part of the CUDA window codec (cuda/window.cu, the only file that includes it,
// with window_encode.cuh and window_decode.cuh): the kernels' shared constants and
// device helpers (warp and block sums, checksum flushes).
#pragma once

#include "device_util.h"  // CUDA or, for tests/cuda/emulate_window.cc, the CPU SIMT emulator

#include <stdint.h>

#include "window_format.h"
#include "window_tile.h"

namespace zipccl {
namespace gpu {
namespace {

using namespace ::zipccl::tile;

constexpr unsigned kFull = 0xFFFFFFFFu;
// The tile kernels come in variants of G = 1, 2 or 4 groups of 8 elements per
// thread (kPlaneBytes / G threads per CTA; see docs/cuda.md, "Groups per thread").
template <int G>
__host__ __device__ constexpr int tile_threads() {
  return (int)kPlaneBytes / G;
}
// __launch_bounds__ minimum CTAs per SM: it sets the register cap per thread,
// 65536 / (threads x CTAs): 48 / 64 / ~100 for 16-bit dtypes with G = 1 / 2 / 4,
// 64 / ~100 / 128 for fp32 (8 words per group), all without spills (ptxas -v).
template <typename T, int G>
constexpr int min_ctas() {
  return Cfg<T>::kBits == 16 ? (G == 1 ? 5 : G == 2 ? 8 : 10) : (G == 1 ? 4 : G == 2 ? 5 : 8);
}
constexpr uint32_t kMaxGridX = 0x7FFFFFFFu;
constexpr uint32_t kNoTicket = 0xFFFFFFFFu;  // >= any total_tiles

// ---- device helpers ----------------------------------------------------------------

using ::zipccl::dev::cp_async16;
using ::zipccl::dev::cp_async8;
using ::zipccl::dev::cp_commit;
using ::zipccl::dev::cp_wait;
using ::zipccl::dev::ld_relaxed;
using ::zipccl::dev::st_relaxed;

__device__ __forceinline__ void st_u64(uint8_t* p, uint64_t v) { *reinterpret_cast<uint64_t*>(p) = v; }
__device__ __forceinline__ uint64_t ld_u64(const uint8_t* p) { return *reinterpret_cast<const uint64_t*>(p); }

// Warp sum of a u64 (mod 2^64), in every lane.
__device__ __forceinline__ uint64_t warp_sum64(uint64_t x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

// Block sums of two u32 per thread in two steps around a barrier: warp_sums2 puts
// the warp's sums in s[warp] (lane 0), block_sums2 adds the NW entries up
// once every warp has stored them.
__device__ __forceinline__ void warp_sums2(uint32_t (*s)[2], uint32_t x, uint32_t y, int lane, int warp) {
  x = __reduce_add_sync(kFull, x);
  y = __reduce_add_sync(kFull, y);
  if (lane == 0) {
    s[warp][0] = x;
    s[warp][1] = y;
  }
}

template <int NW>
__device__ __forceinline__ uint2 block_sums2(const uint32_t (*s)[2]) {
  uint2 r = make_uint2(0, 0);
#pragma unroll
  for (int i = 0; i < NW; ++i) {
    r.x += s[i][0];
    r.y += s[i][1];
  }
  return r;
}

// Adds the warp's checksum terms to *slot (one atomic per warp; skipped if zero).
__device__ __forceinline__ void flush_sum(uint8_t* slot, uint64_t x, int lane) {
  x = warp_sum64(x);
  if (lane == 0 && x) atomicAdd(reinterpret_cast<unsigned long long*>(slot), (unsigned long long)x);
}

}  // namespace
}  // namespace gpu
}  // namespace zipccl
