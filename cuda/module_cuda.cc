// nanobind module zipccl_jax._zipccl_cuda: the CUDA FFI handlers as capsules for
// jax.ffi.register_ffi_target(..., platform="CUDA"), under the same target names
// as the CPU module. Importing it makes no CUDA call (static cudart), so it imports
// on machines without a GPU driver; registrations() warms the kernels up where
// there is a GPU and is a no-op otherwise.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include "window_cuda.h"
#include "entropy_cuda.h"
#include "handler_common.h"
#include "mailbox.h"
#include "mailbox_cuda.h"
#include "transport.h"
#include "transport_cuda.h"

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
    d[zipccl::handler::kEncodeTarget] = encapsulate(ZipcclEncodeCuda);
    d[zipccl::handler::kDecodeTarget] = encapsulate(ZipcclDecodeCuda);
    d["zipccl_entropy_encode"] = encapsulate(ZipcclEntropyEncodeCuda);
    d["zipccl_entropy_decode"] = encapsulate(ZipcclEntropyDecodeCuda);
    d[zipccl::transport::kRowPrefixTarget] = encapsulate(ZipcclRowPrefixCuda);
    d[zipccl::transport::kRowSplitTarget] = encapsulate(ZipcclRowSplitCuda);
    d[zipccl::transport::kRowJoinTarget] = encapsulate(ZipcclRowJoinCuda);
    d[zipccl::transport::kUsedMaxTarget] = encapsulate(ZipcclUsedMaxCuda);
    d[zipccl::transport::kAgreeTarget] = encapsulate(ZipcclAgreeCuda);
    d[zipccl::transport::kBitcastCopyTarget] = encapsulate(ZipcclBitcastCopyCuda);
    d[zipccl::transport::kRowUnpackTarget] = encapsulate(ZipcclRowUnpackCuda);
    d[zipccl::transport::kRowSumTarget] = encapsulate(ZipcclRowSumCuda);
    d[zipccl::mailbox::kMailboxTarget] = encapsulate(ZipcclMailboxCuda);
    return d;
  });
  m.def(
      "mailbox_take", [](int64_t ledger) { return zipccl::mailbox::take_cuda(ledger); }, nb::arg("ledger"),
      "The planned transport's CUDA mailbox table of `ledger` (-1: never recorded), reset (ffi/mailbox.h).");
  m.def(
      "set_tile_groups",
      [](int groups) {
        if (!zipccl::gpu::set_tile_groups(groups)) throw nb::value_error("groups must be 0, 1, 2 or 4");
      },
      nb::arg("groups"),
      "Tile-kernel variant (1, 2, 4 groups per thread) of later calls; 0: ZIPCCL_CUDA_GROUPS or the default.");
  m.def("warm_up", []() {
    const int d = zipccl::gpu::warm_up();
    zipccl::ent::gpu::warm_up_entropy();
    return d;
  }, "Loads the CUDA kernels on every visible device; returns how many (0 without a GPU).");
}
