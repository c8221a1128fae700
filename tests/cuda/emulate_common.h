// Buffers shared by the SIMT-emulator drivers (tests/cuda/emulate_host.cc for
// cuda/codec.cu, tests/cuda/emulate_entropy.cc for cuda/entropy.cu): page-guarded,
// garbage-filled device buffers and XLA_FFI_Buffer views of them. Include after the
// kernel file (which brings in simt_host.h and the XLA FFI API).
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "xla/ffi/api/c_api.h"

namespace zipccl_emulate {

constexpr uint8_t kGarbage = 0xA5;

// A device buffer: `n` bytes ending 0..align-1 bytes before a PROT_NONE page (an
// `align`-aligned start, plus `shift` bytes), another PROT_NONE page in front,
// filled with garbage.
class DevBuf {
 public:
  explicit DevBuf(size_t n, size_t shift = 0, size_t align = 16) : n_(n) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t need = (n + shift + align - 1) / align * align;
    body_ = (need + page - 1) / page * page + (need ? 0 : page);
    map_ = body_ + 2 * page;
    base_ = (uint8_t*)mmap(nullptr, map_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base_ == MAP_FAILED) {
      perror("mmap");
      exit(2);
    }
    mprotect(base_, page, PROT_NONE);
    mprotect(base_ + page + body_, page, PROT_NONE);
    p_ = base_ + page + body_ - need + shift;
    memset(p_, kGarbage, n);
  }
  ~DevBuf() { munmap(base_, map_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  uint8_t* data() { return p_; }
  size_t size() const { return n_; }

 private:
  size_t n_, body_ = 0, map_ = 0;
  uint8_t* base_ = nullptr;
  uint8_t* p_ = nullptr;
};

// An XLA_FFI_Buffer over a DevBuf with shape [rows, last].
struct FfiBuf {
  int64_t dims[2];
  XLA_FFI_Buffer b;
  FfiBuf(XLA_FFI_DataType t, void* data, uint64_t rows, uint64_t last) {
    dims[0] = (int64_t)rows;
    dims[1] = (int64_t)last;
    b = XLA_FFI_Buffer{XLA_FFI_Buffer_STRUCT_SIZE, nullptr, t, data, 2, dims};
  }
};

}  // namespace zipccl_emulate
