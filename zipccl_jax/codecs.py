"""The codec registry and contract.

A codec is a module that implements the row contract (sizes as pure functions of
dtype and row length, `encode_rows`, `decode_rows`; docs/design.md, "The codec
contract"), registered under a name. Built in: "zipccl" (the window codec) and
"entropy". `get(name)` returns the registered `Codec`, whose attributes are the
module's contract functions, e.g. `get("zipccl").max_nbytes(dtype, n)`. `native()` is
the CPU extension module: both codecs on host (numpy) buffers, for tools and
benchmarks that time the codecs outside XLA.
"""
from zipccl_jax._src.codecs.api import decode_error_message
from zipccl_jax._src.codecs.registry import Codec, get, names, register, unregister
from zipccl_jax._src.ffi import native

__all__ = ["Codec", "decode_error_message", "get", "names", "native", "register", "unregister"]
