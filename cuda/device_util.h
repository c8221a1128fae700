// CUDA spellings that the CPU SIMT emulator (simt_host.h) replaces when a kernel
// file is compiled for it (ZIPCCL_SIMT_HOST defined by the emulator driver):
// shared-memory declarations, launches, relaxed global accesses, cp.async copies;
// and the host-side helpers both kernel files' handlers share (CUDA errors as FFI
// errors, the warm-up loop over devices). Used by cuda/window.cu and
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

// ---- skipped rows (ffi/handler_common.h check_skip / check_fill) -----------------------
//
// The CUDA handlers code every row (the mask is in device memory; reading it on
// the host would cost a synchronization per call), then these kernels give
// skipped rows the results the CPU handlers give them: an encoder's stats row
// [status, escapes, used/128, 0] all zero; a decoder's status 0 and, when fill
// has F > 0 rows, output row r = fill row r / group (group = rows / F) bit for
// bit. Launched after the codec's own kernels on the same stream.

// stats [rows, 4] int32: skipped rows zeroed. One thread per row.
static __global__ void skip_zero_stats(const uint8_t* skip, int32_t* stats, uint64_t rows) {
  const uint64_t r = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows && skip[r])
    for (int k = 0; k < 4; ++k) stats[4 * r + k] = 0;
}

// y [rows, row_bytes] and status [rows]: CTA b handles row b / parts, bytes
// [(b % parts) * span, + span) of it with span = ceil(row_bytes / parts); 16-byte
// accesses when wide (y, fill and row_bytes all 16-byte aligned), else bytes.
static __global__ void skip_fill_rows(const uint8_t* skip, const uint8_t* fill, uint8_t* y, int32_t* status,
                                      uint64_t rows, uint64_t row_bytes, uint64_t group, uint32_t parts, bool wide) {
  const uint64_t r = blockIdx.x / parts, part = blockIdx.x % parts;
  if (r >= rows || !skip[r]) return;
  if (part == 0 && threadIdx.x == 0) status[r] = 0;
  if (group == 0 || row_bytes == 0) return;  // F = 0: the row is left as decoded (unspecified)
  const uint64_t span = (row_bytes + parts - 1) / parts;
  const uint64_t lo = part * span, hi = lo + span < row_bytes ? lo + span : row_bytes;
  const uint8_t* src = fill + (r / group) * row_bytes;
  uint8_t* dst = y + r * row_bytes;
  if (wide) {  // span is a multiple of 16 here (launch_skip_fill)
    for (uint64_t i = lo + 16 * (uint64_t)threadIdx.x; i < hi; i += 16 * (uint64_t)blockDim.x)
      *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(src + i);
  } else {
    for (uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) dst[i] = src[i];
  }
}

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

// The encoder's skipped rows: stats zeroed (skip_zero_stats), after the codec's kernels.
inline ::xla::ffi::Error launch_skip_stats(const char* target, cudaStream_t stream, const uint8_t* skip,
                                           int32_t* stats, uint64_t rows) {
  if (rows == 0) return ::xla::ffi::Error::Success();
  ZC_LAUNCH(skip_zero_stats, (rows + 255) / 256, 256, stream, skip, stats, rows);
  return check_launch(target, "skip_zero_stats launch");
}

// The decoder's skipped rows: status 0, fill copied in (skip_fill_rows), after the
// codec's kernels. Rows are split into up to 64 parts of >= 64 KiB so that a big
// row is copied by many CTAs.
inline ::xla::ffi::Error launch_skip_fill(const char* target, cudaStream_t stream, const uint8_t* skip,
                                          const void* fill, void* y, int32_t* status, uint64_t rows,
                                          uint64_t row_bytes, uint64_t group) {
  if (rows == 0) return ::xla::ffi::Error::Success();
  const bool wide = ((uintptr_t)fill | (uintptr_t)y | row_bytes) % 16 == 0;
  uint64_t parts = row_bytes / (64 << 10);
  parts = parts < 1 ? 1 : parts > 64 ? 64 : parts;
  if (wide) {  // every part a whole number of 16-byte words
    while (parts > 1 && (row_bytes / 16) % parts != 0) --parts;
  }
  if (rows * parts > 0x7FFFFFFFull) parts = 1;  // grid.x limit (the handlers bound rows below it)
  ZC_LAUNCH(skip_fill_rows, rows * parts, 256, stream, skip, static_cast<const uint8_t*>(fill),
            static_cast<uint8_t*>(y), status, rows, row_bytes, group, (uint32_t)parts, wide);
  return check_launch(target, "skip_fill_rows launch");
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
