// CPU zipccl codec: row encoder/decoder (codec_cpu.cc) and its XLA FFI handlers.
#pragma once

#include <stdint.h>

#include "codec_format.h"
#include "xla/ffi/api/ffi.h"

namespace zipccl {
namespace cpu {

struct RowStats {
  uint8_t status;         // EncodeStatus
  uint64_t escape_count;  // escapes found (all of them, also past the capacity)
};

// Encodes n elements (bit patterns of dtype d) into out[0, encoded_nbytes(d, n, capacity)).
// Never writes past that size; on overflow the row's status is kEncOverflow.
RowStats encode_row(DtypeCode d, const void* x, uint64_t n, uint64_t capacity, uint8_t* out);

// Validates and decodes one row of nbytes bytes; returns a DecodeStatus. Reads only
// inside in[0, nbytes) and writes only y[0, n) (partially on error).
int32_t decode_row(DtypeCode d, const uint8_t* in, uint64_t nbytes, uint64_t n, uint64_t capacity,
                   void* y);

}  // namespace cpu
}  // namespace zipccl

XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclEncodeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecodeCpu);
