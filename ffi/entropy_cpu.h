// CPU "entropy" codec (codec id 2): row encoder/decoder (entropy_cpu.cc) and its
// XLA FFI handlers "zipccl_entropy_encode" / "zipccl_entropy_decode".
#pragma once

#include <stdint.h>

#include "entropy_format.h"
#include "xla/ffi/api/ffi.h"

namespace zipccl {
namespace ent {
namespace cpu {

struct RowStats {
  uint8_t status;       // 0 OK (1 DOES_NOT_FIT cannot happen: RAW blocks bound the size)
  uint64_t raw_blocks;  // blocks stored RAW
  uint64_t used;        // used_nbytes
};

// Encodes n 16-bit words of dtype d into out[0, max_nbytes(d, n)); bytes past
// used_nbytes are zero. Never writes past max_nbytes.
RowStats encode_row(DtypeCode d, const uint16_t* x, uint64_t n, uint8_t* out);

// Validates and decodes one row from in[0, nbytes); returns a DecodeStatus. Reads
// only in[0, nbytes), writes y[0, n): all-one words on any nonzero status.
int32_t decode_row(DtypeCode d, const uint8_t* in, uint64_t nbytes, uint64_t n, uint16_t* y);

}  // namespace cpu
}  // namespace ent
}  // namespace zipccl

XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclEntropyEncodeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclEntropyDecodeCpu);
