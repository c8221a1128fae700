// nanobind module zipccl_jax._zipccl_cpu: the CPU FFI handlers as capsules for
// jax.ffi.register_ffi_target, and the static-size contract for the Python mirror test.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>

#include <string>

#include "codec_cpu.h"
#include "entropy_cpu.h"

void register_entropy(nanobind::module_& m);  // module_entropy.cc

namespace nb = nanobind;

namespace {
using Bytes = nb::ndarray<nb::numpy, uint8_t, nb::c_contig, nb::device::cpu>;

zipccl::DtypeCode check_dtype(int code) {
  if (code < 1 || code > 3) throw nb::value_error("dtype_code must be 1 (bf16), 2 (fp16) or 3 (fp32)");
  return (zipccl::DtypeCode)code;
}

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
    d["zipccl_entropy_encode"] = encapsulate(ZipcclEntropyEncodeCpu);
    d["zipccl_entropy_decode"] = encapsulate(ZipcclEntropyDecodeCpu);
    return d;
  });
  m.def(
      "encoded_nbytes",
      [](int dtype_code, uint64_t n, uint64_t capacity) {
        return zipccl::encoded_nbytes((zipccl::DtypeCode)dtype_code, n, capacity);
      },
      nb::arg("dtype_code"), nb::arg("n"), nb::arg("capacity"));
  m.def("workspace_nbytes", [](uint64_t n) { return zipccl::workspace_nbytes(n); }, nb::arg("n"));
  // Direct access to the row codec on host buffers, outside XLA: for tests that need
  // guard bytes or arbitrary (truncated, corrupted) payload lengths, and for timing
  // the codec without XLA's per-call buffer allocation.
  m.def(
      "encode_into",
      [](int dtype_code, Bytes x, uint64_t n, uint64_t capacity, Bytes out) {
        const zipccl::DtypeCode d = check_dtype(dtype_code);
        if (n >= (1ull << 32)) throw nb::value_error("encode_into: n must be < 2^32");
        if (x.size() != n * (uint64_t)zipccl::elem_bytes_of(d))
          throw nb::value_error("encode_into: x must hold n elements of the dtype");
        const uint64_t need = zipccl::encoded_nbytes(d, n, capacity);
        if (out.size() < need)
          throw nb::value_error(("encode_into: out must have >= " + std::to_string(need) + " bytes").c_str());
        zipccl::cpu::RowStats s;
        {
          nb::gil_scoped_release release;
          s = zipccl::cpu::encode_row(d, x.data(), n, capacity, out.data());
        }
        return std::make_pair((int)s.status, (uint64_t)s.escape_count);
      },
      nb::arg("dtype_code"), nb::arg("x"), nb::arg("n"), nb::arg("capacity"), nb::arg("out"));
  m.def(
      "decode_into",
      [](int dtype_code, Bytes payload, uint64_t n, uint64_t capacity, Bytes out) {
        const zipccl::DtypeCode d = check_dtype(dtype_code);
        if (n >= (1ull << 32)) throw nb::value_error("decode_into: n must be < 2^32");
        if (out.size() != n * (uint64_t)zipccl::elem_bytes_of(d))
          throw nb::value_error("decode_into: out must hold n elements of the dtype");
        nb::gil_scoped_release release;
        return (int)zipccl::cpu::decode_row(d, payload.data(), payload.size(), n, capacity, out.data());
      },
      nb::arg("dtype_code"), nb::arg("payload"), nb::arg("n"), nb::arg("capacity"), nb::arg("out"));
  register_entropy(m);
  m.attr("FORMAT_VERSION") = (int)zipccl::kVersion;
  m.attr("BLOCK") = (int)zipccl::kBlock;
}
