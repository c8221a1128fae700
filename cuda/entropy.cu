// "entropy" codec (codec id 2) on CUDA GPUs: kernels and the XLA FFI handlers
// "zipccl_entropy_encode" / "zipccl_entropy_decode" for platform "CUDA".
//
// The payload is byte-identical to the CPU codec (ffi/entropy_cpu.cc) and the
// decoder reports the same status for every payload: the format, including the
// encoder's choices (package-merge code lengths, the block mode), is fixed by
// docs/format.md ("Entropy codec (codec id 2)") and ffi/entropy_format.h, whose
// __host__ __device__ functions both codecs call. tests/test_entropy_cuda.py runs
// these kernels on the CPU SIMT emulator (tests/cuda/emulate_entropy.cc) against
// the CPU codec. docs/cuda.md ("Entropy codec kernels") describes the design:
//
// Encoder, per call (all rows), no host synchronisation:
//   1. cudaMemsetAsync: payload and workspace to zero (every byte the kernels do
//      not write -- zero runs, the padding past used_nbytes -- is then already right).
//   2. ent_encode_kernel: one CTA of 256 threads per 4096-element block, in ticket
//      order (an atomic counter, so a CTA only waits on blocks held by CTAs that
//      already run). Histogram of the joint (coded exponent, sign) symbols in
//      shared memory (format v4: the coded exponent is e for bf16, e and the top
//      mantissa bit for fp16; alphabets and raw widths come from entropy_format.h's
//      Traits); code lengths of both kinds by package-merge (one thread per kind,
//      shared-memory lists, the leaf order by a parallel rank); the block's mode and
//      size; its byte offset in the row by a decoupled look-back over per-block
//      states in the workspace; then the block is written straight to its final
//      place: warp s codes stream s (a lane codes 16 elements at its bit offset from
//      a warp scan, ORed into big-endian words in shared memory), raw planes by
//      element/group (kind Z, format v3: only the elements with exponent != 0, the
//      k-th at raw position k, compacted by a CTA scan of per-thread counts). Every
//      byte written adds its checksum term (the checksum is linear in the bytes:
//      byte i contributes byte << 8(i mod 4) times 2(i/4)+1).
//   3. ent_encode_finalize (a CTA per row): header, checksum, stats.
// Decoder: memset(workspace); ent_decode_rows (a CTA per row: header checks in the
// CPU's order, directory sizes, block offsets into the workspace, raw-block count);
// ent_decode_blocks (a one-warp CTA per 4 blocks: block validation as the CPU by
// one lane per block, canonical symbol lists and 256-entry primary tables by
// ballots, then lane 8 g + s decodes stream s of block g in rounds of 64 symbols
// staged in shared memory and joined with the raw planes by the whole warp (kind
// Z: the value bits alone, then a pass that adds the raw values by a running count
// of the elements with exponent != 0, once the raw part's size is checked);
// findings and checksum terms into the workspace); ent_decode_finalize (status by
// the CPU's priority, all-one rows on error).
#include "device_util.h"

#include <stdint.h>

#include <string>

#include "entropy_cuda.h"
#include "entropy_format.h"
#include "handler_common.h"  // split_dims, str (shared with the window codec's handlers)

#include "entropy_device.cuh"  // shared constants and warp helpers
#include "entropy_encode.cuh"  // encoder kernels
#include "entropy_decode.cuh"  // decoder kernels

namespace zipccl {
namespace ent {
namespace gpu {
namespace {

// ---- host side -----------------------------------------------------------------------

namespace ffi = ::xla::ffi;

constexpr const char* kEnc = "zipccl_entropy_encode";
constexpr const char* kDec = "zipccl_entropy_decode";
constexpr uint64_t kMaxGrid = 0x7FFFFFFFu;

using ::zipccl::dev::check_launch;
using ::zipccl::dev::cuda_error;

bool ent_dtype(ffi::DataType t, DtypeCode* d) {
  switch (t) {
    case ffi::DataType::BF16: *d = kBF16; return true;
    case ffi::DataType::F16: *d = kF16; return true;
    default: return false;
  }
}

using ::zipccl::handler::split_dims;
using ::zipccl::handler::str;

bool aligned(const void* p, uintptr_t k) { return (reinterpret_cast<uintptr_t>(p) & (k - 1)) == 0; }

template <DtypeCode D>
ffi::Error encode_launch(cudaStream_t stream, const EncArgs& a, uint64_t rows, int32_t* stats) {
  if (const cudaError_t e = cudaMemsetAsync(a.ws, 0, rows * a.ws_row, stream); e != cudaSuccess)
    return cuda_error(kEnc, "workspace memset", e);
  if (rows * a.nb != 0) {
    ZC_LAUNCH(ent_encode_kernel<D>, rows * a.nb, kEncThreads, stream, a);
    ffi::Error e = check_launch(kEnc, "ent_encode_kernel launch");
    if (e.failure()) return e;
  }
  // (rows * ctas <= 2^31 - 1: the handler checks rows * nb, and a row of n elements
  // has out_row / 64 KiB < nb + 1 chunks.)
  const uint32_t ctas = (uint32_t)((a.out_row + kTailBytes - 1) / kTailBytes);
  ZC_LAUNCH(ent_encode_tail, rows * ctas, kRowThreads, stream, a, ctas);
  if (ffi::Error e = check_launch(kEnc, "ent_encode_tail launch"); e.failure()) return e;
  ZC_LAUNCH(ent_encode_finalize<D>, rows, kRowThreads, stream, a, stats);
  return check_launch(kEnc, "ent_encode_finalize launch");
}

template <DtypeCode D>
ffi::Error decode_launch(cudaStream_t stream, const DecArgs& a, uint64_t rows, int32_t* status) {
  if (const cudaError_t e = cudaMemsetAsync(a.ws, 0, rows * a.ws_row, stream); e != cudaSuccess)
    return cuda_error(kDec, "workspace memset", e);
  ZC_LAUNCH(ent_decode_rows<D>, rows, kRowThreads, stream, a);
  ffi::Error e = check_launch(kDec, "ent_decode_rows launch");
  if (e.failure()) return e;
  if (rows * a.nb != 0) {
    ZC_LAUNCH(ent_decode_blocks<D>, (rows * a.nb + kDecG - 1) / kDecG, kDecThreads, stream, a);
    e = check_launch(kDec, "ent_decode_blocks launch");
    if (e.failure()) return e;
  }
  ZC_LAUNCH(ent_decode_finalize, rows, kRowThreads, stream, a, status);
  return check_launch(kDec, "ent_decode_finalize launch");
}

}  // namespace

// skip and fill (handler_common.h): every row is coded (reading skip on the host
// would cost a synchronization), then launch_skip_stats / launch_skip_fill
// (device_util.h) give the skipped rows the CPU handlers' results.
ffi::Error EntropyEncodeCudaImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Buffer<ffi::U8> skip,
                                 ffi::Result<ffi::Buffer<ffi::U8>> payload,
                                 ffi::Result<ffi::Buffer<ffi::S32>> stats,
                                 ffi::Result<ffi::Buffer<ffi::U8>> workspace) {
  DtypeCode d;
  if (!ent_dtype(x.element_type(), &d))
    return ffi::Error::InvalidArgument(std::string(kEnc) + ": x must be bfloat16 or float16");
  uint64_t rows, n, prow, nbytes, srow, four, wrow, wbytes;
  split_dims(x.dimensions(), &rows, &n);
  split_dims(payload->dimensions(), &prow, &nbytes);
  split_dims(stats->dimensions(), &srow, &four);
  split_dims(workspace->dimensions(), &wrow, &wbytes);
  if (n >= (1ull << 32))
    return ffi::Error::InvalidArgument(std::string(kEnc) + ": rows of >= 2^32 elements are not supported");
  const uint64_t want = max_nbytes(d, n), wneed = workspace_nbytes(n);
  if (prow != rows || nbytes != want)
    return ffi::Error::InvalidArgument(std::string(kEnc) + ": payload must be [" + str(rows) + ", " + str(want) +
                                       "] bytes, got [" + str(prow) + ", " + str(nbytes) + "]");
  if (srow != rows || four != 4)
    return ffi::Error::InvalidArgument(std::string(kEnc) + ": stats must be [" + str(rows) + ", 4]");
  if (ffi::Error e = ::zipccl::handler::check_skip(kEnc, skip.element_count(), rows); e.failure()) return e;
  if (wrow != rows || wbytes != wneed)
    return ffi::Error::InvalidArgument(std::string(kEnc) + ": workspace must be [" + str(rows) + ", " +
                                       str(wneed) + "] bytes, got [" + str(wrow) + ", " + str(wbytes) + "]");
  if (rows == 0) return ffi::Error::Success();
  if (rows > kMaxGrid || rows * num_blocks(n) > kMaxGrid)
    return ffi::Error::InvalidArgument(std::string(kEnc) + ": too many rows or blocks for one call");
  EncArgs a;
  a.x = static_cast<const uint16_t*>(x.untyped_data());
  a.out = payload->typed_data();
  a.ws = workspace->typed_data();
  if (!aligned(a.x, 2) || !aligned(a.ws, 16))
    return ffi::Error::InvalidArgument(std::string(kEnc) + ": x must be 2-byte and workspace 16-byte aligned");
  a.n = n;
  a.nb = num_blocks(n);
  a.out_row = nbytes;
  a.ws_row = wbytes;
  int32_t* st = stats->typed_data();
  ffi::Error e = d == kBF16 ? encode_launch<kBF16>(stream, a, rows, st) : encode_launch<kF16>(stream, a, rows, st);
  if (e.failure()) return e;
  return dev::launch_skip_stats(kEnc, stream, skip.typed_data(), st, rows);
}

ffi::Error EntropyDecodeCudaImpl(cudaStream_t stream, ffi::Buffer<ffi::U8> payload, ffi::Buffer<ffi::U8> skip,
                                 ffi::AnyBuffer fill, ffi::Result<ffi::AnyBuffer> y,
                                 ffi::Result<ffi::Buffer<ffi::S32>> status,
                                 ffi::Result<ffi::Buffer<ffi::U8>> workspace) {
  DtypeCode d;
  if (!ent_dtype(y->element_type(), &d))
    return ffi::Error::InvalidArgument(std::string(kDec) + ": output must be bfloat16 or float16");
  uint64_t rows, nbytes, yrows, n, wrow, wbytes;
  split_dims(payload.dimensions(), &rows, &nbytes);
  split_dims(y->dimensions(), &yrows, &n);
  split_dims(workspace->dimensions(), &wrow, &wbytes);
  if (yrows != rows)
    return ffi::Error::InvalidArgument(std::string(kDec) + ": payload has " + str(rows) +
                                       " rows but the output has " + str(yrows));
  if (status->element_count() != (size_t)rows)
    return ffi::Error::InvalidArgument(std::string(kDec) + ": status must have one entry per row");
  uint64_t group = 0;
  if (ffi::Error e = ::zipccl::handler::check_skip(kDec, skip.element_count(), rows); e.failure()) return e;
  if (ffi::Error e = ::zipccl::handler::check_fill(kDec, fill.element_type(), y->element_type(), fill.dimensions(), rows, n, &group);
      e.failure())
    return e;
  if (n >= (1ull << 32))
    return ffi::Error::InvalidArgument(std::string(kDec) + ": rows of >= 2^32 elements are not supported");
  const uint64_t wneed = workspace_nbytes(n);
  if (wrow != rows || wbytes != wneed)
    return ffi::Error::InvalidArgument(std::string(kDec) + ": workspace must be [" + str(rows) + ", " +
                                       str(wneed) + "] bytes, got [" + str(wrow) + ", " + str(wbytes) + "]");
  if (rows == 0) return ffi::Error::Success();
  if (rows > kMaxGrid || rows * num_blocks(n) > kMaxGrid)
    return ffi::Error::InvalidArgument(std::string(kDec) + ": too many rows or blocks for one call");
  DecArgs a;
  a.in = payload.typed_data();
  a.y = static_cast<uint16_t*>(y->untyped_data());
  a.ws = workspace->typed_data();
  if (!aligned(a.y, 2) || !aligned(a.ws, 16))
    return ffi::Error::InvalidArgument(std::string(kDec) + ": output must be 2-byte and workspace 16-byte aligned");
  a.L = nbytes;
  a.n = n;
  a.nb = num_blocks(n);
  a.ws_row = wbytes;
  a.nblk = rows * a.nb;
  int32_t* st = status->typed_data();
  ffi::Error e = d == kBF16 ? decode_launch<kBF16>(stream, a, rows, st) : decode_launch<kF16>(stream, a, rows, st);
  if (e.failure()) return e;
  return dev::launch_skip_fill(kDec, stream, skip.typed_data(), fill.untyped_data(), a.y, st, rows, 2 * n, group);
}

int warm_up_entropy() {
  return dev::for_each_device([] {
    cudaFuncAttributes attr;
    cudaFuncGetAttributes(&attr, ent_encode_kernel<kBF16>);
    cudaFuncGetAttributes(&attr, ent_encode_kernel<kF16>);
    cudaFuncGetAttributes(&attr, ent_encode_finalize<kBF16>);
    cudaFuncGetAttributes(&attr, ent_encode_finalize<kF16>);
    cudaFuncGetAttributes(&attr, ent_encode_tail);
    cudaFuncGetAttributes(&attr, ent_decode_rows<kBF16>);
    cudaFuncGetAttributes(&attr, ent_decode_rows<kF16>);
    cudaFuncGetAttributes(&attr, ent_decode_blocks<kBF16>);
    cudaFuncGetAttributes(&attr, ent_decode_blocks<kF16>);
#if !defined(ZIPCCL_SIMT_HOST)
    // ~14 one-warp CTAs of ~15 KB each per SM need the largest shared-memory carveout.
    cudaFuncSetAttribute(ent_decode_blocks<kBF16>, cudaFuncAttributePreferredSharedMemoryCarveout,
                         cudaSharedmemCarveoutMaxShared);
    cudaFuncSetAttribute(ent_decode_blocks<kF16>, cudaFuncAttributePreferredSharedMemoryCarveout,
                         cudaSharedmemCarveoutMaxShared);
#endif
    cudaFuncGetAttributes(&attr, ent_decode_finalize);
  });
}

}  // namespace gpu
}  // namespace ent
}  // namespace zipccl

namespace ffi = ::xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEntropyEncodeCuda, zipccl::ent::gpu::EntropyEncodeCudaImpl,
                              zipccl::handler::bind_encode(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEntropyDecodeCuda, zipccl::ent::gpu::EntropyDecodeCudaImpl,
                              zipccl::handler::bind_decode(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});
