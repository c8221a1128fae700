// Part of the CUDA entropy codec (cuda/entropy.cu, through entropy_encode.cuh): the
// encoder's arguments and its per-row kernels, which run after the block kernel
// (entropy_encode.cuh, ent_encode_kernel): ent_encode_tail zeroes each row past its
// blocks, ent_encode_finalize writes each row's header, checksum and stats.
#pragma once

#include "entropy_device.cuh"

namespace zipccl {
namespace ent {
namespace gpu {
namespace {

struct EncArgs {
  const uint16_t* x;  // [rows, n]
  uint8_t* out;       // [rows, out_row], zeroed
  uint8_t* ws;        // [rows, ws_row], zeroed
  uint64_t n, nb, out_row, ws_row;
};

// Zeroes every row from the end of its blocks (data_off + data_bytes, known once
// ent_encode_kernel has run) to the end of the payload row: the zero padding up to
// used_nbytes and the unused rest. CTA (row, c) covers bytes [c, c + 1) x kTailBytes
// of its row, 16-byte stores where whole aligned words are zero.
constexpr uint64_t kTailBytes = 64 * 1024;
__global__ void __launch_bounds__(kRowThreads) ent_encode_tail(EncArgs a, uint32_t ctas_per_row) {
  const uint64_t row = blockIdx.x / ctas_per_row, c = blockIdx.x - row * ctas_per_row;
  uint8_t* out = a.out + row * a.out_row;
  const uint8_t* ws = a.ws + row * a.ws_row;
  const uint64_t data = a.nb ? *reinterpret_cast<const uint64_t*>(ws + kWsData) : 0;
  const uint64_t start = data_offset(a.n) + data;
  const uint64_t lo = c * kTailBytes > start ? c * kTailBytes : start;
  const uint64_t hi = (c + 1) * kTailBytes < a.out_row ? (c + 1) * kTailBytes : a.out_row;
  if (lo >= hi) return;
  // [lo, w0) bytes, [w0, w1) 16-byte words (aligned in memory), [w1, hi) bytes.
  const uintptr_t base = reinterpret_cast<uintptr_t>(out);
  uint64_t w0 = ((base + lo + 15) & ~(uintptr_t)15) - base, w1 = ((base + hi) & ~(uintptr_t)15) - base;
  if (w0 > hi) w0 = hi;
  if (w1 < w0) w1 = w0;
  for (uint64_t i = lo + threadIdx.x; i < w0; i += kRowThreads) out[i] = 0;
  for (uint64_t i = w0 + 16 * threadIdx.x; i < w1; i += 16 * kRowThreads)
    *reinterpret_cast<uint4*>(out + i) = make_uint4(0, 0, 0, 0);
  for (uint64_t i = w1 + threadIdx.x; i < hi; i += kRowThreads) out[i] = 0;
}

// One CTA per row: header, checksum (the blocks' terms + header and directory), stats.
template <DtypeCode D>
__global__ void __launch_bounds__(kRowThreads) ent_encode_finalize(EncArgs a, int32_t* stats) {
  ZC_SHARED(uint64_t, red, [kRowThreads / 32]);
  const uint64_t row = blockIdx.x;
  uint8_t* out = a.out + row * a.out_row;
  const uint8_t* ws = a.ws + row * a.ws_row;
  const uint64_t nb = a.nb, doff = data_offset(a.n);
  const uint64_t data = nb ? *reinterpret_cast<const uint64_t*>(ws + kWsData) : 0;
  const uint64_t used = align128(doff + data);
  const uint32_t raws = *reinterpret_cast<const uint32_t*>(ws + kWsCount);
  // The zero bytes of the header (35) and the directory's padding (the payload is
  // not memset; the directory itself was written by ent_encode_kernel).
  for (uint64_t i = kDirOff + 2 * nb + threadIdx.x; i < doff; i += kRowThreads) out[i] = 0;
  if (threadIdx.x == 0) {
    out[35] = 0;
    st32(out + kOffMagic, kMagic);
    out[kOffVersion] = kVersion;
    out[kOffDtype] = (uint8_t)D;
    out[kOffCodec] = kCodecId;
    out[kOffStatus] = 0;
    st64(out + kOffN, a.n);
    st64(out + kOffUsed, used);
    out[kOffBlockLog2] = (uint8_t)kBlockLog2;
    out[kOffStreams] = (uint8_t)kStreams;
    out[kOffMaxLen] = (uint8_t)kMaxLen;
    st32(out + kOffRawBlocks, raws);
    st64(out + kOffNumBlocks, nb);
    st64(out + kOffDataBytes, data);
  }
  __syncthreads();
  uint64_t cs = 0;
  for (uint64_t w = threadIdx.x; w < doff / 4; w += kRowThreads)
    if (w != kOffChecksum / 4 && w != kOffChecksum / 4 + 1) cs += (uint64_t)ld32(out + 4 * w) * (2 * w + 1);
  const uint64_t sum = cta_sum64<kRowThreads>(cs, red);
  if (threadIdx.x == 0) {
    st64(out + kOffChecksum, sum + *reinterpret_cast<const uint64_t*>(ws + kWsSum));
    stats[4 * row] = 0;
    stats[4 * row + 1] = (int32_t)raws;
    stats[4 * row + 2] = (int32_t)(used / kAlign);
    stats[4 * row + 3] = 0;
  }
}

}  // namespace
}  // namespace gpu
}  // namespace ent
}  // namespace zipccl
