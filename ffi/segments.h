// Segmented rows: one codec call for many leaves, each coded as rows of its own
// (XLA FFI targets "zipccl_segments_encode" / "zipccl_segments_decode", CPU only).
//
// A planned collective over a pytree (zipccl_jax.jit, zipccl_jax/_src/segments.py)
// packs its leaves' rows side by side, rows x [R, M] with M = w_0 + .. + w_(L-1):
// segment i is columns [o_i, o_i + w_i) of every row, o_i = w_0 + .. + w_(i-1).
// Each segment of each row is coded as the row of w_i elements it would be alone
// (the codec's own row format, docs/format.md), and the wire row is the segments'
// slots side by side: one collective moves every leaf. Why: XLA:CPU's compile time
// grows faster than linearly with the number of ops in a program (measured: 1,600
// custom calls compiled in 1.4 s, 400 in 0.16 s), and a 200-leaf psum that codes
// leaf by leaf holds ~900 custom calls and ~1,200 collectives.
//
//   zipccl_segments_encode: x [R, M] (bf16 / f16 / f32), skip u8 [R]; attributes
//       codec s64 (1: the window codec, 2: entropy), widths s64 [L], slots s64 [L]
//       -> payload u8 [R, S], used s32 [L], S = the sum of wire(i):
//       slot_i > 0:  wire(i) = slot_i bytes: the row's first slot_i encoded bytes
//                    (zero past the used ones; a row whose used size exceeds slot_i
//                    is cut, and its decoder reports a failure);
//       slot_i = 0:  wire(i) = w_i words: the raw words, not encoded;
//       slot_i = -1: the raw words, and the segment encoded to measure it.
//       used[i] = the largest used size (units of 128 bytes) of segment i over the
//       rows not skipped (0 when slot_i = 0 or every row is skipped).
//       Raw segments are copied for every row; a skipped row's (skip[r] != 0) coded
//       segments are not coded, their payload bytes left unwritten.
//   zipccl_segments_decode: payload u8 [R, S], skip u8 [R], fill [F, M] of y's
//       dtype (F = 0, or F dividing R); attributes codec, widths, slots as encoded
//       -> y [R, M], status s32 [L]: segment i of row r decoded from its wire
//       bytes (slot_i > 0; its status is the codec's: nonzero = failed, the
//       segment all-one bits), or its raw words copied (every row); a skipped
//       row's coded segments copy their columns of fill row r / (R / F) (left
//       unwritten when F = 0). status[i] = the largest status of segment i over
//       the rows. (Raw segments take no fill: a transport's own row carries its
//       raw words on the wire, so the result is typed like the payload on every
//       platform, segments.decode_xla.)
//
// zipccl_row_pack (ffi/transport.h) makes x from the leaves' rows, zipccl_row_unpack
// cuts y back into them.
#pragma once

#include <stdint.h>

#include "xla/ffi/api/ffi.h"

namespace zipccl {
namespace segments {

constexpr const char* kEncodeTarget = "zipccl_segments_encode";
constexpr const char* kDecodeTarget = "zipccl_segments_decode";
constexpr int64_t kWindowCodec = 1;   // the codec ids of docs/format.md's row header
constexpr int64_t kEntropyCodec = 2;
constexpr int64_t kMeasure = -1;      // slot_i: raw words, encoded to measure

}  // namespace segments
}  // namespace zipccl

XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclSegmentsEncodeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclSegmentsDecodeCpu);
