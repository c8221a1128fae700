// zipccl codec on CUDA GPUs: encode/decode kernels and their XLA FFI handlers
// (targets "zipccl_zipccl_encode" / "zipccl_zipccl_decode", platform "CUDA").
//
// The output is byte-identical to the CPU codec (ffi/window_cpu.cc) for every input:
// the layout math is ffi/window_format.h, the per-thread bit work cuda/window_tile.h
// (both also compiled for the host, where tests/cuda/emulate_window.cc checks them against
// the CPU codec). docs/cuda.md describes the design; in short:
//
// Encoder, per call (all rows), three stream operations, no host synchronisation:
//   1. cudaMemsetAsync(workspace, 0)
//   2. encode_kernel: persistent CTAs of 256 / G threads (G = 1, 2, 4 groups of 8
//      elements per thread: see groups_per_thread) take blocks ("tiles") in ticket
//      order from an atomic counter (a CTA only ever waits on tiles held by running
//      CTAs: no deadlock even when other kernels share the GPU). Input streams
//      through a cp.async ring (S - 1 tiles loading while one is processed). Per
//      tile: window statistics and the four refinement counts (two rounds of warp
//      reductions), codes and planes (SWAR), raw and plane stores, an escape prefix
//      sum (warp shuffles), the tile's escape offset by a single-pass decoupled
//      look-back over per-tile counts in the workspace, then the record and escape
//      bytes. Every thread sums the checksum terms of the words it writes (a
//      position-weighted word sum: order-independent), flushed with one atomicAdd
//      per warp and row.
//   3. encode_finalize: zeroes the unused escape bytes and writes the header (with
//      the checksum) and the stats.
// Decoder: memset, decode_kernel (grid-stride over tiles through the same kind of
// ring; each record checked locally against its neighbour, planes against the
// record, escapes read by offset and bounds-checked) and decode_finalize (header
// checks in the CPU's order, then the tiles' findings by priority, then the checksum).
#include "device_util.h"  // CUDA or, for tests/cuda/emulate_window.cc, the CPU SIMT emulator

#include <stdint.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "window_cuda.h"
#include "window_format.h"
#include "window_tile.h"
#include "env.h"
#include "handler_common.h"

#include "window_device.cuh"  // shared constants and device helpers
#include "window_encode.cuh"  // encoder kernels
#include "window_decode.cuh"  // decoder kernels

namespace zipccl {
namespace gpu {
namespace {

// ---- host side ---------------------------------------------------------------------

// CTAs that fit on the current device at once (for the persistent/grid-stride
// kernels); cached per (device, kernel). Only a performance hint: the kernels are
// correct for any grid size.
int resident_ctas(const void* kernel, int threads) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> cache;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 1024;
  }
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({dev, kernel});
  if (it != cache.end()) return it->second;
  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) sms = 132;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess || per_sm <= 0)
    per_sm = 4;
  cudaGetLastError();  // clear anything the queries left behind
  const int v = sms * per_sm;
  cache[{dev, kernel}] = v;
  return v;
}

template <typename T, int G>
void warm_up_tile_kernels() {
  cudaFuncAttributes attr;
  cudaFuncGetAttributes(&attr, encode_kernel<T, G>);
  cudaFuncGetAttributes(&attr, decode_kernel<T, G>);
  resident_ctas((const void*)encode_kernel<T, G>, tile_threads<G>());
  resident_ctas((const void*)decode_kernel<T, G>, tile_threads<G>());
}

template <typename T>
void warm_up_kernels() {
  cudaFuncAttributes attr;
  cudaFuncGetAttributes(&attr, encode_finalize<T>);
  cudaFuncGetAttributes(&attr, decode_finalize<T>);
  warm_up_tile_kernels<T, 1>();
  warm_up_tile_kernels<T, 2>();
  warm_up_tile_kernels<T, 4>();
}

// The tile-kernel variant chosen by set_tile_groups (0: none chosen).
std::atomic<int> g_tile_groups{0};

// Groups per thread of the tile kernels: set_tile_groups' choice, else
// ZIPCCL_CUDA_GROUPS (1, 2 or 4; read once per process, ffi/env.h), else the
// default: G = 4 for 16-bit dtypes, 2 for fp32 -- the fewest SASS instructions per
// element at a register cap without spills (docs/cuda.md, "Groups per thread"; a
// static estimate until a GPU has timed them). Read whenever XLA runs the handler
// (once per capture when the call is recorded in a CUDA graph). The payload bytes
// do not depend on it.
template <typename T>
int groups_per_thread() {
  const int chosen = g_tile_groups.load(std::memory_order_relaxed);
  if (chosen) return chosen;
  if (const int v = env::cuda_groups()) return v;
  return Cfg<T>::kBits == 16 ? 4 : 2;
}

// A tile kernel (encode_kernel or decode_kernel of dtype T, in the variant
// groups_per_thread<T>() picks among k1, k2, k4) with as many CTAs as fit on the
// device at once, at most one per tile (persistent / grid-stride).
template <typename T, typename Args>
void launch_tiles(void (*k1)(Args), void (*k2)(Args), void (*k4)(Args), uint64_t total_tiles, cudaStream_t stream,
                  const Args& a) {
  const int groups = groups_per_thread<T>();
  void (*kernel)(Args) = groups == 1 ? k1 : groups == 2 ? k2 : k4;
  const int threads = (int)kPlaneBytes / groups;
  const uint64_t grid = std::min<uint64_t>(total_tiles, (uint64_t)resident_ctas((const void*)kernel, threads));
  ZC_LAUNCH(kernel, grid, threads, stream, a);
}

namespace ffi = ::xla::ffi;
using ::zipccl::dev::check_launch;
using ::zipccl::dev::cuda_error;

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

using handler::kDecodeTarget;
using handler::kEncodeTarget;
using handler::Shape;

template <typename T>
ffi::Error encode_launch(cudaStream_t stream, const uint8_t* x, uint8_t* out, int32_t* stats, uint8_t* ws,
                         const Shape& s) {
  EncArgs a;
  a.x = x;
  a.out = out;
  a.ws = ws;
  a.g = geom_of<T>(s.n, max_escape_capacity(T::kCode, s.n));
  a.x_row = s.n * (uint64_t)Cfg<T>::kEsize;
  a.out_row = a.g.total;
  a.ws_row = s.ws_row;
  const uint64_t total_tiles = s.rows * a.g.tiles;
  // Tickets overshoot the end by at most S + 1 per CTA: keep them far from 2^32.
  if (total_tiles > kMaxGridX) return handler::invalid(kEncodeTarget, "too many tiles");
  a.total_tiles = (uint32_t)total_tiles;
  const uint64_t chunks = std::max<uint64_t>(1, (a.g.esc_size + kZeroChunk - 1) / kZeroChunk);
  if (s.rows * chunks > kMaxGridX) return handler::invalid(kEncodeTarget, "rows too large");

  if (const cudaError_t e = cudaMemsetAsync(ws, 0, s.rows * s.ws_row, stream); e != cudaSuccess)
    return cuda_error(kEncodeTarget, "workspace memset", e);
  if (s.rows && a.g.esc_size) {
    ZC_LAUNCH(encode_zero<T>, s.rows * chunks, kThreads, stream, a, (uint32_t)chunks);
    ffi::Error e = check_launch(kEncodeTarget, "encode_zero launch");
    if (e.failure()) return e;
  }
  if (total_tiles) {
    launch_tiles<T>(encode_kernel<T, 1>, encode_kernel<T, 2>, encode_kernel<T, 4>, total_tiles, stream, a);
    ffi::Error e = check_launch(kEncodeTarget, "encode_kernel launch");
    if (e.failure()) return e;
  }
  ZC_LAUNCH(encode_finalize<T>, s.rows, kThreads, stream, a, stats);
  return check_launch(kEncodeTarget, "encode_finalize launch");
}

template <typename T>
ffi::Error decode_launch(cudaStream_t stream, const uint8_t* in, uint8_t* y, int32_t* status, uint8_t* ws,
                         const Shape& s) {
  DecArgs a;
  a.in = in;
  a.y = y;
  a.ws = ws;
  a.g = geom_of<T>(s.n, 0);
  a.in_row = s.nbytes;
  a.y_row = s.n * (uint64_t)Cfg<T>::kEsize;
  a.ws_row = s.ws_row;
  // The tiles read the fixed part of every row: only when the buffer holds it (else
  // every row is BAD_SIZE, found by decode_finalize alone).
  const bool fixed_ok = s.nbytes >= a.g.esc_off;
  a.esc_room = fixed_ok ? s.nbytes - a.g.esc_off : 0;
  const uint64_t total_tiles = fixed_ok ? s.rows * a.g.tiles : 0;
  if (total_tiles > kMaxGridX || s.rows > kMaxGridX) return handler::invalid(kDecodeTarget, "too many tiles");
  a.total_tiles = (uint32_t)total_tiles;
  a.esc_chunk = esc_chunk_of(a.esc_room, a.g.tiles);

  if (const cudaError_t e = cudaMemsetAsync(ws, 0, s.rows * s.ws_row, stream); e != cudaSuccess)
    return cuda_error(kDecodeTarget, "workspace memset", e);
  if (total_tiles) {
    launch_tiles<T>(decode_kernel<T, 1>, decode_kernel<T, 2>, decode_kernel<T, 4>, total_tiles, stream, a);
    ffi::Error e = check_launch(kDecodeTarget, "decode_kernel launch");
    if (e.failure()) return e;
  }
  ZC_LAUNCH(decode_finalize<T>, s.rows, kThreads, stream, a, status);
  return check_launch(kDecodeTarget, "decode_finalize launch");
}

// skip and fill (handler_common.h): every row is coded (reading skip on the host
// would cost a synchronization), then launch_skip_stats / launch_skip_fill
// (device_util.h) give the skipped rows the CPU handlers' results.
ffi::Error EncodeCudaImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Buffer<ffi::U8> skip,
                          ffi::Result<ffi::Buffer<ffi::U8>> payload, ffi::Result<ffi::Buffer<ffi::S32>> stats,
                          ffi::Result<ffi::Buffer<ffi::U8>> workspace) {
  Shape s;
  if (ffi::Error e = handler::check_encode(x.element_type(), x.dimensions(), payload->dimensions(),
                                           stats->dimensions(), workspace->dimensions(), &s);
      e.failure())
    return e;
  if (ffi::Error e = handler::check_skip(kEncodeTarget, skip.element_count(), s.rows); e.failure()) return e;
  if (s.rows == 0) return ffi::Error::Success();
  uint8_t* out = payload->typed_data();
  uint8_t* ws = workspace->typed_data();
  if (!aligned16(out) || !aligned16(ws))
    return handler::invalid(kEncodeTarget, "payload and workspace must be 16-byte aligned");
  const uint8_t* xb = static_cast<const uint8_t*>(x.untyped_data());
  int32_t* st = stats->typed_data();
  ffi::Error e = s.d == kBF16  ? encode_launch<BF16Traits>(stream, xb, out, st, ws, s)
                 : s.d == kF16 ? encode_launch<F16Traits>(stream, xb, out, st, ws, s)
                               : encode_launch<F32Traits>(stream, xb, out, st, ws, s);
  if (e.failure()) return e;
  return dev::launch_skip_stats(kEncodeTarget, stream, skip.typed_data(), st, s.rows);
}

ffi::Error DecodeCudaImpl(cudaStream_t stream, ffi::Buffer<ffi::U8> payload, ffi::Buffer<ffi::U8> skip,
                          ffi::AnyBuffer fill, ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::Buffer<ffi::S32>> status,
                          ffi::Result<ffi::Buffer<ffi::U8>> workspace) {
  Shape s;
  if (ffi::Error e = handler::check_decode(payload.dimensions(), y->element_type(), y->dimensions(),
                                           status->element_count(), workspace->dimensions(), &s);
      e.failure())
    return e;
  uint64_t group = 0;
  if (ffi::Error e = handler::check_skip(kDecodeTarget, skip.element_count(), s.rows); e.failure()) return e;
  if (ffi::Error e =
          handler::check_fill(kDecodeTarget, fill.element_type(), y->element_type(), fill.dimensions(), s.rows, s.n, &group);
      e.failure())
    return e;
  if (s.rows == 0) return ffi::Error::Success();
  // Rows are read with 16-byte loads: each must start 16-byte aligned (decode_rows
  // cuts a row length that is not a multiple of 16 to a multiple of 128, which
  // loses nothing: used_nbytes is a multiple of 128).
  if (s.nbytes % 16 != 0)
    return handler::invalid(kDecodeTarget, "on the GPU, payload rows must be a multiple of 16 bytes, got " +
                                               handler::str(s.nbytes));
  const uint8_t* in = payload.typed_data();
  uint8_t* ws = workspace->typed_data();
  if ((s.nbytes && !aligned16(in)) || !aligned16(ws))
    return handler::invalid(kDecodeTarget, "payload and workspace must be 16-byte aligned");
  uint8_t* yb = static_cast<uint8_t*>(y->untyped_data());
  int32_t* st = status->typed_data();
  ffi::Error e = s.d == kBF16  ? decode_launch<BF16Traits>(stream, in, yb, st, ws, s)
                 : s.d == kF16 ? decode_launch<F16Traits>(stream, in, yb, st, ws, s)
                               : decode_launch<F32Traits>(stream, in, yb, st, ws, s);
  if (e.failure()) return e;
  return dev::launch_skip_fill(kDecodeTarget, stream, skip.typed_data(), fill.untyped_data(), yb, st, s.rows,
                               s.n * elem_bytes_of(s.d), group);
}

}  // namespace

bool set_tile_groups(int groups) {
  if (groups != 0 && groups != 1 && groups != 2 && groups != 4) return false;
  g_tile_groups.store(groups, std::memory_order_relaxed);
  return true;
}

int warm_up() {
  return dev::for_each_device([] {
    warm_up_kernels<BF16Traits>();
    warm_up_kernels<F16Traits>();
    warm_up_kernels<F32Traits>();
  });
}

}  // namespace gpu
}  // namespace zipccl

namespace ffi = ::xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEncodeCuda, zipccl::gpu::EncodeCudaImpl,
                              zipccl::handler::bind_encode(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclDecodeCuda, zipccl::gpu::DecodeCudaImpl,
                              zipccl::handler::bind_decode(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});
