"""JAX helpers shared by the tests (tests/reference.py holds the numpy oracles)."""
import jax


def smap(mesh, in_specs, out_specs, **kw):
  """A decorator: f jitted as a shard_map over mesh with these specs."""
  return lambda f: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **kw))
