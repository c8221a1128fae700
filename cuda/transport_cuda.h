// The slot ladder's row copies on a GPU (cuda/transport.cu; ffi/transport.h).
#pragma once

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclRowPrefixCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclRowSplitCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclRowJoinCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclUsedMaxCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclAgreeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclBitcastCopyCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclRowUnpackCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclRowSumCuda);
