// Segmented rows on the CPU (contract: segments.h): each segment of each row goes
// through the codec's row coder (window_cpu.h, entropy_cpu.h) as a row of its own.
#include "segments.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "entropy_cpu.h"
#include "handler_common.h"
#include "window_cpu.h"

namespace ffi = xla::ffi;

namespace {

using zipccl::handler::split_dims;
using zipccl::handler::str;

// The call's layout, checked against the operands: per segment its width (elements),
// its column offset in x, its slot attribute and its wire offset and width (bytes).
struct Layout {
  int64_t codec;
  int wdtype;            // zipccl::DtypeCode (window codec) or zipccl::ent::DtypeCode
  uint64_t rows, m, esize, wire;
  std::vector<uint64_t> width, col, wire_off, wire_len, max_nbytes;
  std::vector<int64_t> slot;
};

ffi::Error invalid(const char* t, const std::string& what) { return zipccl::handler::invalid(t, what); }

ffi::Error dtype_of(const char* t, int64_t codec, ffi::DataType type, Layout* l) {
  zipccl::DtypeCode d;
  if (codec == zipccl::segments::kWindowCodec) {
    if (!zipccl::handler::dtype_code(type, &d)) return invalid(t, "the window codec takes bfloat16, float16 or float32");
    l->wdtype = d;
    l->esize = zipccl::elem_bytes_of(d);
    return ffi::Error::Success();
  }
  if (codec != zipccl::segments::kEntropyCodec) return invalid(t, "codec must be 1 (window) or 2 (entropy), got " + std::to_string(codec));
  if (type == ffi::DataType::BF16) l->wdtype = zipccl::ent::kBF16;
  else if (type == ffi::DataType::F16) l->wdtype = zipccl::ent::kF16;
  else return invalid(t, "the entropy codec takes bfloat16 or float16");
  l->esize = 2;
  return ffi::Error::Success();
}

uint64_t codec_max_nbytes(const Layout& l, uint64_t n) {
  if (l.codec == zipccl::segments::kWindowCodec) return zipccl::max_nbytes((zipccl::DtypeCode)l.wdtype, n);
  return zipccl::ent::max_nbytes((zipccl::ent::DtypeCode)l.wdtype, n);
}

// x: the dimensions of the rows [.., M]; checks the attributes against them.
ffi::Error layout(const char* t, int64_t codec, ffi::DataType type, ffi::Span<const int64_t> x,
                  ffi::Span<const int64_t> widths, ffi::Span<const int64_t> slots, Layout* l) {
  l->codec = codec;
  if (ffi::Error e = dtype_of(t, codec, type, l); e.failure()) return e;
  if (x.size() == 0) return invalid(t, "the rows must have at least one dimension");
  split_dims(x, &l->rows, &l->m);
  if (widths.size() == 0 || widths.size() != slots.size())
    return invalid(t, "widths and slots must be non-empty and as long as each other, got " + str(widths.size()) +
                          " and " + str(slots.size()));
  uint64_t col = 0, wire = 0;
  for (size_t i = 0; i < widths.size(); ++i) {
    const int64_t w = widths[i], s = slots[i];
    if (w < 0 || (uint64_t)w >= zipccl::handler::kMaxRowElems)
      return invalid(t, "widths[" + str(i) + "] must lie in [0, 2^32), got " + std::to_string(w));
    if (s < zipccl::segments::kMeasure || (w == 0 && s != 0))
      return invalid(t, "slots[" + str(i) + "] must be >= -1 (0 for an empty segment), got " + std::to_string(s));
    const uint64_t mx = s != 0 ? codec_max_nbytes(*l, (uint64_t)w) : 0;
    if (s > 0 && (uint64_t)s > mx)
      return invalid(t, "slots[" + str(i) + "] = " + std::to_string(s) + " exceeds the segment's max_nbytes " + str(mx));
    const uint64_t len = s > 0 ? (uint64_t)s : (uint64_t)w * l->esize;
    l->width.push_back((uint64_t)w);
    l->col.push_back(col);
    l->wire_off.push_back(wire);
    l->wire_len.push_back(len);
    l->max_nbytes.push_back(mx);
    l->slot.push_back(s);
    col += (uint64_t)w;
    wire += len;
  }
  if (col != l->m) return invalid(t, "widths add up to " + str(col) + ", the rows hold " + str(l->m));
  l->wire = wire;
  return ffi::Error::Success();
}

ffi::Error check_wire(const char* t, ffi::Span<const int64_t> payload, const Layout& l) {
  uint64_t prows, pbytes;
  split_dims(payload, &prows, &pbytes);
  if (payload.size() == 0 || prows != l.rows || pbytes != l.wire)
    return invalid(t, "payload must be [" + str(l.rows) + ", " + str(l.wire) + "] bytes, got [" + str(prows) + ", " +
                          str(pbytes) + "]");
  return ffi::Error::Success();
}

// One segment encoded into buf[0, max_nbytes); its used size (bytes).
uint64_t encode_one(const Layout& l, const uint8_t* x, uint64_t n, uint8_t* buf) {
  if (l.codec == zipccl::segments::kWindowCodec) {
    const auto d = (zipccl::DtypeCode)l.wdtype;
    const zipccl::cpu::RowStats s = zipccl::cpu::encode_row(d, x, n, zipccl::max_escape_capacity(d, n), buf);
    // a row that did not fit counts as larger than any slot (window_format.h's stats)
    return s.status == zipccl::kEncOk ? s.used_nbytes : zipccl::max_nbytes(d, n) + zipccl::kAlign;
  }
  return zipccl::ent::cpu::encode_row((zipccl::ent::DtypeCode)l.wdtype, reinterpret_cast<const uint16_t*>(x), n, buf)
      .used;
}

int32_t decode_one(const Layout& l, const uint8_t* in, uint64_t nbytes, uint64_t n, uint8_t* y) {
  if (l.codec == zipccl::segments::kWindowCodec)
    return zipccl::cpu::decode_row((zipccl::DtypeCode)l.wdtype, in, nbytes, n, y);
  return zipccl::ent::cpu::decode_row((zipccl::ent::DtypeCode)l.wdtype, in, nbytes, n, reinterpret_cast<uint16_t*>(y));
}

ffi::Error SegmentsEncodeImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::U8> skip, ffi::Result<ffi::Buffer<ffi::U8>> payload,
                              ffi::Result<ffi::Buffer<ffi::S32>> used, int64_t codec,
                              ffi::Span<const int64_t> widths, ffi::Span<const int64_t> slots) {
  const char* t = zipccl::segments::kEncodeTarget;
  Layout l;
  if (ffi::Error e = layout(t, codec, x.element_type(), x.dimensions(), widths, slots, &l); e.failure()) return e;
  if (ffi::Error e = check_wire(t, payload->dimensions(), l); e.failure()) return e;
  if (used->element_count() != l.width.size()) return invalid(t, "used must have one entry per segment");
  if (ffi::Error e = zipccl::handler::check_skip(t, skip.element_count(), l.rows); e.failure()) return e;
  const uint8_t* xb = static_cast<const uint8_t*>(x.untyped_data());
  const uint8_t* sk = skip.typed_data();
  uint8_t* out = payload->typed_data();
  int32_t* u = used->typed_data();
  std::vector<uint8_t> buf(*std::max_element(l.max_nbytes.begin(), l.max_nbytes.end()));
  for (size_t i = 0; i < l.width.size(); ++i) u[i] = 0;
  for (uint64_t r = 0; r < l.rows; ++r) {
    const uint8_t* row = xb + r * l.m * l.esize;
    uint8_t* wire = out + r * l.wire;
    for (size_t i = 0; i < l.width.size(); ++i) {
      const uint8_t* seg = row + l.col[i] * l.esize;
      if (l.slot[i] <= 0) std::memcpy(wire + l.wire_off[i], seg, l.wire_len[i]);   // every row
      if (l.slot[i] == 0 || sk[r]) continue;  // a skipped row's coded segments: unwritten
      const uint64_t units = encode_one(l, seg, l.width[i], buf.data()) / zipccl::kAlign;
      u[i] = std::max<int32_t>(u[i], (int32_t)std::min<uint64_t>(units, 0x7FFFFFFF));
      if (l.slot[i] > 0) std::memcpy(wire + l.wire_off[i], buf.data(), l.wire_len[i]);
    }
  }
  return ffi::Error::Success();
}

ffi::Error SegmentsDecodeImpl(ffi::Buffer<ffi::U8> payload, ffi::Buffer<ffi::U8> skip, ffi::AnyBuffer fill,
                              ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::Buffer<ffi::S32>> status, int64_t codec,
                              ffi::Span<const int64_t> widths, ffi::Span<const int64_t> slots) {
  const char* t = zipccl::segments::kDecodeTarget;
  Layout l;
  if (ffi::Error e = layout(t, codec, y->element_type(), y->dimensions(), widths, slots, &l); e.failure()) return e;
  if (ffi::Error e = check_wire(t, payload.dimensions(), l); e.failure()) return e;
  if (status->element_count() != l.width.size()) return invalid(t, "status must have one entry per segment");
  if (ffi::Error e = zipccl::handler::check_skip(t, skip.element_count(), l.rows); e.failure()) return e;
  uint64_t group = 0;
  if (ffi::Error e = zipccl::handler::check_fill(t, fill.element_type(), y->element_type(), fill.dimensions(), l.rows,
                                                 l.m, &group);
      e.failure())
    return e;
  const uint8_t* in = payload.typed_data();
  const uint8_t* sk = skip.typed_data();
  const uint8_t* fb = static_cast<const uint8_t*>(fill.untyped_data());
  uint8_t* yb = static_cast<uint8_t*>(y->untyped_data());
  int32_t* st = status->typed_data();
  const uint64_t row_bytes = l.m * l.esize;
  for (size_t i = 0; i < l.width.size(); ++i) st[i] = 0;
  for (uint64_t r = 0; r < l.rows; ++r) {
    uint8_t* out = yb + r * row_bytes;
    const uint8_t* wire = in + r * l.wire;
    for (size_t i = 0; i < l.width.size(); ++i) {
      uint8_t* seg = out + l.col[i] * l.esize;
      if (l.slot[i] <= 0) {   // raw words, of every row
        std::memcpy(seg, wire + l.wire_off[i], l.wire_len[i]);
      } else if (sk[r]) {     // the caller's own row: copied from fill, never decoded
        if (group) std::memcpy(seg, fb + ((r / group) * l.m + l.col[i]) * l.esize, l.width[i] * l.esize);
      } else {
        st[i] = std::max(st[i], decode_one(l, wire + l.wire_off[i], l.wire_len[i], l.width[i], seg));
      }
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclSegmentsEncodeCpu, SegmentsEncodeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()              // x [R, M]
                                  .Arg<ffi::Buffer<ffi::U8>>()        // skip [R]
                                  .Ret<ffi::Buffer<ffi::U8>>()        // payload [R, S]
                                  .Ret<ffi::Buffer<ffi::S32>>()       // used [L]
                                  .Attr<int64_t>("codec")
                                  .Attr<ffi::Span<const int64_t>>("widths")
                                  .Attr<ffi::Span<const int64_t>>("slots"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclSegmentsDecodeCpu, SegmentsDecodeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U8>>()        // payload [R, S]
                                  .Arg<ffi::Buffer<ffi::U8>>()        // skip [R]
                                  .Arg<ffi::AnyBuffer>()              // fill [F, M]
                                  .Ret<ffi::AnyBuffer>()              // y [R, M]
                                  .Ret<ffi::Buffer<ffi::S32>>()       // status [L]
                                  .Attr<int64_t>("codec")
                                  .Attr<ffi::Span<const int64_t>>("widths")
                                  .Attr<ffi::Span<const int64_t>>("slots"));
