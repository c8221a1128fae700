// Part of the CUDA entropy codec (cuda/entropy.cu, the only file that includes it):
// the decoder's per-row kernels. ent_decode_rows checks each row's header and block
// directory before the blocks decode (entropy_decode.cuh, ent_decode_blocks), and
// ent_decode_finalize sets each row's status after them.
#pragma once

#include "entropy_device.cuh"

namespace zipccl {
namespace ent {
namespace gpu {
namespace {

struct DecArgs {
  const uint8_t* in;  // [rows, L]
  uint16_t* y;        // [rows, n]
  uint8_t* ws;        // [rows, ws_row], zeroed
  uint64_t L, n, nb, ws_row;
  uint64_t nblk;  // rows * nb: the blocks of the call
};

// The header checks of the CPU decoder, in its order (docs/format.md).
template <DtypeCode D>
__device__ int32_t header_status(const uint8_t* in, uint64_t L, uint64_t n) {
  if (L < kHeaderBytes) return kDecBadSize;
  if (ld32(in + kOffMagic) != kMagic || in[kOffVersion] != kVersion || in[kOffCodec] != kCodecId)
    return kDecBadMagic;
  if (in[kOffDtype] != (uint8_t)D) return kDecBadDtype;
  const uint64_t used = ld64(in + kOffUsed);
  if (ld64(in + kOffN) != n || used % kAlign || used > L || used < min_nbytes(D, n) || used > max_nbytes(D, n))
    return kDecBadSize;
  if (in[kOffStatus] == 1) return kDecNotDecodable;
  const uint64_t nb = num_blocks(n), doff = data_offset(n);
  const uint64_t data_bytes = ld64(in + kOffDataBytes);
  bool ok = in[kOffStatus] == 0 && in[kOffBlockLog2] == kBlockLog2 && in[kOffStreams] == kStreams &&
            in[kOffMaxLen] == kMaxLen && in[35] == 0 && ld64(in + kOffNumBlocks) == nb &&
            ld32(in + kOffRawBlocks) <= nb && data_bytes <= used - doff && align128(doff + data_bytes) == used;
  for (uint64_t i = kDirOff + 2 * nb; i < doff && ok; ++i) ok = in[i] == 0;  // dir padding
  return ok ? kDecOk : kDecBadHeader;
}

// One CTA per row: header status, then the directory (sizes in range, their sum,
// the RAW count) with the block offsets stored in the workspace, and the checksum
// terms of the header and directory.
template <DtypeCode D>
__global__ void __launch_bounds__(kRowThreads) ent_decode_rows(DecArgs a) {
  ZC_SHARED(uint64_t, red, [kRowThreads / 32]);
  ZC_SHARED(uint32_t, sh, [2]);  // status, a size out of range
  const uint64_t row = blockIdx.x;
  const uint8_t* in = a.in + row * a.L;
  uint8_t* ws = a.ws + row * a.ws_row;
  const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    sh[0] = (uint32_t)header_status<D>(in, a.L, a.n);
    sh[1] = 0;
  }
  __syncthreads();
  if (sh[0] != kDecOk) {
    if (tid == 0) *reinterpret_cast<uint32_t*>(ws + kWsHead) = sh[0];
    return;
  }
  const uint64_t nb = a.nb, doff = data_offset(a.n);
  const uint64_t data_bytes = ld64(in + kOffDataBytes), used = ld64(in + kOffUsed);
  uint64_t* off = reinterpret_cast<uint64_t*>(ws + kWsTab);
  // Thread t owns the contiguous blocks [b0, b1): its sizes are summed (independent
  // loads), the sums scanned over the CTA, then the offsets written in a second pass.
  // (One chunk of 256 blocks per barrier, as before, took ~1.5 K cycles per chunk on
  // one SM: ~25 us for a 64 MiB row.)
  const uint64_t per = (nb + kRowThreads - 1) / kRowThreads;
  const uint64_t b0 = tid * per < nb ? tid * per : nb, b1 = b0 + per < nb ? b0 + per : nb;
  uint64_t mine = 0;
  bool bad = false;
  for (uint64_t b = b0; b < b1; ++b) {
    const uint32_t sz = ld16(in + kDirOff + 2 * b);
    bad |= sz < kBlockHead || sz > max_block_bytes(block_len(a.n, b));
    mine += sz;
  }
  if (bad) sh[1] = 1;
  uint64_t incl = mine;
#pragma unroll
  for (uint32_t d = 1; d < 32; d <<= 1) {
    const uint64_t o = __shfl_up_sync(kFull, incl, d);
    if (lane >= d) incl += o;
  }
  if (lane == 31) red[warp] = incl;
  __syncthreads();
  uint64_t carry = doff, pos = doff + incl - mine;
  for (uint32_t w = 0; w < kRowThreads / 32; ++w) {
    carry += red[w];
    if (w < warp) pos += red[w];
  }
  uint32_t st = kDecOk;
  uint32_t raws = 0;
  const bool valid = !sh[1] && carry == doff + data_bytes;  // then every block lies inside [doff, used)
  if (!valid) st = kDecBadTable;
  for (uint64_t b = b0; b < b1; ++b) {
    off[b] = pos;
    if (valid) raws += in[pos] == 0;
    pos += ld16(in + kDirOff + 2 * b);
  }
  __syncthreads();  // red is reused below
  uint64_t cs = 0;
  for (uint64_t w = tid; w < doff / 4; w += kRowThreads)
    if (w != kOffChecksum / 4 && w != kOffChecksum / 4 + 1) cs += (uint64_t)ld32(in + 4 * w) * (2 * w + 1);
  if (nb == 0)
    for (uint64_t w = doff / 4 + tid; w < used / 4; w += kRowThreads) cs += (uint64_t)ld32(in + 4 * w) * (2 * w + 1);
  const uint64_t sum = cta_sum64<kRowThreads>(cs, red);
  __syncthreads();
  const uint64_t nraw = cta_sum64<kRowThreads>(raws, red);
  if (tid == 0) {
    if (st == kDecOk && nraw != ld32(in + kOffRawBlocks)) st = kDecBadTable;
    off[nb] = carry;
    *reinterpret_cast<uint64_t*>(ws + kWsSum) = sum;
    *reinterpret_cast<uint32_t*>(ws + kWsHead) = st;
  }
}

// One CTA per row: the status by the CPU's priority (row checks, the smallest
// block error, the checksum); a row with a nonzero status becomes all-one bits.
__global__ void __launch_bounds__(kRowThreads) ent_decode_finalize(DecArgs a, int32_t* status) {
  ZC_SHARED(uint32_t, sst, );
  const uint64_t row = blockIdx.x;
  const uint8_t* ws = a.ws + row * a.ws_row;
  if (threadIdx.x == 0) {
    uint32_t st = *reinterpret_cast<const uint32_t*>(ws + kWsHead);
    if (st == kDecOk) {
      const uint32_t f = *reinterpret_cast<const uint32_t*>(ws + kWsCount);
      if (f & (1u << kDecBadTable))
        st = kDecBadTable;
      else if (f & (1u << kDecBadStream))
        st = kDecBadStream;
      else if (*reinterpret_cast<const uint64_t*>(ws + kWsSum) != ld64(a.in + row * a.L + kOffChecksum))
        st = kDecBadChecksum;
    }
    sst = st;
    status[row] = (int32_t)st;
  }
  __syncthreads();
  if (sst != kDecOk) {
    uint16_t* y = a.y + row * a.n;
    for (uint64_t j = threadIdx.x; j < a.n; j += kRowThreads) y[j] = 0xFFFF;
  }
}

}  // namespace
}  // namespace gpu
}  // namespace ent
}  // namespace zipccl
