"""zipccl_jax: lossless exponent compression for JAX collectives.

Encode bf16/fp16/fp32 tensors right before a collective and decode them right
after: the wire carries ~30% fewer bytes and the results are bit-identical (gathers,
permutes) or exactly specified and deterministic (reductions).

The collectives (`compressed_*`) are drop-ins for `jax.lax`'s inside
`jax.shard_map`; `zipccl_jax.jit` (a drop-in for `jax.jit`) plans their slots
ahead instead of agreeing on each call's size at run time. The codec-level API (`encode`, `decode`, `encode_rows`,
`decode_rows`, `analyze`) works on single tensors. `calibrate`, `decide` and
`project` are the cost model behind `policy="auto"`. Submodules:
`zipccl_jax.codecs` (the codec registry and contract), `zipccl_jax.costmodel` (the
cost model's details), `zipccl_jax.parallel` (compressed gradients for steps written
for `jax.jit` / `nnx.jit`: Flax linen and NNX), `zipccl_jax.io` (tensor files),
`zipccl_jax.progress`.
"""
from zipccl_jax import codecs
from zipccl_jax import costmodel
from zipccl_jax import parallel
from zipccl_jax._src.analysis import Analysis, analyze
from zipccl_jax._src.calibrate import calibrate
from zipccl_jax._src.calibration import Calibration, set_calibration
from zipccl_jax._src.codecs.api import Encoded, decode, decode_rows, encode, encode_rows
from zipccl_jax._src.collectives.api import (
    compressed_all_gather,
    compressed_all_to_all,
    compressed_pcast,
    compressed_ppermute,
    compressed_psum,
    compressed_psum_scatter,
)
from zipccl_jax._src.costmodel import project
from zipccl_jax._src.plan import decide
from zipccl_jax._src.ffi import has_cuda_support
from zipccl_jax._src.hlo import HloWireBytes, hlo_wire_bytes
from zipccl_jax._src.host import tune_host_allocator
from zipccl_jax._src.ladder import codec_ladder
from zipccl_jax._src.options import BUCKET_BYTES
from zipccl_jax._src.plan import AUTO_CODEC, AUTO_MIN_ROW_BYTES
from zipccl_jax._src.planned import jit
from zipccl_jax._src.stats import CollectiveStats

__version__ = "0.1.0"

__all__ = [
    # the collectives
    "compressed_all_gather",
    "compressed_all_to_all",
    "compressed_ppermute",
    "compressed_psum",
    "compressed_psum_scatter",
    "compressed_pcast",
    "jit",
    # one tensor
    "Analysis",
    "Encoded",
    "analyze",
    "decode",
    "decode_rows",
    "encode",
    "encode_rows",
    # the cost model
    "Calibration",
    "calibrate",
    "decide",
    "project",
    "set_calibration",
    # seeing what runs
    "CollectiveStats",
    "HloWireBytes",
    "codec_ladder",
    "hlo_wire_bytes",
    # defaults and the machine
    "AUTO_CODEC",
    "AUTO_MIN_ROW_BYTES",
    "BUCKET_BYTES",
    "has_cuda_support",
    "tune_host_allocator",
]
