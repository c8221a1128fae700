"""The benchmarks of zipccl_jax (not part of the installed package).

Run them from a checkout: `python benchmarks/codec.py` or `python -m benchmarks.codec`
(see README.md, "Benchmarks"). Results go to benchmarks/results/.
"""
