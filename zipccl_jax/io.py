"""Reading tensors from .npy, .npz and .safetensors files (used by the CLI and benchmarks).

See `iter_tensors`; every tensor comes back as a `Tensor` with an array (a dtype
the codecs take) or the reason it is skipped.
"""
from zipccl_jax._src.io import (
    SUPPORTED_SUFFIXES,
    Tensor,
    TensorFileError,
    check_path,
    iter_tensors,
    read_safetensors_header,
    subsample,
)

__all__ = ["SUPPORTED_SUFFIXES", "Tensor", "TensorFileError", "check_path", "iter_tensors",
           "read_safetensors_header", "subsample"]
