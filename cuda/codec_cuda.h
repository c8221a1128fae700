// CUDA zipccl codec: XLA FFI handlers for platform "CUDA" (cuda/codec.cu), registered
// by cuda/module_cuda.cc under the same target names as the CPU handlers.
#pragma once

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclEncodeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecodeCuda);

namespace zipccl {
namespace gpu {
// Loads the kernels and caches their occupancy on every visible device, so that no
// later handler call (possibly under CUDA-graph stream capture) does first-time
// module loading. Returns the number of devices prepared (0 without a GPU or
// driver; never fails). Called by the module's registrations().
int warm_up();
}  // namespace gpu
}  // namespace zipccl
