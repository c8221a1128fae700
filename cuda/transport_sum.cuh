// zipccl_row_sum on a GPU (contract: ffi/transport.h): one kernel, a thread per
// output column summing its N rows in order with the contract's float32 adds (the
// host/device helpers of ffi/transport.h: widening, flush, NaN order). Included by
// cuda/transport.cu, and by tests/cuda/emulate_transport.cc, which runs it on the
// CPU SIMT emulator (ZIPCCL_SIMT_HOST) against the contract evaluated on the host.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <string>

#include "device_util.h"  // CUDA or the SIMT emulator; ZC_LAUNCH
#include "transport.h"
#include "xla/ffi/api/ffi.h"

namespace zipccl {
namespace transport_sum {

// y[b, j] for every (b, j) of batch x m: rows 0..N-1 of column j of batch b in
// order (x [batch, n, m], row stride m).
template <typename Word, uint32_t (*Widen)(Word)>
__global__ void row_sum_kernel(const Word* x, float* y, uint64_t batch, uint64_t n, uint64_t m) {
  namespace zt = zipccl::transport;
  for (uint64_t c = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; c < batch * m;
       c += (uint64_t)gridDim.x * blockDim.x) {
    const Word* col = x + c / m * n * m + c % m;
    uint32_t acc = n == 1 ? Widen(col[0]) : zt::flush_subnormal(Widen(col[0]));   // one row: no add
    for (uint64_t i = 1; i < n; ++i) {
      const uint32_t v = zt::flush_subnormal(Widen(col[i * m]));
      acc = zt::ordered_add(acc, v, __float_as_uint(__fadd_rn(__uint_as_float(acc), __uint_as_float(v))));
    }
    y[c] = __uint_as_float(acc);
  }
}

// Blocks of 256 threads, at most max_blocks (a grid-stride loop covers the rest).
inline xla::ffi::Error RowSumCudaImpl(cudaStream_t stream, xla::ffi::AnyBuffer x,
                                      xla::ffi::Result<xla::ffi::Buffer<xla::ffi::F32>> y,
                                      uint64_t max_blocks = 65535) {
  namespace ffi = xla::ffi;
  namespace zt = zipccl::transport;
  uint64_t batch = 0, n = 0, m = 0;
  if (ffi::Error e = zt::row_sum_shapes(x.element_type(), x.dimensions(), y->dimensions(), &batch, &n, &m);
      e.failure())
    return e;
  if (batch * m == 0) return ffi::Error::Success();
  const unsigned threads = 256;
  const unsigned blocks = (unsigned)std::min<uint64_t>((batch * m + threads - 1) / threads, max_blocks);
  float* out = y->typed_data();
  const ffi::DataType t = x.element_type();
  if (t == ffi::DataType::F32) {
    const uint32_t* in = static_cast<const uint32_t*>(x.untyped_data());
    ZC_LAUNCH((row_sum_kernel<uint32_t, zt::widen_f32>), blocks, threads, stream, in, out, batch, n, m);
  } else if (t == ffi::DataType::BF16) {
    const uint16_t* in = static_cast<const uint16_t*>(x.untyped_data());
    ZC_LAUNCH((row_sum_kernel<uint16_t, zt::widen_bf16>), blocks, threads, stream, in, out, batch, n, m);
  } else {
    const uint16_t* in = static_cast<const uint16_t*>(x.untyped_data());
    ZC_LAUNCH((row_sum_kernel<uint16_t, zt::widen_f16>), blocks, threads, stream, in, out, batch, n, m);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string(zt::kRowSumTarget) + ": " + cudaGetErrorString(err));
  return ffi::Error::Success();
}

}  // namespace transport_sum
}  // namespace zipccl
