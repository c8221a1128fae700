// Part of the CUDA entropy codec (cuda/entropy.cu and its parts only): constants and
// warp helpers the encoder and decoder kernels share. Also compiled as host C++ by
// the SIMT emulator (tests/cuda/emulate_entropy.cc).
#pragma once

#include "device_util.h"

#include <stdint.h>

#include "entropy_format.h"

namespace zipccl {
namespace ent {
namespace gpu {
namespace {

using ::zipccl::dev::ld_relaxed;
using ::zipccl::dev::st_relaxed;

using ::zipccl::dev::st_relaxed;

constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kEncThreads = 256;  // 8 warps: warp s codes bit stream s
// ent_decode_blocks: a CTA is one warp for kDecG blocks (a lane per bit stream).
// 12.7 KB of shared memory per CTA allows 16 CTAs per SM; 16 asks for <= 128 registers.
constexpr uint32_t kDecG = 4;
constexpr int kDecThreads = 32;
constexpr int kDecMinCtas = 16;
constexpr int kRowThreads = 256;  // the per-row kernels
constexpr uint32_t kMaxArea = kBlock * kMaxLen / 8;  // bytes of the largest bit area (5632)
constexpr uint32_t kLanesPerStream = 32;
constexpr uint32_t kPerLane = kStreamLen / kLanesPerStream;  // 16 elements per lane
static_assert(kEncThreads / 32 == (int)kStreams, "one warp per stream");

// Workspace, per row (workspace_nbytes(n) bytes, zeroed by the handler):
constexpr uint32_t kWsTicket = 0;   // u32 block ticket counter (row 0's copy serves all rows)
constexpr uint32_t kWsSum = 8;      // u64 checksum terms of the blocks
constexpr uint32_t kWsCount = 16;   // u32 encoder: RAW blocks; decoder: bit s = a block had status s
constexpr uint32_t kWsData = 24;    // u64 encoder: data_bytes (written by the row's last block)
constexpr uint32_t kWsHead = 32;    // u32 decoder: the row-level status (header, directory)
constexpr uint32_t kWsTab = 128;    // u64 per block: encoder look-back state; decoder: offsets [nb + 1]
// Look-back state of a block: flag << 62 | bytes (aggregate: the block's size;
// inclusive: the sum of the sizes of blocks 0..b of the row).
constexpr uint64_t kFlagAgg = 1ull << 62, kFlagIncl = 2ull << 62, kValMask = (1ull << 62) - 1;

// entropy_format.h's traits (format v4: bf16 q = 0, fp16 q = 1) as a constant
// expression: alphabets, raw widths and the shared-memory layout follow from it.
template <DtypeCode D>
__host__ __device__ constexpr Traits traits_c() {
  return traits_of(D);
}

// Checksum term of byte v at row offset pos (COMMON.md's word checksum, per byte).
__device__ __forceinline__ uint64_t cs_byte(uint64_t pos, uint32_t v) {
  return ((uint64_t)v << (8 * (pos & 3))) * (2 * (pos >> 2) + 1);
}

__device__ __forceinline__ uint32_t popc32(uint32_t x) {
#if defined(ZIPCCL_SIMT_HOST)
  return (uint32_t)__builtin_popcount(x);
#else
  return (uint32_t)__popc(x);
#endif
}

__device__ __forceinline__ uint64_t warp_sum64(uint64_t x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

// Sum of x over the CTA, in thread 0 (red: one slot per warp). Contains a barrier.
template <int NT>
__device__ __forceinline__ uint64_t cta_sum64(uint64_t x, uint64_t* red) {
  x = warp_sum64(x);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  uint64_t s = 0;
  if (threadIdx.x == 0)
    for (int i = 0; i < NT / 32; ++i) s += red[i];
  return s;
}

__device__ __forceinline__ uint32_t warp_incl_scan(uint32_t x) {
  const uint32_t lane = threadIdx.x & 31;
#pragma unroll
  for (uint32_t d = 1; d < 32; d <<= 1) {
    const uint32_t y = __shfl_up_sync(kFull, x, d);
    if (lane >= d) x += y;
  }
  return x;
}

}  // namespace
}  // namespace gpu
}  // namespace ent
}  // namespace zipccl
