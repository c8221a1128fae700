// "entropy" codec on the CPU: block encoder/decoder, rows, and the XLA FFI handlers
// (targets "zipccl_entropy_encode" / "zipccl_entropy_decode", platform "cpu").
//
// Format: docs/format.md ("Entropy codec (codec id 2)") and entropy_format.h. This
// file is the reference a CUDA port must reproduce byte for byte.
//
// Speed: a block's 8 bit streams are decoded interleaved (5 lookups per 64-bit
// refill in a 2048-entry table whose entries hold up to 3 symbols: about 2.85
// symbols a lookup on Gaussian data, ~4.6 instructions an element on bf16), so
// the latency of one stream's lookup chain hides behind the others. The encoder (AVX2 path) histograms and codes
// pairs of elements where a block's exponents span <= 32 values (kPairMaxR) and
// runs package-merge by sorting networks (pm_lists_net): ~8.6 instructions an
// element on Gaussian bf16. fp16 symbols carry the top mantissa
// bit (format version 4). Kind Z (zero elision, format version 3) compacts the
// raw words of nonzero elements and expands the decoded raw values by 8-lane
// byte shuffles (kZShuffles). Rows of >= kParallelMinElems elements are split
// across threads by whole blocks.
#include "entropy_cpu.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "cpu_handler.h"
#include "cpu_parallel.h"
#include "entropy_cpu_decode.h"  // block decoder
#include "entropy_cpu_encode.h"  // block encoder
#include "entropy_cpu_planes.h"  // ISA selection, constants, raw planes, kind Z
#include "env.h"
#include "handler_common.h"

namespace zipccl {
namespace ent {
namespace cpu {
namespace {

// ---------------------------------------------------------------------------------
// ISA dispatch.

template <DtypeCode D>
uint32_t encode_block_base(const uint16_t* x, uint32_t len, uint8_t* out, EncScratch& s, bool* raw) {
  return encode_block_impl<D, false>(x, len, out, s, raw);
}
template <DtypeCode D>
int32_t decode_block_base(const uint8_t* blk, uint32_t size, uint64_t avail, uint32_t len, uint16_t* y,
                          DecScratch& s) {
  return decode_block_impl<D, false>(blk, size, avail, len, y, s);
}
#if EZ_X86
template <DtypeCode D>
EZ_TARGET_FAST uint32_t encode_block_fast(const uint16_t* x, uint32_t len, uint8_t* out, EncScratch& s,
                                          bool* raw) {
  return encode_block_impl<D, true>(x, len, out, s, raw);
}
template <DtypeCode D>
EZ_TARGET_FAST int32_t decode_block_fast(const uint8_t* blk, uint32_t size, uint64_t avail, uint32_t len,
                                         uint16_t* y, DecScratch& s) {
  return decode_block_impl<D, true>(blk, size, avail, len, y, s);
}
#endif

template <DtypeCode D>
uint32_t encode_block(const uint16_t* x, uint32_t len, uint8_t* out, EncScratch& s, bool* raw) {
#if EZ_X86
  if (have_fast_isa()) return encode_block_fast<D>(x, len, out, s, raw);
#endif
  return encode_block_base<D>(x, len, out, s, raw);
}
template <DtypeCode D>
int32_t decode_block(const uint8_t* blk, uint32_t size, uint64_t avail, uint32_t len, uint16_t* y,
                     DecScratch& s) {
#if EZ_X86
  if (have_fast_isa()) return decode_block_fast<D>(blk, size, avail, len, y, s);
#endif
  return decode_block_base<D>(blk, size, avail, len, y, s);
}

// ---------------------------------------------------------------------------------
// Rows.

using ::zipccl::cpu_handler::zero_tail;  // the unused tail of a row (cpu_handler.h)

#if EZ_X86
// Zeroes [p, p + n) by 32-byte stores, 128 bytes a step.
EZ_TARGET_FAST void zero_small_fast(uint8_t* p, uint64_t n) {
  const __m256i z = _mm256_setzero_si256();
  uint8_t* const e = p + n;
  for (; e - p >= 128; p += 128) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), z);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 32), z);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 64), z);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 96), z);
  }
  std::memset(p, 0, (size_t)(e - p));
}
#endif

// The row's unused tail [used, max_nbytes): zero_tail for tails of at least
// kStreamZeroMin bytes (streaming stores, absent pages left to the kernel); a
// shorter one on the AVX2 path by plain 32-byte stores, what glibc's memset does
// there by `rep stosb` (the same work and time; the stores keep callgrind's
// instruction counts meaningful: it counts `rep stosb` per byte, ~0.7
// instructions per element of a 2^20-element row).
inline void zero_row_tail(uint8_t* p, uint64_t n) {
#if EZ_X86
  if (n < ::zipccl::cpu_handler::kStreamZeroMin && have_fast_isa()) {
    zero_small_fast(p, n);
    return;
  }
#endif
  zero_tail(p, n);
}

template <DtypeCode D>
RowStats encode_row_t(const uint16_t* x, uint64_t n, uint8_t* out) {
  const uint64_t nb = num_blocks(n);
  const uint64_t doff = data_offset(n);
  const uint64_t maxb = max_nbytes(D, n);
  std::memset(out, 0, doff);
  const int nt = n >= kParallelMinElems ? par::threads_for(nb, kMinBlocksPerThread) : 1;
  std::vector<uint64_t> tb(nt + 1), tbytes(nt, 0), traw(nt, 0);
  for (int t = 0; t <= nt; ++t) tb[t] = nb * (uint64_t)t / (uint64_t)nt;
  // Thread 0 writes in place and checksums its blocks while they are in cache;
  // the others write at their worst-case offsets and are moved down afterwards.
  uint64_t cs = 0, cs_end_word = doff / 4;
  par::parallel_for(nt, [&](int t) {
    std::unique_ptr<EncScratch> s(new EncScratch());  // zeroed: the histogram lanes
    uint8_t* base = out + doff + tb[t] * (uint64_t)max_block_bytes(kBlock);
    uint64_t off = 0, raws = 0;
    // Software prefetch (EncScratch::pf_in / pf_out): with 4 KiB pages the
    // hardware streamer restarts at every page and the symbol pass waited on DRAM
    // for the block's first lines. Block b prefetches block b + 2's input and the
    // 8 KiB from 8 KiB past its own start (about where blocks b + 1, b + 2 go);
    // near the ends its own input / output (always inside the buffers).
    const uint8_t* const xin = reinterpret_cast<const uint8_t*>(x);
    const uint64_t out_room = maxb - (uint64_t)(base - out);
    for (uint64_t b = tb[t]; b < tb[t + 1]; ++b) {
      const uint32_t len = block_len(n, b);
      const uint64_t pb = b + 2 < tb[t + 1] && block_len(n, b + 2) == kBlock ? b + 2 : b;
      s->pf_in = xin + 2 * pb * kBlock;
      s->pf_out = base + off + (off + 2 * kPfBytes <= out_room ? kPfBytes : 0);
      bool raw = false;
      const uint32_t sz = encode_block<D>(x + b * kBlock, len, base + off, *s, &raw);
      st16(out + kDirOff + 2 * b, sz);
      off += sz;
      raws += raw;
      if (t == 0) {
        const uint64_t w1 = (doff + off) / 4;
        cs += cs_words(out, cs_end_word, w1);
        cs_end_word = w1;
      }
    }
    tbytes[t] = off;
    traw[t] = raws;
  });
  uint64_t pos = doff + tbytes[0], raws = traw[0];
  for (int t = 1; t < nt; ++t) {
    std::memmove(out + pos, out + doff + tb[t] * (uint64_t)max_block_bytes(kBlock), tbytes[t]);
    pos += tbytes[t];
    raws += traw[t];
  }
  const uint64_t used = align128(pos);
  std::memset(out + pos, 0, used - pos);  // checksummed below: stays in cache
  zero_row_tail(out + used, maxb - used);
  // The rest of the checksum: the moved blocks and the padding (parallel), then the
  // header and directory.
  const uint64_t wrest = used / 4 - cs_end_word;
  const int nc = nt > 1 ? nt : 1;
  std::vector<uint64_t> part(nc, 0);
  par::parallel_for(nc, [&](int t) {
    const uint64_t a = cs_end_word + wrest * t / nc, b = cs_end_word + wrest * (t + 1) / nc;
    part[t] = cs_words(out, a, b);
  });
  for (int t = 0; t < nc; ++t) cs += part[t];
  st32(out + kOffMagic, kMagic);
  out[kOffVersion] = kVersion;
  out[kOffDtype] = (uint8_t)D;
  out[kOffCodec] = kCodecId;
  out[kOffStatus] = 0;
  st64(out + kOffN, n);
  st64(out + kOffUsed, used);
  out[kOffBlockLog2] = (uint8_t)kBlockLog2;
  out[kOffStreams] = (uint8_t)kStreams;
  out[kOffMaxLen] = (uint8_t)kMaxLen;
  st32(out + kOffRawBlocks, (uint32_t)raws);
  st64(out + kOffNumBlocks, nb);
  st64(out + kOffDataBytes, pos - doff);
  cs += cs_words(out, 0, doff / 4);  // checksum field is still zero here
  st64(out + kOffChecksum, cs);
  return RowStats{0, raws, used};
}

template <DtypeCode D>
int32_t decode_row_t(const uint8_t* in, uint64_t L, uint64_t n, uint16_t* y) {
  if (L < kHeaderBytes) return kDecBadSize;
  if (ld32(in + kOffMagic) != kMagic || in[kOffVersion] != kVersion || in[kOffCodec] != kCodecId)
    return kDecBadMagic;
  if (in[kOffDtype] != (uint8_t)D) return kDecBadDtype;
  const uint64_t used = ld64(in + kOffUsed);
  if (ld64(in + kOffN) != n || used % kAlign || used > L || used < min_nbytes(D, n) ||
      used > max_nbytes(D, n))
    return kDecBadSize;
  if (in[kOffStatus] == 1) return kDecNotDecodable;
  const uint64_t nb = num_blocks(n), doff = data_offset(n);
  const uint64_t data_bytes = ld64(in + kOffDataBytes);
  const uint64_t raw_blocks = ld32(in + kOffRawBlocks);
  bool ok = in[kOffStatus] == 0 && in[kOffBlockLog2] == kBlockLog2 && in[kOffStreams] == kStreams &&
            in[kOffMaxLen] == kMaxLen && in[35] == 0 && ld64(in + kOffNumBlocks) == nb &&
            raw_blocks <= nb && data_bytes <= used - doff && align128(doff + data_bytes) == used;
  for (uint64_t i = kDirOff + 2 * nb; i < doff && ok; ++i) ok = in[i] == 0;  // dir padding
  if (!ok) return kDecBadHeader;
  // Directory: block offsets, sizes within [4, max], their sum, the RAW count.
  std::vector<uint64_t> off(nb + 1);
  off[0] = doff;
  for (uint64_t b = 0; b < nb; ++b) {
    const uint32_t sz = ld16(in + kDirOff + 2 * b);
    if (sz < kBlockHead || sz > max_block_bytes(block_len(n, b))) return kDecBadTable;
    off[b + 1] = off[b] + sz;
    if (off[b + 1] > doff + data_bytes) return kDecBadTable;
  }
  if (off[nb] != doff + data_bytes) return kDecBadTable;

  const int nt = n >= kParallelMinElems ? par::threads_for(nb, kMinBlocksPerThread) : 1;
  std::vector<int32_t> tstat(nt, kDecOk);
  std::vector<uint64_t> tcs(nt, 0), traws(nt, 0);
  par::parallel_for(nt, [&](int t) {
    std::unique_ptr<DecScratch> s(new DecScratch);
    s->sig_n = ~0u;
    const uint64_t b0 = nb * (uint64_t)t / nt, b1 = nb * (uint64_t)(t + 1) / nt;
    uint64_t acc = 0, raws = 0;
    int32_t worst = kDecOk;
    for (uint64_t b = b0; b < b1; ++b) {
      raws += in[off[b]] == 0;
      // Software prefetch targets (DecScratch::pf_in / pf_out): the payload of
      // block b + 2 and the output of block b + 1 (4 KiB pages: the hardware
      // streamer restarts at every page). The rounds step them by 128 / 192 bytes
      // a round (<= 103 rounds a block), so near the row's end
      // they may point past the buffers: a prefetch never faults and changes no
      // memory.
      s->pf_in = in + off[std::min(b + 2, nb - 1)];
      s->pf_out = reinterpret_cast<uint8_t*>(y + std::min(b + 1, nb - 1) * kBlock);
      const int32_t st = decode_block<D>(in + off[b], (uint32_t)(off[b + 1] - off[b]), L - off[b],
                                         block_len(n, b), y + b * kBlock, *s);
      if (st != kDecOk && (worst == kDecOk || st < worst)) worst = st;
      if (worst == kDecBadTable) break;  // nothing reports lower
      // Checksum words [off_b / 4, off_b+1 / 4); the last block runs to used.
      const uint64_t w1 = (b + 1 == nb) ? used / 4 : off[b + 1] / 4;
      acc += cs_words(in, off[b] / 4, w1);
    }
    tstat[t] = worst;
    tcs[t] = acc;
    traws[t] = raws;
  });
  // The RAW count is a directory-level check (status 6), made here so that the
  // block starts are read while decoding rather than in a separate pass.
  uint64_t raws = 0;
  int32_t worst = kDecOk;
  for (int t = 0; t < nt; ++t) {
    raws += traws[t];
    if (tstat[t] != kDecOk && (worst == kDecOk || tstat[t] < worst)) worst = tstat[t];
  }
  if (raws != raw_blocks) return kDecBadTable;
  if (worst != kDecOk) return worst;
  uint64_t cs = 0;
  for (int t = 0; t < nt; ++t) cs += tcs[t];
  cs += cs_words(in, 0, kOffChecksum / 4) + cs_words(in, kOffChecksum / 4 + 2, doff / 4);
  if (nb == 0) cs += cs_words(in, doff / 4, used / 4);
  if (cs != ld64(in + kOffChecksum)) return kDecBadChecksum;
  return kDecOk;
}

}  // namespace

RowStats encode_row(DtypeCode d, const uint16_t* x, uint64_t n, uint8_t* out) {
  return d == kBF16 ? encode_row_t<kBF16>(x, n, out) : encode_row_t<kF16>(x, n, out);
}

int32_t decode_row(DtypeCode d, const uint8_t* in, uint64_t nbytes, uint64_t n, uint16_t* y) {
  const int32_t st = d == kBF16 ? decode_row_t<kBF16>(in, nbytes, n, y) : decode_row_t<kF16>(in, nbytes, n, y);
  if (st != kDecOk) std::memset(y, 0xFF, 2 * n);
  return st;
}

}  // namespace cpu
}  // namespace ent
}  // namespace zipccl

// ---------------------------------------------------------------------------------
// XLA FFI handlers. x [..., n] -> payload u8 [..., max_nbytes], stats s32 [..., 4] =
// (status, raw blocks, used_nbytes / 128, 0), workspace u8 [..., W] (unused on the
// CPU). Decode: payload u8 [..., L] -> y [..., n], status s32 [...], workspace.

namespace ffi = xla::ffi;

namespace {

namespace zent = zipccl::ent;

bool ent_dtype(ffi::DataType t, zent::DtypeCode* d) {
  switch (t) {
    case ffi::DataType::BF16: *d = zent::kBF16; return true;
    case ffi::DataType::F16: *d = zent::kF16; return true;
    default: return false;
  }
}

using zipccl::cpu_handler::advise_hugepages;
using zipccl::handler::split_dims;
using zipccl::handler::str;

ffi::Error EntropyEncodeImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::U8> skip, ffi::Result<ffi::Buffer<ffi::U8>> payload,
                             ffi::Result<ffi::Buffer<ffi::S32>> stats,
                             ffi::Result<ffi::Buffer<ffi::U8>> workspace) {
  zent::DtypeCode d;
  if (!ent_dtype(x.element_type(), &d))
    return ffi::Error::InvalidArgument("zipccl_entropy_encode: x must be bfloat16 or float16");
  uint64_t rows, n, prow, nbytes, srow, four;
  split_dims(x.dimensions(), &rows, &n);
  split_dims(payload->dimensions(), &prow, &nbytes);
  split_dims(stats->dimensions(), &srow, &four);
  if (n >= (1ull << 32))
    return ffi::Error::InvalidArgument("zipccl_entropy_encode: rows of >= 2^32 elements are not supported");
  const uint64_t want = zent::max_nbytes(d, n);
  if (prow != rows || nbytes != want)
    return ffi::Error::InvalidArgument("zipccl_entropy_encode: payload must be [" + str(rows) + ", " +
                                       str(want) + "] bytes, got [" + str(prow) + ", " + str(nbytes) + "]");
  if (srow != rows || four != 4)
    return ffi::Error::InvalidArgument("zipccl_entropy_encode: stats must be [" + str(rows) + ", 4]");
  if (ffi::Error e = zipccl::handler::check_skip("zipccl_entropy_encode", skip.element_count(), rows); e.failure())
    return e;
  const uint8_t* sk = skip.typed_data();
  const uint16_t* xw = static_cast<const uint16_t*>(x.untyped_data());
  uint8_t* out = payload->typed_data();
  advise_hugepages(out, rows * nbytes);
  int32_t* st = stats->typed_data();
  for (uint64_t r = 0; r < rows; ++r) {
    if (sk[r]) {  // not needed by the caller (handler_common.h): unwritten, stats zero
      for (int k = 0; k < 4; ++k) st[4 * r + k] = 0;
      continue;
    }
    const zent::cpu::RowStats s = zent::cpu::encode_row(d, xw + r * n, n, out + r * nbytes);
    st[4 * r] = s.status;
    st[4 * r + 1] = (int32_t)std::min<uint64_t>(s.raw_blocks, 0x7FFFFFFF);
    st[4 * r + 2] = (int32_t)std::min<uint64_t>(s.used / zent::kAlign, 0x7FFFFFFF);
    st[4 * r + 3] = 0;
  }
  return ffi::Error::Success();
}

ffi::Error EntropyDecodeImpl(ffi::Buffer<ffi::U8> payload, ffi::Buffer<ffi::U8> skip, ffi::AnyBuffer fill,
                             ffi::Result<ffi::AnyBuffer> y,
                             ffi::Result<ffi::Buffer<ffi::S32>> status,
                             ffi::Result<ffi::Buffer<ffi::U8>> workspace) {
  zent::DtypeCode d;
  if (!ent_dtype(y->element_type(), &d))
    return ffi::Error::InvalidArgument("zipccl_entropy_decode: output must be bfloat16 or float16");
  uint64_t rows, nbytes, yrows, n;
  split_dims(payload.dimensions(), &rows, &nbytes);
  split_dims(y->dimensions(), &yrows, &n);
  if (yrows != rows)
    return ffi::Error::InvalidArgument("zipccl_entropy_decode: payload has " + str(rows) +
                                       " rows but the output has " + str(yrows));
  if (status->element_count() != (size_t)rows)
    return ffi::Error::InvalidArgument("zipccl_entropy_decode: status must have one entry per row");
  if (n >= (1ull << 32))
    return ffi::Error::InvalidArgument("zipccl_entropy_decode: rows of >= 2^32 elements are not supported");
  const uint8_t* in = payload.typed_data();
  uint16_t* yw = static_cast<uint16_t*>(y->untyped_data());
  advise_hugepages(yw, rows * n * 2);
  int32_t* st = status->typed_data();
  uint64_t group = 0;
  if (ffi::Error e = zipccl::handler::check_skip("zipccl_entropy_decode", skip.element_count(), rows); e.failure())
    return e;
  if (ffi::Error e = zipccl::handler::check_fill("zipccl_entropy_decode", fill.element_type(), y->element_type(),
                                                 fill.dimensions(), rows, n, &group);
      e.failure())
    return e;
  const uint8_t* sk = skip.typed_data();
  const uint16_t* fw = static_cast<const uint16_t*>(fill.untyped_data());
  for (uint64_t r = 0; r < rows; ++r) {
    if (sk[r]) {  // the caller's own row: copied from fill, never decoded
      if (n && group) std::memcpy(yw + r * n, fw + (r / group) * n, n * 2);
      st[r] = 0;
      continue;
    }
    st[r] = zent::cpu::decode_row(d, in + r * nbytes, nbytes, n, yw + r * n);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEntropyEncodeCpu, EntropyEncodeImpl,
                              zipccl::handler::bind_encode(ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclEntropyDecodeCpu, EntropyDecodeImpl,
                              zipccl::handler::bind_decode(ffi::Ffi::Bind()));
