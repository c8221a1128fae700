// The entropy codec's part of the nanobind module zipccl_jax._zipccl_cpu: its
// static-size contract (for the Python mirror test) and host-buffer entry points
// (tests that need arbitrary, truncated or corrupted payload lengths; timing
// without XLA's per-call allocation). Called from module_cpu.cc.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>

#include "entropy_cpu.h"

namespace nb = nanobind;

namespace {
using Bytes = nb::ndarray<nb::numpy, uint8_t, nb::c_contig, nb::device::cpu>;
}  // namespace

void register_entropy(nb::module_& m) {
  namespace ze = zipccl::ent;
  auto dt = [](int code) {
    if (code != 1 && code != 2) throw nb::value_error("entropy: dtype_code must be 1 (bf16) or 2 (fp16)");
    return (ze::DtypeCode)code;
  };
  m.def("entropy_max_nbytes", [dt](int d, uint64_t n) { return ze::max_nbytes(dt(d), n); },
        nb::arg("dtype_code"), nb::arg("n"));
  m.def("entropy_min_nbytes", [dt](int d, uint64_t n) { return ze::min_nbytes(dt(d), n); },
        nb::arg("dtype_code"), nb::arg("n"));
  m.def(
      "entropy_encode_into",
      [dt](int dtype_code, Bytes x, uint64_t n, Bytes out) {
        const ze::DtypeCode d = dt(dtype_code);
        if (n >= (1ull << 32)) throw nb::value_error("entropy_encode_into: n must be < 2^32");
        if (x.size() != 2 * n) throw nb::value_error("entropy_encode_into: x must hold n 16-bit elements");
        const uint64_t need = ze::max_nbytes(d, n);
        if (out.size() < need)
          throw nb::value_error(("entropy_encode_into: out must have >= " + std::to_string(need) + " bytes").c_str());
        ze::cpu::RowStats s;
        {
          nb::gil_scoped_release release;
          s = ze::cpu::encode_row(d, reinterpret_cast<const uint16_t*>(x.data()), n, out.data());
        }
        return nb::make_tuple((int)s.status, (uint64_t)s.raw_blocks, (uint64_t)s.used);
      },
      nb::arg("dtype_code"), nb::arg("x"), nb::arg("n"), nb::arg("out"));
  m.def(
      "entropy_decode_into",
      [dt](int dtype_code, Bytes payload, uint64_t n, Bytes out) {
        const ze::DtypeCode d = dt(dtype_code);
        if (n >= (1ull << 32)) throw nb::value_error("entropy_decode_into: n must be < 2^32");
        if (out.size() != 2 * n) throw nb::value_error("entropy_decode_into: out must hold n 16-bit elements");
        nb::gil_scoped_release release;
        return (int)ze::cpu::decode_row(d, payload.data(), payload.size(), n,
                                        reinterpret_cast<uint16_t*>(out.data()));
      },
      nb::arg("dtype_code"), nb::arg("payload"), nb::arg("n"), nb::arg("out"));
  m.attr("ENTROPY_BLOCK") = (int)ze::kBlock;
  m.attr("ENTROPY_STREAMS") = (int)ze::kStreams;
  m.attr("ENTROPY_MAX_LEN") = (int)ze::kMaxLen;
}
