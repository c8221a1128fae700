// The planned transport's mailbox on the CPU (contract: mailbox.h).
#include "mailbox.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>

namespace ffi = xla::ffi;

namespace zipccl {
namespace mailbox {
namespace {

std::mutex mu;
std::unordered_map<int64_t, std::vector<int32_t>>& tables() {
  static auto* t = new std::unordered_map<int64_t, std::vector<int32_t>>();  // never destroyed
  return *t;
}

}  // namespace

bool record(int64_t ledger, int64_t slot, int32_t value) {
  if (slot < 0 || slot >= kMaxSlots) return false;
  std::lock_guard<std::mutex> lock(mu);
  std::vector<int32_t>& t = tables()[ledger];
  if ((int64_t)t.size() <= slot) t.resize(slot + 1, -1);
  t[slot] = std::max(t[slot], value);
  return true;
}

std::vector<int32_t> take(int64_t ledger) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = tables().find(ledger);
  if (it == tables().end()) return {};
  std::vector<int32_t> out = std::move(it->second);
  tables().erase(it);
  return out;
}

}  // namespace mailbox
}  // namespace zipccl

namespace {

ffi::Error MailboxCpuImpl(ffi::Buffer<ffi::S32> value, ffi::Result<ffi::Buffer<ffi::S32>> out, int64_t ledger,
                          int64_t slot) {
  if (value.element_count() != 1 || out->element_count() != 1)
    return ffi::Error::InvalidArgument(std::string(zipccl::mailbox::kMailboxTarget) +
                                       ": value and out must be one s32 each");
  const int32_t v = *value.typed_data();
  if (!zipccl::mailbox::record(ledger, slot, v))
    return ffi::Error::InvalidArgument(std::string(zipccl::mailbox::kMailboxTarget) + ": slot must be in [0, " +
                                       std::to_string(zipccl::mailbox::kMaxSlots) + "), got " +
                                       std::to_string(slot));
  *out->typed_data() = v;
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclMailboxCpu, MailboxCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()  // value []
                                  .Ret<ffi::Buffer<ffi::S32>>()  // value []
                                  .Attr<int64_t>("ledger")
                                  .Attr<int64_t>("slot"));
