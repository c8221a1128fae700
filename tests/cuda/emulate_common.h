// Buffers shared by the SIMT-emulator drivers (tests/cuda/emulate_window.cc for
// cuda/window.cu, tests/cuda/emulate_entropy.cc for cuda/entropy.cu): page-guarded,
// garbage-filled device buffers, XLA_FFI_Buffer views of them, and one handler
// call through them. Include after the
// kernel file (which brings in simt_host.h and the XLA FFI API).
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <random>
#include <string>
#include <vector>

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

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

// The drivers' command line, [--quick] [--stop]: --quick clears *big (no large
// cases), --stop sets *stop (end at the first failure). False, after the usage
// line, for anything else.
inline bool parse_args(int argc, char** argv, bool* big, bool* stop) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      *big = false;
    } else if (a == "--stop") {
      *stop = true;
    } else {
      fprintf(stderr, "usage: %s [--quick] [--stop]\n", argv[0]);
      return false;
    }
  }
  return true;
}

// Where a device buffer lies: `shift` bytes past an `align`-aligned start (DevBuf).
struct Place {
  size_t shift = 0, align = 16;
};

// The skip mask and fill of one handler call (ffi/handler_common.h): skip == nullptr
// means no row is skipped; fill has fill_rows rows of the output's row shape.
struct SkipFill {
  const uint8_t* skip = nullptr;
  const void* fill = nullptr;
  uint64_t fill_rows = 0;
};

// An encode handler (the signature of gpu::EncodeCudaImpl / EntropyEncodeCudaImpl) on
// the emulated GPU: x [rows, n] of `elem`-byte words (dtype t) -> out [rows, nbytes],
// stats [rows, 4], through fresh guarded buffers (workspace [rows, W]); machine() runs
// just before the call. Returns false (after printing) if the handler returned an error.
// sf: the rows to skip (default: none).
template <typename Impl, typename Machine>
bool call_encode(Impl impl, Machine machine, XLA_FFI_DataType t, const void* x, size_t elem, Place xp, uint64_t rows,
                 uint64_t n, uint64_t nbytes, uint64_t W, uint8_t* out, int32_t* stats, SkipFill sf = {}) {
  namespace ffi = ::xla::ffi;
  DevBuf dx(rows * n * elem, xp.shift, xp.align), dp(rows * nbytes), ds(rows * 16), dw(rows * W), dk(rows);
  memcpy(dx.data(), x, dx.size());
  if (sf.skip) memcpy(dk.data(), sf.skip, dk.size()); else memset(dk.data(), 0, dk.size());
  FfiBuf fx(t, dx.data(), rows, n), fp(XLA_FFI_DataType_U8, dp.data(), rows, nbytes),
      fs(XLA_FFI_DataType_S32, ds.data(), rows, 4), fw(XLA_FFI_DataType_U8, dw.data(), rows, W),
      fk(XLA_FFI_DataType_U8, dk.data(), rows, 1);
  machine();
  const ffi::Error e = impl(nullptr, ffi::AnyBuffer(&fx.b), ffi::Buffer<ffi::U8>(&fk.b), ffi::Buffer<ffi::U8>(&fp.b),
                            ffi::Buffer<ffi::S32>(&fs.b), ffi::Buffer<ffi::U8>(&fw.b));
  if (e.failure()) {
    printf("encode handler error: %s\n", e.message().c_str());
    return false;
  }
  memcpy(out, dp.data(), dp.size());
  memcpy(stats, ds.data(), ds.size());
  return true;
}

// A decode handler (gpu::DecodeCudaImpl / EntropyDecodeCudaImpl) on the emulated GPU:
// payload in [rows, L] -> y [rows, n] of `elem`-byte words (dtype t), status [rows].
// sf: the rows to skip and their fill (default: none, fill [0, n]); y's skipped rows
// start as garbage, so a row the handler leaves alone shows.
template <typename Impl, typename Machine>
bool call_decode(Impl impl, Machine machine, XLA_FFI_DataType t, const uint8_t* in, Place pp, uint64_t rows,
                 uint64_t L, uint64_t n, size_t elem, Place yp, uint64_t W, void* y, int32_t* status,
                 SkipFill sf = {}) {
  namespace ffi = ::xla::ffi;
  DevBuf dp(rows * L, pp.shift, pp.align), dy(rows * n * elem, yp.shift, yp.align), ds(rows * 4), dw(rows * W),
      dk(rows), df(sf.fill_rows * n * elem);
  memcpy(dp.data(), in, dp.size());
  if (sf.skip) memcpy(dk.data(), sf.skip, dk.size()); else memset(dk.data(), 0, dk.size());
  if (sf.fill_rows) memcpy(df.data(), sf.fill, df.size());
  FfiBuf fp(XLA_FFI_DataType_U8, dp.data(), rows, L), fy(t, dy.data(), rows, n),
      fw(XLA_FFI_DataType_U8, dw.data(), rows, W), fk(XLA_FFI_DataType_U8, dk.data(), rows, 1),
      ff(t, sf.fill_rows ? df.data() : nullptr, sf.fill_rows, n);
  int64_t sdim[1] = {(int64_t)rows};
  XLA_FFI_Buffer fs{XLA_FFI_Buffer_STRUCT_SIZE, nullptr, XLA_FFI_DataType_S32, ds.data(), 1, sdim};
  machine();
  const ffi::Error e = impl(nullptr, ffi::Buffer<ffi::U8>(&fp.b), ffi::Buffer<ffi::U8>(&fk.b), ffi::AnyBuffer(&ff.b),
                            ffi::AnyBuffer(&fy.b), ffi::Buffer<ffi::S32>(&fs), ffi::Buffer<ffi::U8>(&fw.b));
  if (e.failure()) {
    printf("decode handler error: %s\n", e.message().c_str());
    return false;
  }
  memcpy(y, dy.data(), dy.size());
  memcpy(status, ds.data(), ds.size());
  return true;
}

// Skipped rows through a codec's CUDA handlers (cuda/device_util.h): x [rows, n] of
// `elem`-byte words whose CPU encoding is ref [rows, nbytes] with stats ref_stats
// [rows, 4]. A random mask (>= 1 row skipped) must leave the coded rows' bytes and
// stats as without it and zero the skipped rows' stats; the decoder, given garbage
// in the skipped rows' payload, must return status 0 for them and copy in their fill
// row (F = rows and F = 1), or leave them alone with F = 0; the other rows decode
// exactly. enc(skip, out, stats) and dec(in, sf, y, status) call the handlers.
// Returns false after printing the first difference.
template <typename Enc, typename Dec>
bool check_skipped_rows(const char* name, Enc enc, Dec dec, const void* x, size_t elem, uint64_t rows, uint64_t n,
                        uint64_t nbytes, const uint8_t* ref, const int32_t* ref_stats, std::mt19937_64& rng) {
  std::vector<uint8_t> skip(rows);
  for (uint64_t r = 0; r < rows; ++r) skip[r] = (uint8_t)(rng() % 2);
  skip[rng() % rows] = 1;
  std::vector<uint8_t> out(rows * nbytes, kGarbage);
  std::vector<int32_t> st(4 * rows, -7);
  if (!enc(skip.data(), out.data(), st.data())) return printf("FAIL skip encode %s: handler error\n", name), false;
  for (uint64_t r = 0; r < rows; ++r) {
    const int32_t zero[4] = {0, 0, 0, 0};
    const int32_t* want = skip[r] ? zero : ref_stats + 4 * r;
    if (memcmp(want, st.data() + 4 * r, 16) != 0 ||
        (!skip[r] && memcmp(ref + r * nbytes, out.data() + r * nbytes, nbytes) != 0))
      return printf("FAIL skip encode %s row %llu (skipped %d): stats or bytes differ\n", name,
                    (unsigned long long)r, skip[r]),
             false;
  }
  std::vector<uint8_t> in(ref, ref + rows * nbytes);
  for (uint64_t r = 0; r < rows; ++r)
    if (skip[r]) memset(in.data() + r * nbytes, 0xFF, nbytes);  // not decodable: the skip must matter
  std::vector<uint8_t> fill(rows * n * elem);
  for (uint8_t& b : fill) b = (uint8_t)rng();
  const uint64_t row_bytes = n * elem;
  const uint8_t* xb = static_cast<const uint8_t*>(x);
  for (uint64_t F : {rows, (uint64_t)1, (uint64_t)0}) {
    std::vector<uint8_t> y(rows * row_bytes, 0x11);
    std::vector<int32_t> status(rows, -1);
    if (!dec(in.data(), SkipFill{skip.data(), fill.data(), F}, y.data(), status.data()))
      return printf("FAIL skip decode %s F=%llu: handler error\n", name, (unsigned long long)F), false;
    for (uint64_t r = 0; r < rows; ++r) {
      const uint8_t* want = !skip[r] ? xb + r * row_bytes : F ? fill.data() + (r / (rows / F)) * row_bytes : nullptr;
      if (status[r] != 0 || (want && memcmp(want, y.data() + r * row_bytes, row_bytes) != 0))
        return printf("FAIL skip decode %s F=%llu row %llu (skipped %d): status %d or words differ\n", name,
                      (unsigned long long)F, (unsigned long long)r, skip[r], status[r]),
               false;
    }
  }
  return true;
}

}  // namespace zipccl_emulate
