// nanobind module zipccl_jax._zipccl_cuda: the CUDA FFI handlers as capsules for
// jax.ffi.register_ffi_target(..., platform="CUDA"), under the same target names
// as the CPU module. Importing it makes no CUDA call (static cudart), so it imports
// on machines without a GPU driver; registrations() warms the kernels up where
// there is a GPU and is a no-op otherwise.
#include <nanobind/nanobind.h>

#include "codec_cuda.h"
#include "entropy_cuda.h"

namespace nb = nanobind;

namespace {
template <typename T>
nb::capsule encapsulate(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}
}  // namespace

NB_MODULE(_zipccl_cuda, m) {
  m.def("registrations", []() {
    // Before XLA can first call a handler (maybe under CUDA-graph capture): load the
    // kernels on every device now. A no-op without a GPU or driver.
    zipccl::gpu::warm_up();
    zipccl::ent::gpu::warm_up_entropy();
    nb::dict d;
    d["zipccl_zipccl_encode"] = encapsulate(ZipcclEncodeCuda);
    d["zipccl_zipccl_decode"] = encapsulate(ZipcclDecodeCuda);
    d["zipccl_entropy_encode"] = encapsulate(ZipcclEntropyEncodeCuda);
    d["zipccl_entropy_decode"] = encapsulate(ZipcclEntropyDecodeCuda);
    return d;
  });
  m.def("warm_up", []() {
    const int d = zipccl::gpu::warm_up();
    zipccl::ent::gpu::warm_up_entropy();
    return d;
  }, "Loads the CUDA kernels on every visible device; returns how many (0 without a GPU).");
}
