// The slot ladder's transport helpers: XLA FFI targets "zipccl_row_prefix",
// "zipccl_row_split", "zipccl_row_join", "zipccl_used_max", "zipccl_agree" and
// "zipccl_bitcast_copy", what their CPU (ffi/transport_cpu.cc) and CUDA
// (cuda/transport.cu) handlers share.
//
//   zipccl_row_prefix: payload u8 [..., L] -> slot u8 [..., S], S <= L:
//                      slot[r, :] = payload[r, :S] for every row r
//   zipccl_row_split:  payload u8 [N, L], me s32 [] -> N - 1 results u8 [S], S <= L:
//                      result k - 1 = payload[(me + k) mod N, :S], k = 1 .. N - 1
//   zipccl_row_join:   payload u8 [N, L], me s32 [], N - 1 operands u8 [S]
//                      -> out u8 [N, S]: out[(me - k) mod N, :] = operand k - 1,
//                      out[me, :] = payload[me, :S]
//   zipccl_used_max:   stats s32 [..., 4] (an encoder's) -> s32 []: max(0, the largest
//                      stats[r, 2]) (used size, units of 128 bytes) over the rows r:
//                      0 when there are none (used sizes are >= 1)
//   zipccl_agree:      every s32 [N, W] (W >= 2: one row per participant, gathered),
//                      attributes units s32 [K] ascending, where (string)
//                      -> s32 [3] = (agreed, count, rung): agreed = the largest
//                      every[:, 0] (used size, units of 128 bytes), count = the sum of
//                      every[:, 1] (saturated at INT32_MAX), rung = the number of
//                      units[k] < agreed (the first rung that holds `agreed` units;
//                      K = the raw rung). Columns 2 .. W - 1 are the plan fingerprint
//                      (kFingerprintFields, in that order): every participant must
//                      hold the same values. When they differ the CPU handler fails
//                      the call with an error naming `where` and the fields that
//                      differ; the CUDA handler (which cannot raise without a host
//                      round trip) returns rung = K + 1, a branch that moves nothing
//                      and fills the rows with all-one bits and a nonzero status.
//   zipccl_bitcast_copy: x [...] of any type -> y [...] of any type with the same
//                      byte size: y's bytes = x's bytes (a same-width
//                      bitcast_convert, e.g. bf16 words <-> u16 words)
//   zipccl_row_unpack: x [..., T] of any type -> K results y_k [..., w_k] of x's
//                      element size, the same leading dimensions, sum w_k <= T:
//                      y_k[r, :] = x[r, o_k : o_k + w_k], o_k = w_0 + .. + w_(k-1)
//                      (a bucket's rows cut back into its leaves' rows)
//   zipccl_row_pack:   K >= 1 operands x_k [..., w_k] of one element size and the
//                      same leading dimensions -> y [..., T], T = sum w_k, of
//                      x_0's type: y[r, o_k : o_k + w_k] = x_k[r, :] (row_unpack's
//                      inverse: leaves' rows side by side, as bytes, so that no
//                      NaN payload is canonicalised; CPU only)
//   zipccl_row_sum:    x [..., N, M] bf16 / f16 / f32, N >= 1 -> y f32 [..., M]:
//                      y[b, j] = (..((v(x[b,0,j]) + v(x[b,1,j])) + v(x[b,2,j])) ..)
//                      + v(x[b,N-1,j]): float32 adds in row order (round to
//                      nearest even; NaN operands as x86's SSE add: the partial
//                      sum's NaN, else v's, quieted; inf - inf = 0xffc00000),
//                      v = the exact widening to float32; the
//                      widened values that enter an add and every partial sum
//                      have subnormals flushed to zero of the same sign, as
//                      XLA:CPU's float math does (N = 1: y = v(x[b,0,j]), no add,
//                      nothing flushed; f16 subnormals widen to normal floats); an f16
//                      NaN widens quieted (bit 22 set), as x86's F16C does
//                      (the ordered sum of a reduction: rounding to the input
//                      dtype is the caller's XLA convert)
//
// zipccl_jax/_src/transport.py calls them on CPU backends and slices / uses
// lax.all_to_all on others. row_split and row_join make an all-to-all of slot-sized
// rows out of N - 1 collective permutes (shift k: device j sends its row for peer
// (j + k) mod N): split cuts the rows to send, join puts the received rows and the
// own row back in peer order, so join(permutes(split(p))) is exactly
// all_to_all(p[:, :S]). XLA:CPU would compile the all-to-all into N per-peer slice
// kernels plus a concatenate per ladder rung; custom calls compile to nothing.
// row_unpack cuts a bucket (many leaves packed along the last axis) back into its
// leaves: as XLA slices each leaf is a kernel of its own for XLA:CPU to compile
// (~6 ms each: a 200-leaf bucket's unpacking compiled in 1.2 s), as one custom call
// none.
// row_sum is the reductions' ordered sum: as XLA ops, N slices, N converts and
// N - 1 adds per call for XLA to trace, optimise and fuse (a 200-leaf psum spent
// ~1.5 s of its compile time there), as one custom call nothing.
// used_max, agree and bitcast_copy are the ladder's small fixed steps (the used
// size before the agreement, the rung after it, the raw rung's views): as XLA ops,
// each is an LLVM kernel for XLA:CPU to compile (5-9 ms each, distinct kernels),
// as custom calls none.
// The CUDA handlers exist so that a program lowered for CPU and GPU at once compiles
// everywhere. `me` is this device's linear index over the collective's axes.
#pragma once

#include <stdint.h>
#include <string.h>

#include "handler_common.h"
#include "xla/ffi/api/ffi.h"

namespace zipccl {
namespace transport {

constexpr const char* kRowPrefixTarget = "zipccl_row_prefix";
constexpr const char* kRowSplitTarget = "zipccl_row_split";
constexpr const char* kRowJoinTarget = "zipccl_row_join";
constexpr const char* kUsedMaxTarget = "zipccl_used_max";
constexpr const char* kAgreeTarget = "zipccl_agree";
constexpr const char* kBitcastCopyTarget = "zipccl_bitcast_copy";
constexpr const char* kRowUnpackTarget = "zipccl_row_unpack";
constexpr const char* kRowPackTarget = "zipccl_row_pack";
constexpr const char* kRowSumTarget = "zipccl_row_sum";
// agree: at most this many rungs (the ladder has <= 32 + 4; the CUDA kernel
// takes them by value).
constexpr uint64_t kMaxRungs = 256;

// Checks the shapes; sets rows, the payload row length and the slot length (bytes).
inline xla::ffi::Error row_prefix_shape(xla::ffi::Span<const int64_t> in, xla::ffi::Span<const int64_t> out,
                                        uint64_t* rows, uint64_t* len, uint64_t* slen) {
  uint64_t srows;
  handler::split_dims(in, rows, len);
  handler::split_dims(out, &srows, slen);
  if (in.size() != out.size() || srows != *rows || *slen > *len)
    return handler::invalid(kRowPrefixTarget, "slot must be [" + handler::str(*rows) + ", S] with S <= " +
                                                  handler::str(*len) + ", got [" + handler::str(srows) + ", " +
                                                  handler::str(*slen) + "]");
  return xla::ffi::Error::Success();
}

// row_split / row_join: payload [N, L] with N >= 2 (one row per peer) and N - 1
// pieces (results of split, operands of join); sets N and L.
inline xla::ffi::Error peer_rows_shape(const char* target, xla::ffi::Span<const int64_t> payload, size_t pieces,
                                       uint64_t* peers, uint64_t* len) {
  if (payload.size() != 2)
    return handler::invalid(target, "payload must be u8 [N, L] (one row per peer), got rank " +
                                        handler::str(payload.size()));
  *peers = (uint64_t)payload[0];
  *len = (uint64_t)payload[1];
  if (*peers < 2)
    return handler::invalid(target, "payload must have N >= 2 rows (peers), got " + handler::str(*peers));
  if (pieces != *peers - 1)
    return handler::invalid(target, "expected N - 1 = " + handler::str(*peers - 1) + " rows u8 [S], got " +
                                        handler::str(pieces));
  return xla::ffi::Error::Success();
}

// Piece k (0-based) of row_split / row_join: u8 [S] with S <= L, the same S for
// every piece (*slen is set from piece 0). `what` names pieces in messages.
inline xla::ffi::Error piece_shape(const char* target, const char* what, size_t k,
                                   xla::ffi::Span<const int64_t> dims, uint64_t len, uint64_t* slen) {
  if (dims.size() != 1)
    return handler::invalid(target, std::string(what) + " " + handler::str(k) + " must be u8 [S], got rank " +
                                        handler::str(dims.size()));
  const uint64_t s = (uint64_t)dims[0];
  if (k == 0) {
    if (s > len)
      return handler::invalid(target, std::string(what) + " 0 must be u8 [S] with S <= " + handler::str(len) +
                                          ", got [" + handler::str(s) + "]");
    *slen = s;
  } else if (s != *slen) {
    return handler::invalid(target, std::string(what) + " " + handler::str(k) + " must be u8 [" +
                                        handler::str(*slen) + "] like " + what + " 0, got [" + handler::str(s) +
                                        "]");
  }
  return xla::ffi::Error::Success();
}

// The N - 1 pieces of row_split (its results, ffi::RemainingRets) or row_join (its
// operands, ffi::RemainingArgs), each by piece_shape; *slen is set from piece 0.
inline xla::ffi::Span<const int64_t> piece_dims(const xla::ffi::Buffer<xla::ffi::U8>& b) {
  return b.dimensions();
}
inline xla::ffi::Span<const int64_t> piece_dims(xla::ffi::Result<xla::ffi::Buffer<xla::ffi::U8>>& b) {
  return b->dimensions();
}
template <class Pieces>
inline xla::ffi::Error pieces_shape(const char* target, const char* what, const Pieces& pieces, uint64_t len,
                                    uint64_t* slen) {
  for (size_t k = 0; k < pieces.size(); ++k) {
    auto p = pieces.template get<xla::ffi::Buffer<xla::ffi::U8>>(k);
    if (!p.has_value()) return handler::invalid(target, std::string(what) + " " + handler::str(k) + " must be u8");
    if (xla::ffi::Error e = piece_shape(target, what, k, piece_dims(*p), len, slen); e.failure()) return e;
  }
  return xla::ffi::Error::Success();
}

// me: one s32 element (checked against N on the host; the CUDA handlers, which
// cannot read it without a synchronisation, write zeros when it is out of range).
inline xla::ffi::Error me_shape(const char* target, size_t count) {
  if (count != 1) return handler::invalid(target, "me must be one s32 (this device's index), got " +
                                                      handler::str(count) + " elements");
  return xla::ffi::Error::Success();
}

inline xla::ffi::Error me_value(const char* target, int32_t me, uint64_t peers) {
  if (me < 0 || (uint64_t)me >= peers)
    return handler::invalid(target, "me must be in [0, " + handler::str(peers) + "), got " +
                                        std::to_string(me));
  return xla::ffi::Error::Success();
}

// join's output: u8 [N, S].
inline xla::ffi::Error join_out_shape(xla::ffi::Span<const int64_t> out, uint64_t peers, uint64_t slen) {
  if (out.size() != 2 || (uint64_t)out[0] != peers || (uint64_t)out[1] != slen) {
    std::string got = "rank " + handler::str(out.size());
    if (out.size() == 2) got = "[" + handler::str((uint64_t)out[0]) + ", " + handler::str((uint64_t)out[1]) + "]";
    return handler::invalid(kRowJoinTarget, "out must be u8 [" + handler::str(peers) + ", " + handler::str(slen) +
                                                "], got " + got);
  }
  return xla::ffi::Error::Success();
}

// Every shape of a row_split / row_join call (payload u8 [N, L], one s32 me, the N - 1
// pieces u8 [S]), before anything is written: sets *peers = N, *len = L, *slen = S.
template <class Pieces>
inline xla::ffi::Error split_join_shapes(const char* target, const char* what,
                                         xla::ffi::Span<const int64_t> payload, size_t me_count,
                                         const Pieces& pieces, uint64_t* peers, uint64_t* len, uint64_t* slen) {
  *slen = 0;
  if (xla::ffi::Error e = peer_rows_shape(target, payload, pieces.size(), peers, len); e.failure()) return e;
  if (xla::ffi::Error e = me_shape(target, me_count); e.failure()) return e;
  return pieces_shape(target, what, pieces, *len, slen);
}

// used_max: stats s32 [..., 4] with rank >= 1 (an encoder's stats rows); sets the
// row count. The result must be one s32.
inline xla::ffi::Error used_max_shape(xla::ffi::Span<const int64_t> stats, size_t out_count, uint64_t* rows) {
  uint64_t width;
  handler::split_dims(stats, rows, &width);
  if (stats.size() == 0 || width != handler::kStatsWidth)
    return handler::invalid(kUsedMaxTarget, "stats must be s32 [..., 4] (an encoder's stats rows), got " +
                                                (stats.size() ? "last dimension " + handler::str(width)
                                                              : std::string("a scalar")));
  if (out_count != 1)
    return handler::invalid(kUsedMaxTarget, "out must be one s32, got " + handler::str(out_count) + " elements");
  return xla::ffi::Error::Success();
}

// agree: the fingerprint fields of columns 2 .. W - 1 (zipccl_jax/_src/transport.py
// `fingerprint` computes them in this order).
constexpr const char* kFingerprintFields[] = {"codec and format version", "slot ladder", "chunking",
                                              "collective, dtype, row shape and check_decode"};
constexpr uint64_t kFingerprintCount = sizeof(kFingerprintFields) / sizeof(kFingerprintFields[0]);

// agree: every s32 [N, W] with N >= 1, 2 <= W <= 2 + kFingerprintCount; out s32 [3];
// 1..kMaxRungs strictly ascending units.
inline xla::ffi::Error agree_shape(xla::ffi::Span<const int64_t> every, size_t out_count,
                                   xla::ffi::Span<const int32_t> units, uint64_t* rows, uint64_t* width) {
  if (every.size() != 2 || every[0] < 1 || every[1] < 2 || (uint64_t)every[1] > 2 + kFingerprintCount)
    return handler::invalid(kAgreeTarget, "every must be s32 [N, W] with N >= 1 and 2 <= W <= " +
                                              handler::str(2 + kFingerprintCount) + ", got rank " +
                                              handler::str(every.size()));
  if (out_count != 3)
    return handler::invalid(kAgreeTarget, "out must be s32 [3], got " + handler::str(out_count) + " elements");
  if (units.size() == 0 || units.size() > kMaxRungs)
    return handler::invalid(kAgreeTarget, "units must hold 1.." + handler::str(kMaxRungs) +
                                              " rung sizes, got " + handler::str(units.size()));
  for (size_t k = 1; k < units.size(); ++k)
    if (units[k] <= units[k - 1])
      return handler::invalid(kAgreeTarget, "units must ascend strictly, got units[" + handler::str(k - 1) +
                                                "] = " + std::to_string(units[k - 1]) + " >= units[" +
                                                handler::str(k) + "] = " + std::to_string(units[k]));
  *rows = (uint64_t)every[0];
  *width = (uint64_t)every[1];
  return xla::ffi::Error::Success();
}

// The rung: how many rungs are too small for `agreed` units (K = the raw rung).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int32_t rung_of(int32_t agreed, const int32_t* units, uint64_t count) {
  int32_t k = 0;
  for (uint64_t i = 0; i < count; ++i) k += agreed > units[i];
  return k;
}

// The agreement of rows every[rows, width]: out = (agreed, count, rung); returns a
// bit mask of the fingerprint fields that differ between rows (0: the plans agree).
// __host__ __device__ so that the CPU and CUDA handlers share it.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline uint32_t agree_rows(const int32_t* every, uint64_t rows, uint64_t width, const int32_t* units,
                           uint64_t n_units, int32_t* out) {
  int32_t agreed = 0;
  int64_t count = 0;
  uint32_t differ = 0;
  for (uint64_t r = 0; r < rows; ++r) {
    const int32_t* row = every + r * width;
    agreed = row[0] > agreed ? row[0] : agreed;
    count += row[1] > 0 ? row[1] : 0;
    for (uint64_t f = 2; f < width; ++f) differ |= (row[f] != every[f] ? 1u : 0u) << (f - 2);
  }
  out[0] = agreed;
  out[1] = count > INT32_MAX ? INT32_MAX : (int32_t)count;
  out[2] = differ ? (int32_t)n_units + 1 : rung_of(agreed, units, n_units);
  return differ;
}

// bitcast_copy: the same number of bytes in and out.
inline xla::ffi::Error bitcast_copy_shape(size_t in_bytes, size_t out_bytes) {
  if (in_bytes != out_bytes)
    return handler::invalid(kBitcastCopyTarget, "y must have x's byte size " + handler::str(in_bytes) + ", got " +
                                                    handler::str(out_bytes) + " bytes");
  return xla::ffi::Error::Success();
}

// row_unpack: x [..., T], results [..., w_k] with x's leading dimensions and element
// size, sum w_k <= T; sets rows (the product of the leading dimensions) and T.
template <typename Rets>
inline xla::ffi::Error unpack_shapes(xla::ffi::Span<const int64_t> x, size_t elem_bytes, const Rets& pieces,
                                     uint64_t* rows, uint64_t* total) {
  handler::split_dims(x, rows, total);
  if (x.size() == 0) return handler::invalid(kRowUnpackTarget, "x must have at least one dimension");
  uint64_t sum = 0;
  for (size_t k = 0; k < pieces.size(); ++k) {
    auto y = pieces.template get<xla::ffi::AnyBuffer>(k);
    if (y.has_error()) return handler::invalid(kRowUnpackTarget, "result " + handler::str(k) + " is not a buffer");
    auto dims = (*y)->dimensions();
    bool same = dims.size() == x.size() && xla::ffi::ByteWidth((*y)->element_type()) == elem_bytes;
    for (size_t i = 0; same && i + 1 < dims.size(); ++i) same = dims[i] == x[i];
    if (!same)
      return handler::invalid(kRowUnpackTarget, "result " + handler::str(k) +
                                                    " must have x's leading dimensions and element size");
    sum += (uint64_t)dims[dims.size() - 1];
  }
  if (sum > *total)
    return handler::invalid(kRowUnpackTarget, "the results' widths add up to " + handler::str(sum) +
                                                  ", more than x's last dimension " + handler::str(*total));
  return xla::ffi::Error::Success();
}

// row_sum: x [..., N, M] of bf16 / f16 / f32 with N >= 1, y f32 [..., M] with x's
// leading dimensions; sets batch (the product of the leading dimensions), N and M.
inline xla::ffi::Error row_sum_shapes(xla::ffi::DataType xt, xla::ffi::Span<const int64_t> x,
                                      xla::ffi::Span<const int64_t> y, uint64_t* batch, uint64_t* n,
                                      uint64_t* m) {
  using xla::ffi::DataType;
  if (xt != DataType::BF16 && xt != DataType::F16 && xt != DataType::F32)
    return handler::invalid(kRowSumTarget, "x must be bfloat16, float16 or float32");
  if (x.size() < 2) return handler::invalid(kRowSumTarget, "x must be [..., N, M], got rank " + handler::str(x.size()));
  *n = (uint64_t)x[x.size() - 2];
  *m = (uint64_t)x[x.size() - 1];
  if (*n < 1) return handler::invalid(kRowSumTarget, "x must have N >= 1 rows to sum");
  bool same = y.size() + 1 == x.size() && (uint64_t)y[y.size() - 1] == *m;
  *batch = 1;
  for (size_t i = 0; i + 2 < x.size(); ++i) {
    same = same && y[i] == x[i];
    *batch *= (uint64_t)x[i];
  }
  if (!same) return handler::invalid(kRowSumTarget, "y must be float32 [..., M]: x's shape without its N axis");
  return xla::ffi::Error::Success();
}

// row_sum's widening to float32 and flush (bit layouts: bf16 s|e8|m7, f16 s|e5|m10,
// f32 s|e8|m23), for the CPU and CUDA handlers alike.
#if defined(__CUDACC__)
#define ZIPCCL_HD __host__ __device__
#else
#define ZIPCCL_HD
#endif
ZIPCCL_HD inline uint32_t flush_subnormal(uint32_t f) { return (f & 0x7f800000u) ? f : (f & 0x80000000u); }
// One add of the ordered sum, as x86's SSE add computes it whatever operand order a
// compiler picks: a NaN operand propagates quieted, the partial sum's first; a NaN
// from other operands (inf - inf) is the default NaN 0xffc00000; a subnormal sum
// flushes. sum: the float32 sum of acc and v (round to nearest even).
ZIPCCL_HD inline uint32_t ordered_add(uint32_t acc, uint32_t v, uint32_t sum) {
  // selects, no branches: the CPU loop vectorizes
  const bool acc_nan = (acc & 0x7fffffffu) > 0x7f800000u, v_nan = (v & 0x7fffffffu) > 0x7f800000u;
  const bool sum_nan = (sum & 0x7fffffffu) > 0x7f800000u;
  const uint32_t r = sum_nan ? 0xffc00000u : flush_subnormal(sum);
  const uint32_t nan = (acc_nan ? acc : v) | 0x00400000u;
  return (acc_nan | v_nan) ? nan : r;
}
ZIPCCL_HD inline uint32_t widen_f32(uint32_t w) { return w; }
ZIPCCL_HD inline uint32_t widen_bf16(uint16_t h) { return (uint32_t)h << 16; }
ZIPCCL_HD inline uint32_t widen_f16(uint16_t h) {
  // selects, no branches (vectorizes); a subnormal is mant x 2^-24, exact in float32
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  const float sub_f = (float)mant * 5.9604644775390625e-08f;   // 2^-24
  uint32_t sub;
  memcpy(&sub, &sub_f, 4);
  const uint32_t inf_nan = sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u);
  const uint32_t normal = sign | ((e + 112u) << 23) | (mant << 13);
  return e == 0x1fu ? inf_nan : (e ? normal : (sign | sub));
}
#undef ZIPCCL_HD

}  // namespace transport
}  // namespace zipccl

XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclRowPrefixCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclRowSplitCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclRowJoinCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclUsedMaxCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclAgreeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclBitcastCopyCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclRowUnpackCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclRowSumCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclRowPackCpu);
