// CUDA spellings that the CPU SIMT emulator (simt_host.h) replaces when a kernel
// file is compiled for it (ZIPCCL_SIMT_HOST defined by the emulator driver):
// shared-memory declarations, launches, relaxed global accesses. Used by
// cuda/entropy.cu; the emulator header is found through the include path, so
// moving it means changing only the -I flags of its drivers.
#pragma once

#if defined(ZIPCCL_SIMT_HOST)
#include "simt_host.h"
#else
#include <cuda_runtime.h>
#endif
#include <stdint.h>

// ZC_SHARED(type, name, dims): a __shared__ object; in the emulator every emulated
// CTA gets its own copy. ZC_LAUNCH: kernel<<<grid, block, 0, stream>>>(args).
#if !defined(ZC_SHARED)
#if defined(ZIPCCL_SIMT_HOST)
#define ZC_SHARED(type, name, dims) auto& name = ::simt::shared_object<type dims>()
#define ZC_LAUNCH(kernel, grid, block, stream, ...) \
  ::simt::launch_async((unsigned)(grid), (block), (stream), [=] { kernel(__VA_ARGS__); })
#else
#define ZC_SHARED(type, name, dims) __shared__ type name dims
#define ZC_LAUNCH(kernel, grid, block, stream, ...) \
  kernel<<<(unsigned)(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif
#endif

namespace zipccl {
namespace dev {

// A 64-bit global word read/written by other CTAs while this kernel runs (a
// look-back state): one relaxed access, never torn, never cached in a register.
#if defined(ZIPCCL_SIMT_HOST)
__device__ __forceinline__ uint64_t ld_relaxed(const uint64_t* p) { return ::simt::ld_relaxed(p); }
__device__ __forceinline__ void st_relaxed(uint64_t* p, uint64_t v) { ::simt::st_relaxed(p, v); }
#else
__device__ __forceinline__ uint64_t ld_relaxed(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
#endif

}  // namespace dev
}  // namespace zipccl
