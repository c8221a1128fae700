// The slot ladder's row copies on the CPU (targets and shapes: transport.h).
//
// Why a custom call for what `payload[:, :S]` also does: every rung of the ladder is
// a switch branch that needs its own slot-sized operand for the collective, and
// XLA:CPU compiles each such slice into its own LLVM kernel, ~15 ms of compile time
// a rung (benchmarks/ladder.py: an all-gather ladder compiled 2.6x slower than one
// rung). A custom call is a runtime call with no code generation; the copy it makes
// is the one the slice made.
#include <stdint.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>

#include "cpu_parallel.h"
#include "transport.h"

namespace ffi = xla::ffi;

namespace {

// The row-prefix copy (zipccl_row_prefix).
ffi::Error RowPrefixCpuImpl(ffi::Buffer<ffi::U8> payload, ffi::Result<ffi::Buffer<ffi::U8>> slot) {
  uint64_t rows, len, slen;
  if (ffi::Error e = zipccl::transport::row_prefix_shape(payload.dimensions(), slot->dimensions(), &rows,
                                                         &len, &slen);
      e.failure())
    return e;
  const uint8_t* in = payload.typed_data();
  uint8_t* out = slot->typed_data();
  if (slen == len) {
    std::memcpy(out, in, rows * len);
  } else {
    for (uint64_t r = 0; r < rows; ++r) std::memcpy(out + r * slen, in + r * len, slen);
  }
  return ffi::Error::Success();
}

// An all-to-all rung as N - 1 collective permutes (zipccl_row_split, zipccl_row_join):
// why custom calls, see row_prefix above; an XLA:CPU all-to-all of an array is N
// per-peer slice kernels and a concatenate, ~10 kernels to compile per rung.
ffi::Error RowSplitCpuImpl(ffi::Buffer<ffi::U8> payload, ffi::Buffer<ffi::S32> me, ffi::RemainingRets pieces) {
  namespace zt = zipccl::transport;
  const char* t = zt::kRowSplitTarget;
  uint64_t peers, len, slen;
  // Every shape first: nothing is written unless the whole call is valid.
  if (ffi::Error e = zt::split_join_shapes(t, "result", payload.dimensions(), me.element_count(), pieces,
                                           &peers, &len, &slen);
      e.failure())
    return e;
  const int32_t my = *me.typed_data();
  if (ffi::Error e = zt::me_value(t, my, peers); e.failure()) return e;
  const uint8_t* in = payload.typed_data();
  for (uint64_t k = 1; k < peers; ++k) {
    uint8_t* out = (*pieces.get<ffi::Buffer<ffi::U8>>(k - 1))->typed_data();
    if (slen) std::memcpy(out, in + ((uint64_t)my + k) % peers * len, slen);
  }
  return ffi::Error::Success();
}

ffi::Error RowJoinCpuImpl(ffi::Buffer<ffi::U8> payload, ffi::Buffer<ffi::S32> me, ffi::RemainingArgs pieces,
                          ffi::Result<ffi::Buffer<ffi::U8>> out) {
  namespace zt = zipccl::transport;
  const char* t = zt::kRowJoinTarget;
  uint64_t peers, len, slen;
  if (ffi::Error e = zt::split_join_shapes(t, "operand", payload.dimensions(), me.element_count(), pieces,
                                           &peers, &len, &slen);
      e.failure())
    return e;
  const int32_t my = *me.typed_data();
  if (ffi::Error e = zt::me_value(t, my, peers); e.failure()) return e;
  if (ffi::Error e = zt::join_out_shape(out->dimensions(), peers, slen); e.failure()) return e;
  if (slen == 0) return ffi::Error::Success();
  uint8_t* dst = out->typed_data();
  // piece k - 1 came from peer (me - k) mod N; the own row is the payload's
  std::memcpy(dst + (uint64_t)my * slen, payload.typed_data() + (uint64_t)my * len, slen);
  for (uint64_t k = 1; k < peers; ++k) {
    const uint64_t from = ((uint64_t)my + peers - k) % peers;
    std::memcpy(dst + from * slen, pieces.get<ffi::Buffer<ffi::U8>>(k - 1)->typed_data(), slen);
  }
  return ffi::Error::Success();
}

// The ladder's fixed steps (zipccl_used_max, zipccl_agree, zipccl_bitcast_copy):
// why custom calls, see ffi/transport.h.
ffi::Error UsedMaxCpuImpl(ffi::Buffer<ffi::S32> stats, ffi::Result<ffi::Buffer<ffi::S32>> out) {
  uint64_t rows;
  if (ffi::Error e = zipccl::transport::used_max_shape(stats.dimensions(), out->element_count(), &rows);
      e.failure())
    return e;
  const int32_t* st = stats.typed_data();
  int32_t used = 0;
  for (uint64_t r = 0; r < rows; ++r) used = std::max(used, st[r * zipccl::handler::kStatsWidth + 2]);
  *out->typed_data() = used;
  return ffi::Error::Success();
}

ffi::Error AgreeCpuImpl(ffi::Buffer<ffi::S32> every, ffi::Result<ffi::Buffer<ffi::S32>> out,
                        ffi::Span<const int32_t> units, std::string_view where) {
  namespace zt = zipccl::transport;
  uint64_t rows, width;
  if (ffi::Error e = zt::agree_shape(every.dimensions(), out->element_count(), units, &rows, &width); e.failure())
    return e;
  const int32_t* ev = every.typed_data();
  const uint32_t differ = zt::agree_rows(ev, rows, width, units.begin(), units.size(), out->typed_data());
  if (!differ) return ffi::Error::Success();
  // The participants planned different transports for this call: nothing has moved
  // yet, and every participant sees the same gathered rows, so each one fails here.
  std::string what;
  for (uint64_t f = 0; f < zt::kFingerprintCount; ++f)
    if (differ >> f & 1) what += std::string(what.empty() ? "" : ", ") + zt::kFingerprintFields[f];
  return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                    "zipccl_jax: the participants of " + std::string(where) +
                        " planned different compressed transports (they differ in: " + what +
                        "); no bytes were moved. Every process must call it with the same codec, "
                        "chunks and options and hold the same calibration and ZIPCCL_* settings "
                        "(zipccl_jax.calibration check: docs/sharp-bits.md, \"Processes configured alike\").");
}

ffi::Error BitcastCopyCpuImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  if (ffi::Error e = zipccl::transport::bitcast_copy_shape(x.size_bytes(), y->size_bytes()); e.failure())
    return e;
  if (x.size_bytes()) std::memcpy(y->untyped_data(), x.untyped_data(), x.size_bytes());
  return ffi::Error::Success();
}

// A bucket cut back into its leaves (zipccl_row_unpack): why a custom call, see
// ffi/transport.h.
ffi::Error RowUnpackCpuImpl(ffi::AnyBuffer x, ffi::RemainingRets pieces) {
  const size_t es = ffi::ByteWidth(x.element_type());
  uint64_t rows, total;
  if (ffi::Error e = zipccl::transport::unpack_shapes(x.dimensions(), es, pieces, &rows, &total); e.failure())
    return e;
  const uint8_t* in = static_cast<const uint8_t*>(x.untyped_data());
  uint64_t off = 0;
  for (size_t k = 0; k < pieces.size(); ++k) {
    ffi::AnyBuffer y = **pieces.get<ffi::AnyBuffer>(k);
    const uint64_t w = (uint64_t)y.dimensions()[y.dimensions().size() - 1];
    uint8_t* out = static_cast<uint8_t*>(y.untyped_data());
    if (w)
      for (uint64_t r = 0; r < rows; ++r) std::memcpy(out + r * w * es, in + (r * total + off) * es, w * es);
    off += w;
  }
  return ffi::Error::Success();
}

// Leaves' rows side by side (zipccl_row_pack, ffi/transport.h).
ffi::Error RowPackCpuImpl(ffi::RemainingArgs xs, ffi::Result<ffi::AnyBuffer> y) {
  const char* t = zipccl::transport::kRowPackTarget;
  const size_t es = ffi::ByteWidth(y->element_type());
  uint64_t rows, total;
  zipccl::handler::split_dims(y->dimensions(), &rows, &total);
  if (y->dimensions().size() == 0 || xs.size() == 0)
    return zipccl::handler::invalid(t, "expected at least one operand and a result with a row axis");
  uint64_t sum = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    auto x = xs.get<ffi::AnyBuffer>(k);
    if (x.has_error()) return zipccl::handler::invalid(t, "operand " + zipccl::handler::str(k) + " is not a buffer");
    uint64_t r, w;
    zipccl::handler::split_dims(x->dimensions(), &r, &w);
    if (x->dimensions().size() != y->dimensions().size() || r != rows || ffi::ByteWidth(x->element_type()) != es)
      return zipccl::handler::invalid(t, "operand " + zipccl::handler::str(k) +
                                             " must have the result's leading dimensions and element size");
    sum += w;
  }
  if (sum != total)
    return zipccl::handler::invalid(t, "the operands' widths add up to " + zipccl::handler::str(sum) +
                                           ", the result holds " + zipccl::handler::str(total));
  uint8_t* out = static_cast<uint8_t*>(y->untyped_data());
  uint64_t off = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    ffi::AnyBuffer x = *xs.get<ffi::AnyBuffer>(k);
    const uint64_t w = (uint64_t)x.dimensions()[x.dimensions().size() - 1];
    const uint8_t* in = static_cast<const uint8_t*>(x.untyped_data());
    if (w)
      for (uint64_t r = 0; r < rows; ++r) std::memcpy(out + (r * total + off) * es, in + r * w * es, w * es);
    off += w;
  }
  return ffi::Error::Success();
}

inline float as_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t as_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// The ordered sum of rows (zipccl_row_sum, contract in ffi/transport.h): rows
// 0..n-1 of columns [lo, hi) of x (row stride m) into y[lo, hi); threads take
// disjoint column ranges (each column's order is the same whatever the split). Per
// tile of 128 columns the partial sums stay in registers / L1 (two buffers; larger
// tiles ran 2.7x slower on [8, 4M] bf16: rows at power-of-two strides evict each
// other from L1's sets): row i adds `cur` and the row into `nxt` with the hardware
// add, and only a tile where some sum is NaN (rare) is redone with ordered_add's NaN
// rules, which a compiler's operand order could break.
template <typename Word, uint32_t (*Widen)(Word)>
__attribute__((always_inline)) inline void row_sum_body(const Word* __restrict x, float* __restrict y, uint64_t n,
                                                        uint64_t m, uint64_t lo, uint64_t hi) {
  namespace zt = zipccl::transport;
  constexpr uint64_t kBlock = 128;   // columns: 512 B of partial sums per buffer
  alignas(64) uint32_t buf[2][kBlock];
  for (uint64_t a = lo; a < hi; a += kBlock) {
    const uint64_t w = std::min(hi - a, kBlock);
    uint32_t* cur = buf[0];
    uint32_t* nxt = buf[1];
    // a single row is only widened: no add, nothing flushed
    for (uint64_t j = 0; j < w; ++j) cur[j] = n == 1 ? Widen(x[a + j]) : zt::flush_subnormal(Widen(x[a + j]));
    for (uint64_t i = 1; i < n; ++i) {
      const Word* row = x + i * m + a;
      uint32_t nan = 0;
      for (uint64_t j = 0; j < w; ++j) {
        const uint32_t s = as_bits(as_float(cur[j]) + as_float(zt::flush_subnormal(Widen(row[j]))));
        nan |= (s & 0x7fffffffu) > 0x7f800000u;
        nxt[j] = zt::flush_subnormal(s);
      }
      if (nan)
        for (uint64_t j = 0; j < w; ++j) {
          const uint32_t v = zt::flush_subnormal(Widen(row[j]));
          nxt[j] = zt::ordered_add(cur[j], v, as_bits(as_float(cur[j]) + as_float(v)));
        }
      std::swap(cur, nxt);
    }
    std::memcpy(y + a, cur, w * 4);
  }
}

#if defined(__x86_64__)
// The same loops compiled for AVX2 (8 lanes; the portable build has SSE2's 4),
// chosen at run time: ~2x on large sums.
template <typename Word, uint32_t (*Widen)(Word)>
__attribute__((target("avx2"))) void row_sum_columns_avx2(const Word* x, float* y, uint64_t n, uint64_t m,
                                                          uint64_t lo, uint64_t hi) {
  row_sum_body<Word, Widen>(x, y, n, m, lo, hi);
}
#endif

template <typename Word, uint32_t (*Widen)(Word)>
void row_sum_dispatch(const Word* x, float* y, uint64_t n, uint64_t m, uint64_t lo, uint64_t hi) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return row_sum_columns_avx2<Word, Widen>(x, y, n, m, lo, hi);
#endif
  row_sum_body<Word, Widen>(x, y, n, m, lo, hi);
}

ffi::Error RowSumCpuImpl(ffi::AnyBuffer x, ffi::Result<ffi::Buffer<ffi::F32>> y) {
  namespace zt = zipccl::transport;
  uint64_t batch = 0, n = 0, m = 0;
  if (ffi::Error e = zt::row_sum_shapes(x.element_type(), x.dimensions(), y->dimensions(), &batch, &n, &m);
      e.failure())
    return e;
  const ffi::DataType t = x.element_type();
  const int threads = zipccl::par::threads_for(batch * n * m, 1ull << 20);
  const uint64_t per = (m + threads - 1) / threads;
  zipccl::par::parallel_for(threads, [&](int k) {
    const uint64_t lo = std::min(m, k * per), hi = std::min(m, lo + per);
    for (uint64_t b = 0; b < batch; ++b) {
      float* out = y->typed_data() + b * m;
      if (t == ffi::DataType::F32)
        row_sum_dispatch<uint32_t, zt::widen_f32>(static_cast<const uint32_t*>(x.untyped_data()) + b * n * m,
                                                 out, n, m, lo, hi);
      else if (t == ffi::DataType::BF16)
        row_sum_dispatch<uint16_t, zt::widen_bf16>(static_cast<const uint16_t*>(x.untyped_data()) + b * n * m,
                                                  out, n, m, lo, hi);
      else
        row_sum_dispatch<uint16_t, zt::widen_f16>(static_cast<const uint16_t*>(x.untyped_data()) + b * n * m,
                                                 out, n, m, lo, hi);
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclRowSumCpu, RowSumCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()            // x [..., N, M] bf16 / f16 / f32
                                  .Ret<ffi::Buffer<ffi::F32>>());   // y [..., M]

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclRowUnpackCpu, RowUnpackCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()   // x [..., T]
                                  .RemainingRets());       // y_k [..., w_k]

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclRowPackCpu, RowPackCpuImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()          // x_k [..., w_k]
                                  .Ret<ffi::AnyBuffer>());  // y [..., sum w_k]

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclUsedMaxCpu, UsedMaxCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()     // stats [..., 4]
                                  .Ret<ffi::Buffer<ffi::S32>>());   // used []

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclAgreeCpu, AgreeCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()     // every [N, W]
                                  .Ret<ffi::Buffer<ffi::S32>>()     // (agreed, count, rung)
                                  .Attr<ffi::Span<const int32_t>>("units")
                                  .Attr<std::string_view>("where"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclBitcastCopyCpu, BitcastCopyCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()            // x
                                  .Ret<ffi::AnyBuffer>());          // y, x's bytes

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclRowSplitCpu, RowSplitCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U8>>()      // payload [N, L]
                                  .Arg<ffi::Buffer<ffi::S32>>()     // me []
                                  .RemainingRets());                // N - 1 x u8 [S]

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclRowJoinCpu, RowJoinCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U8>>()      // payload [N, L]
                                  .Arg<ffi::Buffer<ffi::S32>>()     // me []
                                  .RemainingArgs()                  // N - 1 x u8 [S]
                                  .Ret<ffi::Buffer<ffi::U8>>());    // out [N, S]

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclRowPrefixCpu, RowPrefixCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U8>>()      // payload [..., L]
                                  .Ret<ffi::Buffer<ffi::U8>>());    // slot [..., S]
