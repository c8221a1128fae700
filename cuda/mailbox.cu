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

__global__ void record_kernel(int32_t* slot, const int32_t* value, int32_t* out) {
  atomicMax_system(slot, *value);
  *out = *value;
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

ffi::Error MailboxCudaImpl(cudaStream_t stream, ffi::Buffer<ffi::S32> value, ffi::Result<ffi::Buffer<ffi::S32>> out,
                           int64_t ledger, int64_t slot) {
  namespace zm = zipccl::mailbox;
  if (value.element_count() != 1 || out->element_count() != 1)
    return ffi::Error::InvalidArgument(std::string(zm::kMailboxTarget) + ": value and out must be one s32 each");
  if (slot < 0 || slot >= zm::kCudaSlots)
    return ffi::Error::InvalidArgument(std::string(zm::kMailboxTarget) + ": slot must be in [0, " +
                                       std::to_string(zm::kCudaSlots) + ") on CUDA, got " + std::to_string(slot));
  std::string err;
  zm::Table* t = zm::table(ledger, &err);
  if (!t) return ffi::Error::Internal(std::string(zm::kMailboxTarget) + ": " + err);
  zm::record_kernel<<<1, 1, 0, stream>>>(t->device + slot, value.typed_data(), out->typed_data());
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return ffi::Error::Internal(std::string(zm::kMailboxTarget) + ": " + cudaGetErrorString(e));
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclMailboxCuda, MailboxCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::Buffer<ffi::S32>>()              // value []
                                  .Ret<ffi::Buffer<ffi::S32>>()              // value []
                                  .Attr<int64_t>("ledger")
                                  .Attr<int64_t>("slot"),
                              {ffi::Traits::kCmdBufferCompatible});
