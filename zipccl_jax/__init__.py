"""zipccl_jax: lossless exponent compression for JAX collectives.

Encode bf16/fp16/fp32 tensors right before a collective and decode right after:
the wire carries ~30% fewer bytes and the results are bit-identical (gathers,
permutes) or exactly specified and deterministic (reductions).

Public API: the collectives (`compressed_*`), the codec (`encode`, `decode`, and
the row-level contract `encode_rows` / `decode_rows` that the collectives use),
`analyze`, `hlo_wire_bytes`; submodules `zipccl_jax.io` (tensor files) and
`zipccl_jax.progress` (the progress bar of the CLI and the examples).
"""
from zipccl_jax._src.analysis import Analysis, analyze
from zipccl_jax._src.codec import (
    BLOCK,
    CODECS,
    DEFAULT_ESCAPE_RATE,
    FORMAT_VERSION,
    Encoded,
    decode,
    decode_error_message,
    decode_rows,
    default_escape_capacity,
    encode,
    encode_rows,
    encoded_nbytes,
    max_nbytes,
    min_nbytes,
    workspace_nbytes,
)
from zipccl_jax._src.collectives import (
    compressed_all_gather,
    compressed_all_to_all,
    compressed_ppermute,
    compressed_psum,
    compressed_psum_scatter,
)
from zipccl_jax._src.costmodel import (
    Calibration,
    calibrate,
    decide,
    project,
    set_calibration,
)
from zipccl_jax._src.ffi import has_cuda_support, native
from zipccl_jax._src.hlo import HloWireBytes, hlo_wire_bytes
from zipccl_jax._src.host import tune_host_allocator
from zipccl_jax._src.options import AUTO_CODEC, AUTO_MIN_ROW_BYTES
from zipccl_jax._src.options import BUCKET_BYTES
from zipccl_jax._src.options import codec_ladder
from zipccl_jax._src.registry import Codec, get as get_codec, names as codec_names
from zipccl_jax._src.registry import register as register_codec
from zipccl_jax._src.registry import unregister as unregister_codec
from zipccl_jax._src.stats import CollectiveStats
from zipccl_jax._src.transport import ladder as slot_ladder

__version__ = "0.1.0"

__all__ = [
    "AUTO_CODEC",
    "AUTO_MIN_ROW_BYTES",
    "BUCKET_BYTES",
    "BLOCK",
    "CODECS",
    "DEFAULT_ESCAPE_RATE",
    "FORMAT_VERSION",
    "Analysis",
    "Codec",
    "Calibration",
    "CollectiveStats",
    "Encoded",
    "HloWireBytes",
    "analyze",
    "codec_ladder",
    "codec_names",
    "calibrate",
    "compressed_all_gather",
    "compressed_all_to_all",
    "compressed_ppermute",
    "compressed_psum",
    "compressed_psum_scatter",
    "decode",
    "decide",
    "decode_error_message",
    "decode_rows",
    "default_escape_capacity",
    "encode",
    "encode_rows",
    "encoded_nbytes",
    "get_codec",
    "has_cuda_support",
    "hlo_wire_bytes",
    "max_nbytes",
    "min_nbytes",
    "native",
    "register_codec",
    "slot_ladder",
    "project",
    "set_calibration",
    "tune_host_allocator",
    "unregister_codec",
    "workspace_nbytes",
]
