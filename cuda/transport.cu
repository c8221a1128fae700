// The slot ladder's row-prefix copy on a GPU (target and shapes: ffi/transport.h):
// one strided device-to-device copy on XLA's stream. zipccl_jax slices on GPUs;
// this handler exists so that a program lowered for CPU and GPU at once (whose CPU
// branch holds the custom call) compiles on the GPU too.
#include <cuda_runtime.h>
#include <stdint.h>

#include <string>

#include "transport.h"
#include "transport_cuda.h"

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

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclRowPrefixCuda, RowPrefixCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::Buffer<ffi::U8>>()               // payload [..., L]
                                  .Ret<ffi::Buffer<ffi::U8>>(),              // slot [..., S]
                              {ffi::Traits::kCmdBufferCompatible});
