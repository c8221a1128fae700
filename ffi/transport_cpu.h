// The slot ladder's row-prefix copy on the CPU (transport_cpu.cc).
#pragma once

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclRowPrefixCpu);
