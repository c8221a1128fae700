// The planned transport's mailbox on the CPU (contract: mailbox.h).
#include "mailbox.h"

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

ffi::Error MailboxCpuImpl(ffi::AnyBuffer x, ffi::RemainingArgs values, ffi::Result<ffi::AnyBuffer> out,
                          int64_t ledger, int64_t slot, int64_t column) {
  const std::string t = zipccl::mailbox::kMailboxTarget;
  if (out->size_bytes() != x.size_bytes())
    return ffi::Error::InvalidArgument(t + ": out must have x's size " + std::to_string(x.size_bytes()) +
                                       ", got " + std::to_string(out->size_bytes()) + " bytes");
  if (values.size() == 0) return ffi::Error::InvalidArgument(t + ": expected at least one value after x");
  // every operand first: nothing is recorded unless the whole call is valid
  for (size_t i = 0; i < values.size(); ++i) {
    auto v = values.get<ffi::Buffer<ffi::S32>>(i);
    if (v.has_error() || v->element_count() == 0)
      return ffi::Error::InvalidArgument(t + ": value " + std::to_string(i) + " must be a non-empty s32 array");
  }
  int64_t width = 1;
  if (ffi::Error e = zipccl::mailbox::column_width(values, column, &width); e.failure()) return e;
  const int64_t span = zipccl::mailbox::slots_spanned(values.size(), column, width);
  if (slot < 0 || slot + span > zipccl::mailbox::kMaxSlots)
    return ffi::Error::InvalidArgument(t + ": slots [" + std::to_string(slot) + ", " +
                                       std::to_string(slot + span) + ") must lie in [0, " +
                                       std::to_string(zipccl::mailbox::kMaxSlots) + ")");
  const int64_t k = (int64_t)values.size();
  for (int64_t i = 0; i < k; ++i) {
    auto v = values.get<ffi::Buffer<ffi::S32>>(i);
    const int32_t* p = v->typed_data();
    const int64_t n = (int64_t)v->element_count();
    if (column == zipccl::mailbox::kElementwise) {
      for (int64_t j = 0; j < width; ++j)
        zipccl::mailbox::record(ledger, slot + k * j + i, zipccl::mailbox::worst(p, n, j, width));
    } else {
      zipccl::mailbox::record(ledger, slot + i, zipccl::mailbox::worst(p, n, i == 0 ? column : -1, width));
    }
  }
  if (out->untyped_data() != x.untyped_data() && x.size_bytes())
    std::memcpy(out->untyped_data(), x.untyped_data(), x.size_bytes());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclMailboxCpu, MailboxCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()         // x [...]
                                  .RemainingArgs()               // K values s32 [...]
                                  .Ret<ffi::AnyBuffer>()         // x's bytes
                                  .Attr<int64_t>("ledger")
                                  .Attr<int64_t>("slot")
                                  .Attr<int64_t>("column"));     // -1, value 0's column, or -2 (elementwise)
