// The slot ladder's row-prefix copy on the CPU (target and shapes: transport.h).
//
// Why a custom call for what `payload[:, :S]` also does: every rung of the ladder is
// a switch branch that needs its own slot-sized operand for the collective, and
// XLA:CPU compiles each such slice into its own LLVM kernel, ~15 ms of compile time
// a rung (benchmarks/ladder.py: an all-gather ladder compiled 2.6x slower than one
// rung). A custom call is a runtime call with no code generation; the copy it makes
// is the one the slice made.
#include <stdint.h>

#include <cstring>

#include "transport.h"

namespace ffi = xla::ffi;

namespace {

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

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclRowPrefixCpu, RowPrefixCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U8>>()      // payload [..., L]
                                  .Ret<ffi::Buffer<ffi::U8>>());    // slot [..., S]
