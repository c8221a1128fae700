"""`python -m zipccl_jax` / the `zipccl-jax` script: see zipccl_jax/_src/cli.py."""
import sys

from zipccl_jax._src.cli import main

__all__ = ["main"]

if __name__ == "__main__":
  sys.exit(main())
