// nanobind module zipccl_jax._zipccl_cpu: the CPU FFI handlers as capsules for
// jax.ffi.register_ffi_target, and the static-size contract for the Python mirror test.
#include <nanobind/nanobind.h>

#include "codec_cpu.h"

namespace nb = nanobind;

namespace {
template <typename T>
nb::capsule encapsulate(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}
}  // namespace

NB_MODULE(_zipccl_cpu, m) {
  m.def("registrations", []() {
    nb::dict d;
    d["zipccl_zipccl_encode"] = encapsulate(ZipcclEncodeCpu);
    d["zipccl_zipccl_decode"] = encapsulate(ZipcclDecodeCpu);
    return d;
  });
  m.def(
      "encoded_nbytes",
      [](int dtype_code, uint64_t n, uint64_t capacity) {
        return zipccl::encoded_nbytes((zipccl::DtypeCode)dtype_code, n, capacity);
      },
      nb::arg("dtype_code"), nb::arg("n"), nb::arg("capacity"));
  m.def("workspace_nbytes", [](uint64_t n) { return zipccl::workspace_nbytes(n); }, nb::arg("n"));
  m.attr("FORMAT_VERSION") = (int)zipccl::kVersion;
  m.attr("BLOCK") = (int)zipccl::kBlock;
}
