// The base revision's entropy row codec as benchmarks/entropy_ab.cc and
// entropy_same.cc see it: entropy_base.sh compiles the base's ffi/entropy_cpu.cc
// with the namespace zipccl renamed to zbase, so both revisions link into one
// binary. Keep in step with ffi/entropy_cpu.h.
#pragma once

#include <stdint.h>
#include <stdio.h>

#include <string>
#include <vector>

namespace zbase {
namespace ent {
enum DtypeCode : uint8_t { kBF16 = 1, kF16 = 2 };
namespace cpu {
struct RowStats {
  uint8_t status;
  uint64_t raw_blocks;
  uint64_t used;
};
RowStats encode_row(zbase::ent::DtypeCode d, const uint16_t* x, uint64_t n, uint8_t* out);
int32_t decode_row(zbase::ent::DtypeCode d, const uint8_t* in, uint64_t nbytes, uint64_t n, uint16_t* y);
}  // namespace cpu
}  // namespace ent

// A row file written by entropy_base.sh's write_rows: little-endian u16 words, its
// dtype in the name's suffix (".fp16", else bf16). False when it cannot be read.
inline bool read_row(const std::string& path, bool* fp16, std::vector<uint16_t>* x) {
  *fp16 = path.size() > 5 && path.substr(path.size() - 5) == ".fp16";
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) return false;
  uint16_t w;
  x->clear();
  while (fread(&w, 2, 1, f) == 1) x->push_back(w);
  fclose(f);
  return true;
}
}  // namespace zbase
