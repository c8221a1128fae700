"""The codecs: the contract (base.py), the registry, the window and entropy codecs,
and the tensor-level API (api.py)."""
