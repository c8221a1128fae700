// What the CPU (ffi/window_cpu.cc) and CUDA (cuda/window.cu) XLA FFI handlers of the
// window codec share: the target names, the XLA dtype -> format dtype mapping, and
// the operand/result shape checks. Both handlers bind the same signature (no
// attributes):
//
//   zipccl_zipccl_encode: x [..., n] (bf16/f16/f32), skip u8 [...]
//                         -> payload u8 [..., max_nbytes(n)], stats s32 [..., 4],
//                            workspace u8 [..., workspace_nbytes(n)]
//   zipccl_zipccl_decode: payload u8 [..., L] (any L), skip u8 [...], fill y-dtype [F, n]
//                         -> y [..., n], status s32 [...], workspace u8 [..., workspace_nbytes(n)]
//
// Every leading dimension is a row. `skip` (one byte per row, nonzero = skip) names
// rows the caller does not need coded: a transport's own row, which never leaves
// the device (docs/format.md, "Skipped rows"). The CPU encoder leaves a skipped
// row's payload unwritten (stats all zero); the CPU decoder copies fill row
// r / (R / F) into skipped row r (status 0; F = 0: the row is left unwritten), so
// a gather can keep its own row without coding it. The CUDA handlers check the operands and code every row:
// the transport's own row then decodes to the same bits as fill. The entropy
// codec's handlers (ffi/entropy_cpu.cc, cuda/entropy.cu) bind the same operands.
// Host code only (nvcc compiles it as C++).
#pragma once

#include <stdint.h>

#include <string>
#include <utility>

#include "window_format.h"
#include "xla/ffi/api/ffi.h"

namespace zipccl {
namespace handler {

namespace ffi = ::xla::ffi;

// The FFI target names, for platform "cpu" and "CUDA" alike. The nanobind modules'
// registrations() publish exactly these; Python reads them from there.
constexpr const char* kEncodeTarget = "zipccl_zipccl_encode";
constexpr const char* kDecodeTarget = "zipccl_zipccl_decode";

// stats row: (status, escapes saturated at INT32_MAX, used_units = used_nbytes / 128, 0)
constexpr uint64_t kStatsWidth = 4;
// Rows hold < 2^32 elements: block-table escape offsets are u32.
constexpr uint64_t kMaxRowElems = 1ull << 32;

inline bool dtype_code(ffi::DataType t, DtypeCode* d) {
  switch (t) {
    case ffi::DataType::BF16: *d = kBF16; return true;
    case ffi::DataType::F16: *d = kF16; return true;
    case ffi::DataType::F32: *d = kF32; return true;
    default: return false;
  }
}

// rows = product of all but the last dimension; last = the last dimension (1 for a scalar).
inline void split_dims(ffi::Span<const int64_t> dims, uint64_t* rows, uint64_t* last) {
  uint64_t r = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) r *= (uint64_t)dims[i];
  *rows = r;
  *last = dims.size() == 0 ? 1 : (uint64_t)dims[dims.size() - 1];
}

inline std::string str(uint64_t v) { return std::to_string(v); }

inline ffi::Error invalid(const char* target, const std::string& what) {
  return ffi::Error::InvalidArgument(std::string(target) + ": " + what);
}

// The shape of one call: `rows` rows of n elements of dtype d, payload rows of
// `nbytes` bytes, workspace rows of `ws_row` bytes.
struct Shape {
  DtypeCode d;
  uint64_t rows, n, nbytes, ws_row;
};

inline ffi::Error check_workspace(const char* target, ffi::Span<const int64_t> ws, const Shape& s) {
  uint64_t wrow, wbytes;
  split_dims(ws, &wrow, &wbytes);
  const uint64_t want = workspace_nbytes(s.n);
  if (wrow != s.rows || wbytes != want)
    return invalid(target, "workspace must be [" + str(s.rows) + ", " + str(want) + "] bytes, got [" +
                               str(wrow) + ", " + str(wbytes) + "]");
  return ffi::Error::Success();
}

inline ffi::Error check_row_elems(const char* target, uint64_t n) {
  if (n >= kMaxRowElems) return invalid(target, "rows of >= 2^32 elements are not supported, got " + str(n));
  return ffi::Error::Success();
}

// skip: one byte per row (any shape holding `rows` elements).
inline ffi::Error check_skip(const char* target, size_t skip_count, uint64_t rows) {
  if (skip_count != (size_t)rows)
    return invalid(target, "skip must have one u8 per row (" + str(rows) + "), got " + str(skip_count));
  return ffi::Error::Success();
}

// fill: [..., n] of the output's dtype. Its F rows (product of the leading
// dimensions) divide the `rows` output rows, and skipped row r takes fill row
// r / (rows / F); or F = 0: skipped rows are left unwritten. Sets *group =
// rows / F (0 when F = 0).
inline ffi::Error check_fill(const char* target, ffi::DataType ft, ffi::DataType yt, ffi::Span<const int64_t> fill,
                             uint64_t rows, uint64_t n, uint64_t* group) {
  uint64_t frows, fn;
  split_dims(fill, &frows, &fn);
  if (ft != yt) return invalid(target, "fill must have the output's dtype");
  if (fn != n || (frows != 0 && rows % frows != 0))
    return invalid(target, "fill must be [F, " + str(n) + "] with F = 0 or F dividing the " + str(rows) +
                               " output rows, got [" + str(frows) + ", " + str(fn) + "]");
  *group = frows ? rows / frows : 0;
  return ffi::Error::Success();
}

// zipccl_zipccl_encode's operands and results.
inline ffi::Error check_encode(ffi::DataType xt, ffi::Span<const int64_t> x, ffi::Span<const int64_t> payload,
                               ffi::Span<const int64_t> stats, ffi::Span<const int64_t> ws, Shape* s) {
  const char* t = kEncodeTarget;
  if (!dtype_code(xt, &s->d)) return invalid(t, "x must be bfloat16, float16 or float32");
  split_dims(x, &s->rows, &s->n);
  if (ffi::Error e = check_row_elems(t, s->n); e.failure()) return e;
  uint64_t prow, srow, width;
  split_dims(payload, &prow, &s->nbytes);
  split_dims(stats, &srow, &width);
  const uint64_t want = max_nbytes(s->d, s->n);
  if (prow != s->rows || s->nbytes != want)
    return invalid(t, "payload must be [" + str(s->rows) + ", " + str(want) + "] bytes (max_nbytes), got [" +
                          str(prow) + ", " + str(s->nbytes) + "]");
  if (srow != s->rows || width != kStatsWidth)
    return invalid(t, "stats must be [" + str(s->rows) + ", " + str(kStatsWidth) + "], got [" + str(srow) + ", " +
                          str(width) + "]");
  s->ws_row = workspace_nbytes(s->n);
  return check_workspace(t, ws, *s);
}

// zipccl_zipccl_decode's operands and results (the payload's row length L is free).
inline ffi::Error check_decode(ffi::Span<const int64_t> payload, ffi::DataType yt, ffi::Span<const int64_t> y,
                               size_t status_count, ffi::Span<const int64_t> ws, Shape* s) {
  const char* t = kDecodeTarget;
  if (!dtype_code(yt, &s->d)) return invalid(t, "output must be bfloat16, float16 or float32");
  uint64_t yrows;
  split_dims(payload, &s->rows, &s->nbytes);
  split_dims(y, &yrows, &s->n);
  if (yrows != s->rows)
    return invalid(t, "payload has " + str(s->rows) + " rows but the output has " + str(yrows));
  if (status_count != (size_t)s->rows) return invalid(t, "status must have one entry per row");
  if (ffi::Error e = check_row_elems(t, s->n); e.failure()) return e;
  s->ws_row = workspace_nbytes(s->n);
  return check_workspace(t, ws, *s);
}

// The codec handler signatures, the one binding every codec (window, entropy) uses on
// every platform. `b` is ffi::Ffi::Bind() on the CPU, or Bind() with the stream
// context first on CUDA; the operands follow in this order (no attributes):
//   encode: x [..., n], skip u8 [...] -> payload u8 [..., max_nbytes], stats s32 [..., 4],
//           workspace u8 [..., W]
//   decode: payload u8 [..., L], skip u8 [...], fill [F, n] -> y [..., n], status s32 [...],
//           workspace u8 [..., W]
template <typename B>
auto bind_encode(B b) {
  return std::move(b).template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::Buffer<ffi::U8>>()
      .template Ret<ffi::Buffer<ffi::U8>>()
      .template Ret<ffi::Buffer<ffi::S32>>()
      .template Ret<ffi::Buffer<ffi::U8>>();
}
template <typename B>
auto bind_decode(B b) {
  return std::move(b).template Arg<ffi::Buffer<ffi::U8>>()
      .template Arg<ffi::Buffer<ffi::U8>>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::Buffer<ffi::S32>>()
      .template Ret<ffi::Buffer<ffi::U8>>();
}

}  // namespace handler
}  // namespace zipccl
