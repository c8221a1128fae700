"""The compressed collectives: public wrappers (api.py), implementations (impl.py),
autodiff (autodiff.py) and pytree buckets (buckets.py)."""
