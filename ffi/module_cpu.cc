// nanobind module zipccl_jax._zipccl_cpu: the CPU FFI handlers as capsules for
// jax.ffi.register_ffi_target (registrations(): the one source of the target names),
// the static-size contract for the Python mirror test, and the row codec on host
// buffers (encode_into / decode_into).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "window_cpu.h"
#include "entropy_cpu.h"
#include "handler_common.h"
#include "mailbox.h"
#include "segments.h"
#include "transport.h"

void register_entropy(nanobind::module_& m);  // module_entropy.cc

namespace nb = nanobind;

namespace {
using Bytes = nb::ndarray<nb::numpy, uint8_t, nb::c_contig, nb::device::cpu>;
using ConstBytes = nb::ndarray<nb::numpy, const uint8_t, nb::c_contig, nb::device::cpu>;  // read-only ok

zipccl::DtypeCode check_dtype(int code) {
  if (code < 1 || code > 3) throw nb::value_error("dtype_code must be 1 (bf16), 2 (fp16) or 3 (fp32)");
  return (zipccl::DtypeCode)code;
}

// Size arguments from Python are checked before any layout arithmetic: an n or a
// capacity near 2^64 would otherwise wrap the offsets (and a buffer check that
// passes on a wrapped size lets the codec write out of bounds).
zipccl::Layout checked_layout(const char* fn, zipccl::DtypeCode d, uint64_t n, uint64_t capacity) {
  zipccl::Layout l;
  if (!zipccl::layout_checked(d, n, capacity, &l))
    throw nb::value_error((std::string(fn) + ": n must be <= 2^56 and capacity <= 2^62, got n=" +
                           std::to_string(n) + " capacity=" + std::to_string(capacity))
                              .c_str());
  return l;
}

void check_row_elems(const char* fn, uint64_t n) {
  if (n >= zipccl::handler::kMaxRowElems)
    throw nb::value_error((std::string(fn) + ": n must be < 2^32, got " + std::to_string(n)).c_str());
}

template <typename T>
nb::capsule encapsulate(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}
}  // namespace

NB_MODULE(_zipccl_cpu, m) {
  m.def("registrations", []() {
    nb::dict d;
    d[zipccl::handler::kEncodeTarget] = encapsulate(ZipcclEncodeCpu);
    d[zipccl::handler::kDecodeTarget] = encapsulate(ZipcclDecodeCpu);
    d["zipccl_entropy_encode"] = encapsulate(ZipcclEntropyEncodeCpu);
    d["zipccl_entropy_decode"] = encapsulate(ZipcclEntropyDecodeCpu);
    d[zipccl::transport::kRowPrefixTarget] = encapsulate(ZipcclRowPrefixCpu);
    d[zipccl::transport::kRowSplitTarget] = encapsulate(ZipcclRowSplitCpu);
    d[zipccl::transport::kRowJoinTarget] = encapsulate(ZipcclRowJoinCpu);
    d[zipccl::transport::kUsedMaxTarget] = encapsulate(ZipcclUsedMaxCpu);
    d[zipccl::transport::kAgreeTarget] = encapsulate(ZipcclAgreeCpu);
    d[zipccl::transport::kBitcastCopyTarget] = encapsulate(ZipcclBitcastCopyCpu);
    d[zipccl::transport::kRowUnpackTarget] = encapsulate(ZipcclRowUnpackCpu);
    d[zipccl::transport::kRowPackTarget] = encapsulate(ZipcclRowPackCpu);
    d[zipccl::segments::kEncodeTarget] = encapsulate(ZipcclSegmentsEncodeCpu);
    d[zipccl::segments::kDecodeTarget] = encapsulate(ZipcclSegmentsDecodeCpu);
    d[zipccl::transport::kRowSumTarget] = encapsulate(ZipcclRowSumCpu);
    d[zipccl::mailbox::kMailboxTarget] = encapsulate(ZipcclMailboxCpu);
    return d;
  });
  m.def(
      "mailbox_take", [](int64_t ledger) { return zipccl::mailbox::take(ledger); }, nb::arg("ledger"),
      "The planned transport's mailbox table of `ledger` (-1: never recorded), emptied (ffi/mailbox.h).");
  m.attr("ENCODE_TARGET") = zipccl::handler::kEncodeTarget;
  m.attr("DECODE_TARGET") = zipccl::handler::kDecodeTarget;
  // The static-size contract (mirrored by zipccl_jax/_src/codec.py, tested to agree).
  m.def(
      "max_nbytes",
      [](int dtype_code, uint64_t n) {
        const zipccl::DtypeCode d = check_dtype(dtype_code);
        checked_layout("max_nbytes", d, n, 0);
        return zipccl::max_nbytes(d, n);
      },
      nb::arg("dtype_code"), nb::arg("n"));
  m.def(
      "min_nbytes",
      [](int dtype_code, uint64_t n) {
        const zipccl::DtypeCode d = check_dtype(dtype_code);
        return checked_layout("min_nbytes", d, n, 0).esc_off;
      },
      nb::arg("dtype_code"), nb::arg("n"));
  m.def(
      "row_nbytes",
      [](int dtype_code, uint64_t n, uint64_t capacity) {
        return checked_layout("row_nbytes", check_dtype(dtype_code), n, capacity).total;
      },
      nb::arg("dtype_code"), nb::arg("n"), nb::arg("capacity"),
      "Bytes of a row buffer with room for `capacity` escapes (encode_into's minimum out size).");
  m.def("workspace_nbytes", [](uint64_t n) { return zipccl::workspace_nbytes(n); }, nb::arg("n"));
  // Direct access to the row codec on host buffers, outside XLA: for tests that need
  // guard bytes, another escape capacity than max_nbytes' or arbitrary (truncated,
  // corrupted) payload lengths, and for timing the codec without XLA's per-call
  // buffer allocation.
  m.def(
      "encode_into",
      [](int dtype_code, ConstBytes x, uint64_t n, uint64_t capacity, Bytes out) {
        const zipccl::DtypeCode d = check_dtype(dtype_code);
        check_row_elems("encode_into", n);
        const uint64_t need = checked_layout("encode_into", d, n, capacity).total;
        if (x.size() != n * (uint64_t)zipccl::elem_bytes_of(d))
          throw nb::value_error("encode_into: x must hold n elements of the dtype");
        if (out.size() < need)
          throw nb::value_error(("encode_into: out must have >= " + std::to_string(need) + " bytes").c_str());
        zipccl::cpu::RowStats s;
        {
          nb::gil_scoped_release release;
          s = zipccl::cpu::encode_row(d, x.data(), n, capacity, out.data());
        }
        return std::make_tuple((int)s.status, (uint64_t)s.escape_count, (uint64_t)s.used_nbytes);
      },
      nb::arg("dtype_code"), nb::arg("x"), nb::arg("n"), nb::arg("capacity"), nb::arg("out"),
      "Encodes into out[:row_nbytes(...)]; returns (status, escape_count, used_nbytes).");
  m.def(
      "decode_into",
      [](int dtype_code, ConstBytes payload, uint64_t n, Bytes out) {
        const zipccl::DtypeCode d = check_dtype(dtype_code);
        check_row_elems("decode_into", n);
        if (out.size() != n * (uint64_t)zipccl::elem_bytes_of(d))
          throw nb::value_error("decode_into: out must hold n elements of the dtype");
        nb::gil_scoped_release release;
        return (int)zipccl::cpu::decode_row(d, payload.data(), payload.size(), n, out.data());
      },
      nb::arg("dtype_code"), nb::arg("payload"), nb::arg("n"), nb::arg("out"),
      "Decodes one row of any length; returns the decoder status (out is all-ones on error).");
  register_entropy(m);
  m.attr("FORMAT_VERSION") = (int)zipccl::kVersion;
  m.attr("BLOCK") = (int)zipccl::kBlock;
}
