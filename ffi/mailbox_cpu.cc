// The planned transport's mailbox on the CPU (contract: mailbox.h).
#include "mailbox.h"

#include <algorithm>
#include <cstring>
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

ffi::Error MailboxCpuImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::S32> value, ffi::Result<ffi::AnyBuffer> out,
                          int64_t ledger, int64_t slot) {
  const std::string t = zipccl::mailbox::kMailboxTarget;
  if (out->size_bytes() != x.size_bytes())
    return ffi::Error::InvalidArgument(t + ": out must have x's size " + std::to_string(x.size_bytes()) +
                                       ", got " + std::to_string(out->size_bytes()) + " bytes");
  if (value.element_count() == 0) return ffi::Error::InvalidArgument(t + ": value must not be empty");
  const int32_t* v = value.typed_data();
  const int32_t worst = *std::max_element(v, v + value.element_count());
  if (!zipccl::mailbox::record(ledger, slot, worst))
    return ffi::Error::InvalidArgument(t + ": slot must be in [0, " + std::to_string(zipccl::mailbox::kMaxSlots) +
                                       "), got " + std::to_string(slot));
  if (out->untyped_data() != x.untyped_data() && x.size_bytes())
    std::memcpy(out->untyped_data(), x.untyped_data(), x.size_bytes());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclMailboxCpu, MailboxCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()         // x [...]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // value [...]
                                  .Ret<ffi::AnyBuffer>()         // x's bytes
                                  .Attr<int64_t>("ledger")
                                  .Attr<int64_t>("slot"));
