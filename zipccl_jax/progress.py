"""The progress bar shared by the CLI and the examples (tqdm when installed)."""
from zipccl_jax._src.progress import progress_bar

__all__ = ["progress_bar"]
