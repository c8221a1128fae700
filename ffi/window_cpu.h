// CPU zipccl codec: row encoder/decoder (window_cpu.cc) and its XLA FFI handlers.
#pragma once

#include <stdint.h>

#include "window_format.h"
#include "xla/ffi/api/ffi.h"

namespace zipccl {
namespace cpu {

struct RowStats {
  uint8_t status;         // EncodeStatus
  uint64_t escape_count;  // escapes found (all of them, also past the capacity)
  uint64_t used_nbytes;   // the header's used_nbytes (the whole buffer when status != 0)
};

// Encodes n elements (bit patterns of dtype d) into a row buffer of
// layout_of(d, n, capacity).total bytes (the FFI encoder: capacity =
// max_escape_capacity(d, n), total = max_nbytes(d, n)). Never writes past that size;
// bytes [used_nbytes, total) are zero; a row with more than `capacity` escapes is
// kEncDoesNotFit. The caller checks n and capacity (layout_checked).
RowStats encode_row(DtypeCode d, const void* x, uint64_t n, uint64_t capacity, uint8_t* out);

// Validates and decodes one row held in in[0, nbytes) (any nbytes; only the header's
// used_nbytes <= nbytes are read); returns a DecodeStatus. Writes y[0, n): the values,
// or all-one bits on any error. The caller checks n < 2^32.
int32_t decode_row(DtypeCode d, const uint8_t* in, uint64_t nbytes, uint64_t n, void* y);

}  // namespace cpu
}  // namespace zipccl

XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclEncodeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecodeCpu);
