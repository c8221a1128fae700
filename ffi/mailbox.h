// The planned transport's mailbox (zipccl_jax.jit): XLA FFI target "zipccl_mailbox"
// and the host table it writes, which the wrapper reads once per step.
//
//   zipccl_mailbox: x [...] of any type, K >= 1 values s32 [...], attributes
//                   ledger s64, slot s64, column s64 -> x's bytes (aliased to x: no
//                   copy); table[ledger][slot + i] = max(table[ledger][slot + i], v_i)
//                   for i = 0 .. K - 1, where
//                     v_i = max over all elements of value i, except
//                     v_0 = max(0, max over r of value0[r, column]) when column >= 0:
//                           value 0 read as rows of its last axis (W elements,
//                           0 <= column < W), e.g. an encoder's stats s32[R, 4],
//                           whose column 2 is a row's used size;
//                   or, when column = -2 (kElementwise), every value has the same last
//                   dimension E and each of its columns is recorded on its own:
//                   table[ledger][slot + K j + i] = max(.., max(0, max over r of
//                   value_i[r, j])) for j = 0 .. E - 1 (a segmented call's K = 2
//                   values used s32[L] and status s32[L], one pair of slots per site).
//
// A planned call site records, in one call after its decode, the largest used size
// of its encoded rows (units of 128 bytes, slot 2 site: the encoder's stats with
// column 2, so that no reduction of its own runs before) and the decoder statuses of
// its received rows (slot 2 site + 1: > 0 when a row failed to decode); a measuring
// site records the used size alone, before it moves the raw words. The operation is a max, so a site
// that runs several times per step (a scan body, remat, a vmap batch) or on several
// devices of the process keeps its worst value. The call passes an operand of the
// transport through (the payload to cut, the rows to move, the decoded rows), so it
// runs before the step's outputs are ready and is never removed, without being a
// side-effecting op (which JAX's remat and partial evaluation refuse); the wrapper
// takes the table after the step.
//
// Why a mailbox and not values threaded out of the traced function: call sites sit
// at any depth (shard_map, custom_vjp backward passes, scan, vmap, remat), where
// returning extra values means a transformation rule for every primitive
// (checkify's machinery). A pass-through custom call needs none, and moves no
// data the step has to wait for: on the CPU a store to host memory, on CUDA an
// atomic max into mapped host memory by one thread (no copy, no synchronisation).
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace zipccl {
namespace mailbox {

constexpr const char* kMailboxTarget = "zipccl_mailbox";
// A ledger holds at most this many slots (2 per call site).
constexpr int64_t kMaxSlots = 1 << 20;
// `column` of a call whose values are recorded column by column (the contract above).
constexpr int64_t kElementwise = -2;

// Records value into table[ledger][slot] (max); false when slot is out of range.
bool record(int64_t ledger, int64_t slot, int32_t value);
// v_i of the contract above: the max of n words p[0 .. n), or with column >= 0
// max(0, p[r * width + column]) over the rows r < n / width. Host and device code.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int32_t worst(const int32_t* p, int64_t n, int64_t column, int64_t width) {
  if (column < 0) {
    int32_t w = p[0];
    for (int64_t i = 1; i < n; ++i) w = p[i] > w ? p[i] : w;
    return w;
  }
  int32_t w = 0;
  for (int64_t i = column; i < n; i += width) w = p[i] > w ? p[i] : w;
  return w;
}
// The row width of value 0 (its last dimension; 1 when column < 0) into *width, or
// the error naming `column` when it is not below that width. Both handlers' check.
// With column = kElementwise: E, the last dimension every value must share.
inline xla::ffi::Error column_width(const xla::ffi::RemainingArgs& values, int64_t column, int64_t* width) {
  *width = 1;
  if (column == -1) return xla::ffi::Error::Success();
  auto last = [&](size_t i) {
    auto dims = values.get<xla::ffi::Buffer<xla::ffi::S32>>(i)->dimensions();
    return dims.size() == 0 ? (int64_t)1 : (int64_t)dims.back();
  };
  *width = last(0);
  if (column == kElementwise) {
    for (size_t i = 1; i < values.size(); ++i)
      if (last(i) != *width)
        return xla::ffi::Error::InvalidArgument(std::string(kMailboxTarget) + ": with column -2 every value " +
                                                "must have value 0's last dimension " + std::to_string(*width));
    return xla::ffi::Error::Success();
  }
  if (column >= 0 && column < *width) return xla::ffi::Error::Success();
  return xla::ffi::Error::InvalidArgument(std::string(kMailboxTarget) + ": column " + std::to_string(column) +
                                          " must be -1, -2 or below value 0's last dimension " +
                                          std::to_string(*width));
}
// The number of table slots a call records: K values, or K * E elementwise.
inline int64_t slots_spanned(size_t values, int64_t column, int64_t width) {
  return column == kElementwise ? (int64_t)values * width : (int64_t)values;
}
// The ledger's table (-1: never recorded), emptied.
std::vector<int32_t> take(int64_t ledger);

}  // namespace mailbox
}  // namespace zipccl

XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclMailboxCpu);
