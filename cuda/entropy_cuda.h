// CUDA "entropy" codec: XLA FFI handlers for platform "CUDA" (cuda/entropy.cu),
// registered by cuda/module_cuda.cc under the CPU handlers' target names
// "zipccl_entropy_encode" / "zipccl_entropy_decode".
#pragma once

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclEntropyEncodeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclEntropyDecodeCuda);

namespace zipccl {
namespace ent {
namespace gpu {
// Loads the entropy kernels on every visible device (so that no handler call under
// CUDA-graph capture loads a module). Returns the devices prepared; 0 without a GPU.
int warm_up_entropy();
}  // namespace gpu
}  // namespace ent
}  // namespace zipccl
