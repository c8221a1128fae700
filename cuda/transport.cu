// The slot ladder's row copies on a GPU (targets and shapes: ffi/transport.h).
// zipccl_jax slices and uses lax.all_to_all on GPUs; these handlers exist so that a
// program lowered for CPU and GPU at once (whose CPU branch holds the custom calls)
// compiles on the GPU too. row_prefix: one strided device-to-device copy on XLA's
// stream; row_split / row_join: one small copy kernel per peer row, which reads
// `me` on the device (no host synchronisation); used_max / agree: one-thread
// kernels; bitcast_copy: one device-to-device copy; row_unpack: one strided copy per
// leaf; row_sum: cuda/transport_sum.cuh.
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <string>
#include <string_view>

#include "transport.h"
#include "transport_cuda.h"
#include "transport_sum.cuh"

namespace ffi = xla::ffi;

namespace {

ffi::Error RowPrefixCudaImpl(cudaStream_t stream, ffi::Buffer<ffi::U8> payload,
                             ffi::Result<ffi::Buffer<ffi::U8>> slot) {
  uint64_t rows, len, slen;
  if (ffi::Error e = zipccl::transport::row_prefix_shape(payload.dimensions(), slot->dimensions(), &rows,
                                                         &len, &slen);
      e.failure())
    return e;
  if (rows == 0 || slen == 0) return ffi::Error::Success();
  // dst pitch slen, src pitch len, width slen bytes, rows rows.
  const cudaError_t err = cudaMemcpy2DAsync(slot->typed_data(), slen, payload.typed_data(), len, slen, rows,
                                            cudaMemcpyDeviceToDevice, stream);
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string(zipccl::transport::kRowPrefixTarget) + ": " + cudaGetErrorString(err));
  return ffi::Error::Success();
}

// dst[0, slen) = src row ((me + shift) mod peers) [0, slen) (src rows of len
// bytes). When me is out of range (the host checks cannot read it) dst is zeros:
// deterministic, never out of bounds.
__global__ void copy_peer_row(uint8_t* dst, const uint8_t* src, const int32_t* me, uint64_t peers, uint64_t len,
                              uint64_t slen, uint64_t shift) {
  const int32_t my = *me;
  const bool ok = my >= 0 && (uint64_t)my < peers;
  const uint8_t* row = src + (ok ? ((uint64_t)my + shift) % peers * len : 0);
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < slen; i += (uint64_t)gridDim.x * blockDim.x)
    dst[i] = ok ? row[i] : 0;
}

// dst row ((me + shift) mod peers) of [peers, slen] = src [0, slen) (zeros when me
// is out of range: then every call writes row `shift`, covering all rows once).
__global__ void place_peer_row(uint8_t* dst, const uint8_t* src, uint64_t src_stride, const int32_t* me,
                               uint64_t peers, uint64_t slen, uint64_t shift) {
  const int32_t my = *me;
  const bool ok = my >= 0 && (uint64_t)my < peers;
  uint8_t* row = dst + (ok ? ((uint64_t)my + shift) % peers : shift) * slen;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < slen; i += (uint64_t)gridDim.x * blockDim.x)
    row[i] = ok ? src[i] : 0;
}

unsigned grid_for(uint64_t bytes) {
  const uint64_t blocks = (bytes + 255) / 256;
  return (unsigned)(blocks < 1024 ? (blocks ? blocks : 1) : 1024);
}

ffi::Error launch_status(const char* target) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return ffi::Error::Internal(std::string(target) + ": " + cudaGetErrorString(err));
  return ffi::Error::Success();
}

ffi::Error RowSplitCudaImpl(cudaStream_t stream, ffi::Buffer<ffi::U8> payload, ffi::Buffer<ffi::S32> me,
                            ffi::RemainingRets pieces) {
  namespace zt = zipccl::transport;
  const char* t = zt::kRowSplitTarget;
  uint64_t peers, len, slen;
  if (ffi::Error e = zt::split_join_shapes(t, "result", payload.dimensions(), me.element_count(), pieces,
                                           &peers, &len, &slen);
      e.failure())
    return e;
  if (slen == 0) return ffi::Error::Success();
  for (uint64_t k = 1; k < peers; ++k)
    copy_peer_row<<<grid_for(slen), 256, 0, stream>>>((*pieces.get<ffi::Buffer<ffi::U8>>(k - 1))->typed_data(),
                                                      payload.typed_data(), me.typed_data(), peers, len, slen, k);
  return launch_status(t);
}

ffi::Error RowJoinCudaImpl(cudaStream_t stream, ffi::Buffer<ffi::U8> payload, ffi::Buffer<ffi::S32> me,
                           ffi::RemainingArgs pieces, ffi::Result<ffi::Buffer<ffi::U8>> out) {
  namespace zt = zipccl::transport;
  const char* t = zt::kRowJoinTarget;
  uint64_t peers, len, slen;
  if (ffi::Error e = zt::split_join_shapes(t, "operand", payload.dimensions(), me.element_count(), pieces,
                                           &peers, &len, &slen);
      e.failure())
    return e;
  if (ffi::Error e = zt::join_out_shape(out->dimensions(), peers, slen); e.failure()) return e;
  if (slen == 0) return ffi::Error::Success();
  uint8_t* dst = out->typed_data();
  // the own row (shift 0) from the payload; piece k - 1 came from peer (me - k)
  // mod N = (me + N - k) mod N
  place_peer_row<<<grid_for(slen), 256, 0, stream>>>(dst, payload.typed_data(), len, me.typed_data(), peers, slen,
                                                     0);
  for (uint64_t k = 1; k < peers; ++k)
    place_peer_row<<<grid_for(slen), 256, 0, stream>>>(dst, pieces.get<ffi::Buffer<ffi::U8>>(k - 1)->typed_data(),
                                                       slen, me.typed_data(), peers, slen, peers - k);
  return launch_status(t);
}

// used_max / agree: one thread each (a handful of rows or rungs), reading
// their operand on the device.
__global__ void used_max_kernel(int32_t* out, const int32_t* stats, uint64_t rows) {
  int32_t used = 0;
  for (uint64_t r = 0; r < rows; ++r) {
    const int32_t u = stats[r * zipccl::handler::kStatsWidth + 2];
    used = u > used ? u : used;
  }
  *out = used;
}

struct Units {
  int32_t v[zipccl::transport::kMaxRungs];
};

// The agreement on the device: rung = K + 1 (the branch that moves nothing) when the
// participants' plan fingerprints differ; the host is not involved.
__global__ void agree_kernel(int32_t* out, const int32_t* every, uint64_t rows, uint64_t width, Units units,
                             uint32_t count) {
  zipccl::transport::agree_rows(every, rows, width, units.v, count, out);
}

ffi::Error UsedMaxCudaImpl(cudaStream_t stream, ffi::Buffer<ffi::S32> stats, ffi::Result<ffi::Buffer<ffi::S32>> out) {
  uint64_t rows;
  if (ffi::Error e = zipccl::transport::used_max_shape(stats.dimensions(), out->element_count(), &rows);
      e.failure())
    return e;
  used_max_kernel<<<1, 1, 0, stream>>>(out->typed_data(), stats.typed_data(), rows);
  return launch_status(zipccl::transport::kUsedMaxTarget);
}

ffi::Error AgreeCudaImpl(cudaStream_t stream, ffi::Buffer<ffi::S32> every, ffi::Result<ffi::Buffer<ffi::S32>> out,
                         ffi::Span<const int32_t> units, std::string_view where) {
  namespace zt = zipccl::transport;
  uint64_t rows, width;
  if (ffi::Error e = zt::agree_shape(every.dimensions(), out->element_count(), units, &rows, &width); e.failure())
    return e;
  Units u{};
  for (size_t i = 0; i < units.size(); ++i) u.v[i] = units[i];
  agree_kernel<<<1, 1, 0, stream>>>(out->typed_data(), every.typed_data(), rows, width, u, (uint32_t)units.size());
  return launch_status(zt::kAgreeTarget);
}

ffi::Error BitcastCopyCudaImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  namespace zt = zipccl::transport;
  if (ffi::Error e = zt::bitcast_copy_shape(x.size_bytes(), y->size_bytes()); e.failure()) return e;
  if (x.size_bytes() == 0) return ffi::Error::Success();
  const cudaError_t err =
      cudaMemcpyAsync(y->untyped_data(), x.untyped_data(), x.size_bytes(), cudaMemcpyDeviceToDevice, stream);
  if (err != cudaSuccess) return ffi::Error::Internal(std::string(zt::kBitcastCopyTarget) + ": " + cudaGetErrorString(err));
  return ffi::Error::Success();
}

// One strided device-to-device copy per leaf on XLA's stream.
ffi::Error RowUnpackCudaImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::RemainingRets pieces) {
  namespace zt = zipccl::transport;
  const size_t es = ffi::ByteWidth(x.element_type());
  uint64_t rows, total;
  if (ffi::Error e = zt::unpack_shapes(x.dimensions(), es, pieces, &rows, &total); e.failure()) return e;
  const uint8_t* in = static_cast<const uint8_t*>(x.untyped_data());
  uint64_t off = 0;
  for (size_t k = 0; k < pieces.size(); ++k) {
    ffi::AnyBuffer y = **pieces.get<ffi::AnyBuffer>(k);
    const uint64_t w = (uint64_t)y.dimensions()[y.dimensions().size() - 1];
    if (w && rows) {
      // dst pitch w, src pitch total, width w elements, rows rows.
      const cudaError_t err = cudaMemcpy2DAsync(y.untyped_data(), w * es, in + off * es, total * es, w * es, rows,
                                                cudaMemcpyDeviceToDevice, stream);
      if (err != cudaSuccess)
        return ffi::Error::Internal(std::string(zt::kRowUnpackTarget) + ": " + cudaGetErrorString(err));
    }
    off += w;
  }
  return ffi::Error::Success();
}

// The handler's binding takes no launch limit: the default grid cap.
ffi::Error RowSumCudaBound(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::Buffer<ffi::F32>> y) {
  return zipccl::transport_sum::RowSumCudaImpl(stream, x, y);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclRowSumCuda, RowSumCudaBound,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::AnyBuffer>()                     // x [..., N, M]
                                  .Ret<ffi::Buffer<ffi::F32>>(),             // y [..., M]
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclRowUnpackCuda, RowUnpackCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::AnyBuffer>()                     // x [..., T]
                                  .RemainingRets(),                          // y_k [..., w_k]
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclUsedMaxCuda, UsedMaxCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::Buffer<ffi::S32>>()              // stats [..., 4]
                                  .Ret<ffi::Buffer<ffi::S32>>(),             // used []
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclAgreeCuda, AgreeCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::Buffer<ffi::S32>>()              // every [N, W]
                                  .Ret<ffi::Buffer<ffi::S32>>()              // (agreed, count, rung)
                                  .Attr<ffi::Span<const int32_t>>("units")
                                  .Attr<std::string_view>("where"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclBitcastCopyCuda, BitcastCopyCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::AnyBuffer>()                     // x
                                  .Ret<ffi::AnyBuffer>(),                    // y, x's bytes
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclRowSplitCuda, RowSplitCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::Buffer<ffi::U8>>()               // payload [N, L]
                                  .Arg<ffi::Buffer<ffi::S32>>()              // me []
                                  .RemainingRets(),                          // N - 1 x u8 [S]
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclRowJoinCuda, RowJoinCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::Buffer<ffi::U8>>()               // payload [N, L]
                                  .Arg<ffi::Buffer<ffi::S32>>()              // me []
                                  .RemainingArgs()                           // N - 1 x u8 [S]
                                  .Ret<ffi::Buffer<ffi::U8>>(),              // out [N, S]
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclRowPrefixCuda, RowPrefixCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::Buffer<ffi::U8>>()               // payload [..., L]
                                  .Ret<ffi::Buffer<ffi::U8>>(),              // slot [..., S]
                              {ffi::Traits::kCmdBufferCompatible});
