// The planned transport's mailbox on CUDA (cuda/mailbox.cu; contract: ffi/mailbox.h).
#pragma once

#include <stdint.h>

#include <vector>

#include "xla/ffi/api/ffi.h"

namespace zipccl {
namespace mailbox {

// The CUDA ledger's table (-1: never recorded), reset; empty when never used.
std::vector<int32_t> take_cuda(int64_t ledger);

}  // namespace mailbox
}  // namespace zipccl

XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclMailboxCuda);
