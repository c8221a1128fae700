// The planned transport's mailbox on CUDA GPUs (contract: ffi/mailbox.h). A ledger
// is a table of mapped pinned host memory; a call records by one thread's system-wide
// atomic max into it, so the step neither copies nor synchronises, and the host
// reads the table after the step's outputs are ready.
#include <cuda_runtime.h>
#include <stdint.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "mailbox.h"
#include "mailbox_cuda.h"

namespace ffi = xla::ffi;

namespace zipccl {
namespace mailbox {
namespace {

// Slots per ledger on CUDA (a fixed table: the device cannot grow it): 1 MiB of
// pinned memory per ledger.
constexpr int64_t kCudaSlots = 1 << 18;

struct Table {
  int32_t* host = nullptr;    // mapped pinned memory, kCudaSlots entries
  int32_t* device = nullptr;  // the same memory as the device sees it
};

std::mutex mu;
std::unordered_map<int64_t, Table>& tables() {
  static auto* t = new std::unordered_map<int64_t, Table>();  // never destroyed
  return *t;
}

// The ledger's table, allocated (all -1) on first use; nullptr on a CUDA error.
Table* table(int64_t ledger, std::string* err) {
  std::lock_guard<std::mutex> lock(mu);
  Table& t = tables()[ledger];
  if (t.host) return &t;
  void* p = nullptr;
  cudaError_t e = cudaHostAlloc(&p, kCudaSlots * sizeof(int32_t), cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) {
    *err = cudaGetErrorString(e);
    return nullptr;
  }
  t.host = static_cast<int32_t*>(p);
  for (int64_t i = 0; i < kCudaSlots; ++i) t.host[i] = -1;
  e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&t.device), p, 0);
  if (e != cudaSuccess) {
    *err = cudaGetErrorString(e);
    return nullptr;
  }
  return &t;
}

// One thread: the values are a site's few rows (an encoder's stats, the statuses).
// Elementwise (column = kElementwise): value column j into slot[stride * j].
__global__ void record_kernel(int32_t* slot, const int32_t* value, int64_t count, int64_t column,
                              int64_t width, int64_t stride) {
  if (column != kElementwise) {
    atomicMax_system(slot, worst(value, count, column, width));
    return;
  }
  for (int64_t j = 0; j < width; ++j) atomicMax_system(slot + stride * j, worst(value, count, j, width));
}

}  // namespace

std::vector<int32_t> take_cuda(int64_t ledger) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = tables().find(ledger);
  if (it == tables().end() || !it->second.host) return {};
  int32_t* h = it->second.host;
  int64_t used = kCudaSlots;
  while (used > 0 && h[used - 1] == -1) --used;
  std::vector<int32_t> out(h, h + used);
  for (int64_t i = 0; i < used; ++i) h[i] = -1;
  return out;
}

}  // namespace mailbox
}  // namespace zipccl

namespace {

ffi::Error MailboxCudaImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::RemainingArgs values,
                           ffi::Result<ffi::AnyBuffer> out, int64_t ledger, int64_t slot, int64_t column) {
  namespace zm = zipccl::mailbox;
  const std::string t = zm::kMailboxTarget;
  if (out->size_bytes() != x.size_bytes())
    return ffi::Error::InvalidArgument(t + ": out must have x's size " + std::to_string(x.size_bytes()) +
                                       ", got " + std::to_string(out->size_bytes()) + " bytes");
  if (values.size() == 0) return ffi::Error::InvalidArgument(t + ": expected at least one value after x");
  for (size_t i = 0; i < values.size(); ++i) {
    auto v = values.get<ffi::Buffer<ffi::S32>>(i);
    if (v.has_error() || v->element_count() == 0)
      return ffi::Error::InvalidArgument(t + ": value " + std::to_string(i) + " must be a non-empty s32 array");
  }
  int64_t width = 1;
  if (ffi::Error e = zm::column_width(values, column, &width); e.failure()) return e;
  const int64_t span = zm::slots_spanned(values.size(), column, width);
  if (slot < 0 || slot + span > zm::kCudaSlots)
    return ffi::Error::InvalidArgument(t + ": slots [" + std::to_string(slot) + ", " +
                                       std::to_string(slot + span) + ") must lie in [0, " +
                                       std::to_string(zm::kCudaSlots) + ") on CUDA");
  std::string err;
  zm::Table* tab = zm::table(ledger, &err);
  if (!tab) return ffi::Error::Internal(t + ": " + err);
  cudaError_t e = cudaSuccess;
  for (size_t i = 0; i < values.size() && e == cudaSuccess; ++i) {
    auto v = values.get<ffi::Buffer<ffi::S32>>(i);
    zm::record_kernel<<<1, 1, 0, stream>>>(tab->device + slot + i, v->typed_data(), (int64_t)v->element_count(),
                                           column == zm::kElementwise ? column : i == 0 ? column : -1, width,
                                           (int64_t)values.size());
    e = cudaGetLastError();
  }
  if (e == cudaSuccess && out->untyped_data() != x.untyped_data() && x.size_bytes())
    e = cudaMemcpyAsync(out->untyped_data(), x.untyped_data(), x.size_bytes(), cudaMemcpyDeviceToDevice, stream);
  if (e != cudaSuccess) return ffi::Error::Internal(t + ": " + cudaGetErrorString(e));
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclMailboxCuda, MailboxCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::AnyBuffer>()                     // x [...]
                                  .RemainingArgs()                           // K values s32 [...]
                                  .Ret<ffi::AnyBuffer>()                     // x's bytes
                                  .Attr<int64_t>("ledger")
                                  .Attr<int64_t>("slot")
                                  .Attr<int64_t>("column"),                  // -1, value 0's column, or -2
                              {ffi::Traits::kCmdBufferCompatible});
