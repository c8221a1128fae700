// The CUDA spellings the kernels and handlers use (threadIdx, __syncthreads, warp
// intrinsics, atomics, the runtime calls), mapped onto the SIMT machine of
// simt_host.h, which includes this file last; see there for the model.
#pragma once

// ---- CUDA names the kernels use ------------------------------------------------------------
#define threadIdx (::simt::thread_idx())
#define blockIdx (::simt::block_idx())
#define gridDim (::simt::m().grid)
#define blockDim (::simt::m().block)
#define __syncthreads() ::simt::syncthreads(__LINE__)
#define __shfl_xor_sync(mask, v, o) ::simt::shfl_xor(__LINE__, mask, v, o)
#define __shfl_up_sync(mask, v, d) ::simt::shfl_up(__LINE__, mask, v, d)
#define __reduce_add_sync(mask, v) ::simt::reduce_add(__LINE__, mask, v)
#define __reduce_or_sync(mask, v) ::simt::reduce_or(__LINE__, mask, v)
#define __reduce_max_sync(mask, v) ::simt::reduce_max(__LINE__, mask, v)
#define __ballot_sync(mask, p) ::simt::ballot(__LINE__, mask, p)
#define __any_sync(mask, p) ::simt::any(__LINE__, mask, p)
inline int __ffs(int x) { return __builtin_ffs(x); }
inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}
inline float __fadd_rn(float a, float b) { return a + b; }   // the host's default rounding: to nearest even
inline void __nanosleep(unsigned) { ::simt::sleep_now(); }
template <typename V>
V __ldg(const V* p) {
  return *p;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return ::simt::atomic_add(p, v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { return ::simt::atomic_add(p, v); }
inline unsigned atomicOr(unsigned* p, unsigned v) { return ::simt::atomic_or(p, v); }

// ---- the CUDA runtime calls window.cu makes (host side) --------------------------------------
// One emulated "device" per value of simt::config().resident would need a real
// driver; instead the occupancy query answers config().resident CTAs on 1 SM, and
// cudaGetDevice reports device `resident` so that window.cu's per-device occupancy
// cache sees a different device whenever the emulation changes `resident`.
typedef int cudaError_t;
constexpr cudaError_t cudaSuccess = 0;
typedef struct simt_stream* cudaStream_t;
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
struct cudaFuncAttributes {
  int numRegs;
};
inline cudaError_t& simt_last_error() { return ::simt::m().last_error; }
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = simt_last_error();
  simt_last_error() = 0;
  return e;
}
inline const char* cudaGetErrorString(cudaError_t e) { return e == 9 ? "invalid configuration argument" : "error"; }
inline cudaError_t cudaGetDevice(int* d) {
  *d = (int)::simt::config().resident;
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) {
  *v = 1;
  return cudaSuccess;
}
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, const void*, int, size_t) {
  *n = (int)::simt::config().resident;
  return cudaSuccess;
}
template <typename F>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, F) {
  a->numRegs = 0;
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
  memset(p, v, n);
  return cudaSuccess;
}
