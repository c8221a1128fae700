// CUDA spellings that the CPU SIMT emulator (simt_host.h) replaces when a kernel
// file is compiled for it (ZIPCCL_SIMT_HOST defined by the emulator driver):
// shared-memory declarations, launches, relaxed global accesses, cp.async copies;
// and the host-side helpers both kernel files' handlers share (CUDA errors as FFI
// errors, the warm-up loop over devices). Used by cuda/codec.cu and
// cuda/entropy.cu; the emulator header is found through the include path, so
// moving it means changing only the -I flags of its drivers.
#pragma once

#if defined(ZIPCCL_SIMT_HOST)
#include "simt_host.h"
#else
#include <cuda_runtime.h>
#endif
#include <stdint.h>

#include <string>

#include "xla/ffi/api/ffi.h"

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
// cp_async16/cp_async8: an asynchronous global-to-shared copy of 16 / 8 bytes;
// cp_commit closes the current group, cp_wait<N> waits until at most N groups
// are pending.
#if defined(ZIPCCL_SIMT_HOST)
__device__ __forceinline__ uint64_t ld_relaxed(const uint64_t* p) { return ::simt::ld_relaxed(p); }
__device__ __forceinline__ void st_relaxed(uint64_t* p, uint64_t v) { ::simt::st_relaxed(p, v); }
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) { ::simt::cp_async(smem, gmem, 16); }
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) { ::simt::cp_async(smem, gmem, 8); }
__device__ __forceinline__ void cp_commit() { ::simt::cp_commit(); }
template <int N>
__device__ __forceinline__ void cp_wait() { ::simt::cp_wait(N); }
#else
__device__ __forceinline__ uint64_t ld_relaxed(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
#endif

// ---- host side -------------------------------------------------------------------------

// A failed CUDA call as an FFI error of the handler `target` (the error state cleared).
inline ::xla::ffi::Error cuda_error(const char* target, const char* what, cudaError_t e) {
  cudaGetLastError();  // clear it
  return ::xla::ffi::Error::Internal(std::string(target) + " (CUDA): " + what + " failed: " + cudaGetErrorString(e));
}

// After a launch: its configuration or launch error, if any.
inline ::xla::ffi::Error check_launch(const char* target, const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return cuda_error(target, what, e);
  return ::xla::ffi::Error::Success();
}

// per_device() on every visible device in turn (made current), the current device
// restored afterwards and any error state cleared: the number of devices done.
template <typename F>
int for_each_device(F&& per_device) {
  int count = 0, prev = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
    cudaGetLastError();
    return 0;
  }
  const bool have_prev = cudaGetDevice(&prev) == cudaSuccess;
  int done = 0;
  for (int d = 0; d < count; ++d) {
    if (cudaSetDevice(d) != cudaSuccess) continue;
    per_device();
    ++done;
  }
  if (have_prev) cudaSetDevice(prev);
  cudaGetLastError();
  return done;
}

}  // namespace dev
}  // namespace zipccl
