// CUDA zipccl codec: XLA FFI handlers for platform "CUDA" (cuda/window.cu), registered
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

// Chooses the tile kernels' variant (1, 2 or 4 groups of 8 elements per thread) for
// every later handler call of this process; 0 returns to ZIPCCL_CUDA_GROUPS or the
// default. For benchmarks and tests that compare the variants in one process (the
// environment variable is read once). Returns false (and changes nothing) for
// another value. The payload bytes do not depend on it.
bool set_tile_groups(int groups);
}  // namespace gpu
}  // namespace zipccl
