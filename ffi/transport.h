// The slot ladder's row-prefix copy: XLA FFI target "zipccl_row_prefix", what its CPU
// (ffi/transport_cpu.cc) and CUDA (cuda/transport.cu) handlers share.
//
//   zipccl_row_prefix: payload u8 [..., L] -> slot u8 [..., S], S <= L:
//                      slot[r, :] = payload[r, :S] for every row r
//
// zipccl_jax/_src/transport.py calls it on CPU backends (where it saves a slice
// kernel per ladder rung) and slices on others; the CUDA handler exists so that a
// program lowered for several platforms at once compiles everywhere.
#pragma once

#include <stdint.h>

#include "handler_common.h"
#include "xla/ffi/api/ffi.h"

namespace zipccl {
namespace transport {

constexpr const char* kRowPrefixTarget = "zipccl_row_prefix";

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

}  // namespace transport
}  // namespace zipccl

XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclRowPrefixCpu);
