"""The few JAX APIs the collectives use whose spelling moves between versions.

Supported: jax >= 0.10.2 (Python 3.11's last release) and 0.11.x (the GPU
machine). Everything version-sensitive is here so that collectives.py reads
like plain JAX.
"""
from __future__ import annotations

import contextlib
import contextvars
import time

import jax
from jax import lax

try:
  from jax._src import distributed as _distributed   # the coordinator's client
except ImportError:  # pragma: no cover
  _distributed = None


def check_vma_enabled() -> bool:
  """True when shard_map tracks varying manual axes (check_vma=True, the default).

  Decides the transpose of psum, as JAX does: with vma tracking the cotangent of
  a psum is only re-typed as varying (no communication); without it JAX
  transposes psum to another psum.
  """
  try:
    from jax._src import config as _config  # pylint: disable=g-import-not-at-top
    return bool(_config._check_vma.value)  # pylint: disable=protected-access
  except (ImportError, AttributeError):  # pragma: no cover - future JAX
    return True


def backends_started() -> bool | None:
  """Whether JAX has created its backends (device clients and their thread pools);
  None when this JAX does not say."""
  try:
    from jax._src import xla_bridge as _xb  # pylint: disable=g-import-not-at-top
    return bool(_xb.backends_are_initialized())
  except (ImportError, AttributeError):  # pragma: no cover - future JAX
    return None


def trace_context():
  """The key of the calling thread's jax configuration that tracing depends on (its
  thread-local settings included; jax.jit keys its cache with it), or None when this
  JAX does not say. Two threads with equal keys trace a function alike."""
  try:
    from jax._src import config as _config  # pylint: disable=g-import-not-at-top
    return _config.trace_context()
  except (ImportError, AttributeError):  # pragma: no cover - future JAX
    return None


def thread_local_config() -> dict | None:
  """The calling thread's jax settings made by context managers (e.g.
  `jax.default_device`, `jax.default_matmul_precision`): name -> value, or None
  when this JAX does not say."""
  try:
    from jax._src import config as _config  # pylint: disable=g-import-not-at-top
    unset = _config.config_ext.unset
    return {name: s.get_local() for name, s in _config.config_states.items()
            if s.get_local() is not unset}
  except (ImportError, AttributeError):  # pragma: no cover - future JAX
    return None


@contextlib.contextmanager
def thread_local_config_applied(values: dict):
  """Runs the block with `values` (`thread_local_config` of another thread) set on
  this thread, as their context managers would, and restores this thread's after."""
  from jax._src import config as _config  # pylint: disable=g-import-not-at-top
  swapped = []
  try:
    for name, value in values.items():
      state = _config.config_states[name]
      swapped.append((state, state.swap_local(value)))
      if state._update_thread_local_hook:  # pylint: disable=protected-access
        state._update_thread_local_hook(value)  # pylint: disable=protected-access
    yield
  finally:
    for state, prev in reversed(swapped):
      state.set_local(prev)
      if state._update_thread_local_hook:  # pylint: disable=protected-access
        state._update_thread_local_hook(None if prev is _config.config_ext.unset else prev)  # pylint: disable=protected-access


def tangent_mode(tangent) -> str:
  """How JAX will use the tangent a custom_jvp rule is called with.

  "reverse": jax.grad / jax.vjp / jax.linearize at the top level or under an outer
  jit: the tangents are unknown values of a partial-evaluation trace (JaxprTracer);
  the tangent map is recorded and transposed, so it must be transposable ops.
  "either": the rule is being traced into the JVP jaxpr of a jit, checkpoint
  (remat) or scan (DynamicJaxprTracer tangents). JAX caches that jaxpr and either
  runs it forward (jax.jvp of the jit) or partially evaluates and transposes it
  (jax.grad of the jit): both must work.
  "forward": jax.jvp / jax.jacfwd with ordinary (or batched) values.
  A future JAX without these classes answers "either".
  """
  try:
    from jax._src.interpreters import partial_eval as _pe  # pylint: disable=g-import-not-at-top
    if isinstance(tangent, _pe.JaxprTracer):
      return "reverse"
    if isinstance(tangent, _pe.DynamicJaxprTracer):
      return "either"
    return "forward"
  except (ImportError, AttributeError):  # pragma: no cover - future JAX
    return "either"


def linear_call(fun, fun_transpose, residual_args, linear_args):
  """jax.custom_derivatives.linear_call: fun(res, x), linear in x, whose transpose is
  fun_transpose(res, ct); with a batching rule (`_register_linear_call_batcher`) so
  that jax.vmap / jax.jacfwd over it work."""
  from jax import custom_derivatives  # pylint: disable=g-import-not-at-top
  _register_linear_call_batcher()
  return custom_derivatives.linear_call(fun, fun_transpose, residual_args, linear_args)


_LINEAR_CALL_BATCHER = []   # [True] once registered (or found), [False] if JAX's internals differ


def _register_linear_call_batcher() -> bool:
  """Gives JAX's linear_call primitive a batching rule when it has none (jax 0.10-0.12).

  The rule moves every operand's batch dimension to the front (broadcasting the
  unbatched ones), batches the callee jaxpr with every input and output batched at
  0, and batches the transpose the same way when JAX asks for it (its constants
  stay unbatched): the result is again a linear_call, so a vmap of a grad
  transposes it too. Only JAX's internal batching API is used; where it differs
  (a future JAX), nothing is registered and a vmap over the call gets JAX's own
  error -- never a wrong result. A rule JAX brings itself is kept.
  """
  if _LINEAR_CALL_BATCHER:
    return _LINEAR_CALL_BATCHER[0]
  try:
    from jax._src import custom_derivatives as _cd  # pylint: disable=g-import-not-at-top
    from jax._src.interpreters import batching as _b  # pylint: disable=g-import-not-at-top
    from jax._src.interpreters import partial_eval as _pe  # pylint: disable=g-import-not-at-top
    prim = _cd.linear_call_p
    if prim in _b.fancy_primitive_batchers:
      _LINEAR_CALL_BATCHER.append(True)
      return True

    def batcher(axis_data, vals, dims, *, callee, transpose_thunk, num_callee_consts,
                num_res):
      vals = [_b.bdim_at_front(v, d, axis_data.size) for v, d in zip(vals, dims)]
      b_callee, _ = _b.batch_jaxpr(callee, axis_data, [True] * len(vals), True)
      n_out = len(callee.out_avals)

      @_pe._memoize  # pylint: disable=protected-access
      def b_thunk():
        t_jaxpr, t_consts = transpose_thunk()
        bt, _ = _b.batch_jaxpr(t_jaxpr, axis_data,
                               [False] * len(t_consts) + [True] * (num_res + n_out), True)
        return bt, t_consts

      outs = prim.bind(*vals, callee=b_callee, transpose_thunk=b_thunk,
                       num_callee_consts=num_callee_consts, num_res=num_res)
      return outs, [0] * len(outs)

    _b.fancy_primitive_batchers[prim] = batcher
    _LINEAR_CALL_BATCHER.append(True)
  except (ImportError, AttributeError):  # pragma: no cover - future JAX
    _LINEAR_CALL_BATCHER.append(False)
  return _LINEAR_CALL_BATCHER[0]


def varying_axes(x) -> frozenset:
  """The manual mesh axes over which x is typed varying (empty outside shard_map)."""
  aval = jax.typeof(x)
  mat = getattr(aval, "mat", None)
  if mat is not None:
    return frozenset(getattr(mat, "varying", ()) or ())
  return frozenset(getattr(aval, "vma", ()) or ())  # pragma: no cover - older spelling


def reduced_axes(x) -> frozenset:
  """The mesh axes over which x is typed reduced or unreduced (JAX's types for
  sums pending or done across an axis); empty where JAX has no such types."""
  try:
    mat = getattr(jax.typeof(x), "mat", None)
  except TypeError:
    return frozenset()
  if mat is None:
    return frozenset()
  return frozenset(getattr(mat, "reduced", ()) or ()) | frozenset(getattr(mat, "unreduced", ()) or ())


def struct_varying(s) -> tuple:
  """The manual axes over which a jax.eval_shape result is typed varying."""
  mat = getattr(s, "manual_axis_type", None)
  if mat is not None:
    return tuple(sorted(getattr(mat, "varying", ()) or ()))
  return tuple(sorted(getattr(s, "vma", ()) or ()))


def pvary(x, axes: tuple):
  """Types x as varying over `axes` (no data movement); a no-op where it already is.

  Collectives over `axes` need a varying operand; JAX inserts this cast itself for
  lax collectives, and we must do it before our custom_vjp so that its transpose
  (a psum over the axes x was invariant in) is JAX's, not ours.
  """
  if not check_vma_enabled():
    return x
  missing = tuple(a for a in axes if a not in varying_axes(x))
  if not missing:
    return x
  pcast = getattr(lax, "pcast", None)
  if pcast is not None:
    return pcast(x, missing, to="varying")
  return lax.pvary(x, missing)  # pragma: no cover - older spelling


def all_gather_invariant(x, axes: tuple, *, axis: int = 0, tiled: bool = False):
  """lax.all_gather whose result is typed invariant over `axes` (same HLO all-gather).

  Every participant then holds the same bytes *and* the type says so, which lets
  a `lax.cond` predicate computed from them be used with collectives (trap 2 of
  docs/jax-notes.md) and keeps stats invariant.
  """
  if not check_vma_enabled():
    return lax.all_gather(x, axes, axis=axis, tiled=tiled)
  try:
    return lax.all_gather(x, axes, axis=axis, tiled=tiled, to="invarying")
  except TypeError:  # pragma: no cover - a JAX without `to=`
    return lax.all_gather(x, axes, axis=axis, tiled=tiled)


def axis_size(axes: tuple) -> int:
  """Static size of the (product of the) named mesh axes; NameError when unbound."""
  return int(lax.axis_size(axes))


def mesh_platform() -> str:
  """The platform ("cpu", "gpu", ...) of the devices of the mesh being traced.

  Inside shard_map over a concrete Mesh the abstract mesh names its devices'
  platform; otherwise (an abstract mesh, outside shard_map, or a JAX that does
  not say) the default backend's. Read at trace time for static bookkeeping only
  (the bytes stats report); what runs is chosen by lax.platform_dependent.
  """
  try:
    dev = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    plat = getattr(dev, "platform", None)
  except (AttributeError, ValueError):  # pragma: no cover - older / future JAX
    plat = None
  plat = str(plat or jax.default_backend()).lower()
  return "gpu" if plat in ("cuda", "rocm", "gpu") else plat


def platform_dependent(*args, cpu, default):
  """lax.platform_dependent(*args, cpu=cpu, default=default), resolved while tracing
  when the mesh being traced names its devices' platform (shard_map over a concrete
  Mesh): only that branch is traced. lax.platform_dependent traces every branch and
  costs ~2 ms of tracing per call, a large share of a compressed call's trace time;
  the transport calls it several times per call. Elsewhere (an abstract mesh, no
  mesh) the lowering platform decides, as lax does. A program traced on a CPU mesh
  and exported for CUDA keeps the CPU branches: their custom calls have CUDA
  handlers under the same names (ffi/transport.h).
  """
  try:
    dev = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    plat = getattr(dev, "platform", None)
  except (AttributeError, ValueError):  # pragma: no cover - older / future JAX
    plat = None
  if plat is None:
    return lax.platform_dependent(*args, cpu=cpu, default=default)
  return cpu(*args) if str(plat).lower() == "cpu" else default(*args)


def mesh_axis_names() -> tuple:
  """The axis names of the mesh being traced, in mesh order (empty when unknown)."""
  try:
    return tuple(jax.sharding.get_abstract_mesh().axis_names)
  except (AttributeError, ValueError):  # pragma: no cover - older / future JAX
    return ()


def _unclamped_switch():
  """jax's internal switch (no clamp of the index), or None where its signature is
  not the one this shim knows (then `switch_in_range` uses lax.switch)."""
  try:
    import inspect  # pylint: disable=g-import-not-at-top
    from jax._src.lax.control_flow import conditionals as _c  # pylint: disable=g-import-not-at-top
    fn = _c._switch_internal  # pylint: disable=protected-access
    params = list(inspect.signature(fn).parameters)
  except (ImportError, AttributeError, TypeError, ValueError):  # pragma: no cover - future JAX
    return None
  return fn if params == ["index", "branches", "operands", "branches_platforms"] else None


def switch_in_range(index, branches, *operands):
  """lax.switch(index, branches, *operands) for an int32 index known to be in
  [0, len(branches)) (the ladder's rung: `transport.rung_index` counts rungs).

  lax.switch clamps its index first; the clamp of a custom call's result is a
  kernel of its own for XLA:CPU to compile (an ad hoc estimate: ~9 ms of the all-gather's ~55;
  docs/design.md), and XLA's conditional already runs the last branch for an index out
  of range. So this calls JAX's switch without the clamp where the JAX in use has
  it (jax 0.10.2, 0.11.2 and 0.12.0), and lax.switch otherwise: the
  same branch either way.
  """
  branches = tuple(branches)
  fn = _unclamped_switch() if len(branches) > 1 else None
  if fn is None:
    return lax.switch(index, branches, *operands)
  return fn(index, branches, operands, branches_platforms=None)


# From this many processes on, an exchange waits at a barrier and reads every value
# with one directory read (3 coordinator round trips whatever the count) instead of
# one blocking read per process: measured on one host, 4 processes 2.0 ms instead of
# 2.5-3.0, 8 processes 3.6 ms instead of 9.3; 2 processes 0.9 ms instead of 0.7.
EXCHANGE_BARRIER_FROM = 4


def exchange_across_processes(key: str, value: bytes, timeout_s: float,
                              forget: str | None = None) -> list | None:
  """Every process's `value` under `key`, in process order, through the
  jax.distributed coordinator's key-value store (host to host: no device
  collective, so it can run while a function is being traced). None outside a
  multi-process job. A process that does not publish within timeout_s raises, on
  every process, naming the processes that did not.

  Cost: one set, then either one blocking get per other process (fewer than
  EXCHANGE_BARRIER_FROM processes), or a barrier and one directory read (the
  barrier's id is the key's first component, reused by every exchange of that
  channel: the exchanges of a channel run in the same order on every process);
  within `exchanges_watched`, directory reads until every value is there.

  forget: a directory of earlier exchanges' keys ("a/b" for keys "a/b/..."), deleted
  by process 0 once this exchange completes. Safe when every key under it belongs
  to an exchange before this one: every process has published `key`, so every
  process has finished reading those. A job exchanging every step passes one such
  directory now and then (`planned_exchange.Exchanges.blobs`), keeping the store O(1)
  without a delete round trip per step.

  The client is JAX's (jax._src.distributed, no public spelling).
  """
  client = _client()
  if client is None:
    return None
  me, count = jax.process_index(), jax.process_count()
  # overwrite: a process may publish again under a key whose exchange it left
  # unfinished (calibration_agreement.check_agreement_once after a failed trace)
  client.key_value_set_bytes(f"zipccl_jax/{key}/{me}", value, allow_overwrite=True)
  watch = _watch.get()
  if watch is not None:
    out = _exchange_watched(key, count, timeout_s, watch)
  elif count >= EXCHANGE_BARRIER_FROM:
    out = _exchange_by_barrier(client, key, count, timeout_s)
  else:
    out = []
    for i in range(count):
      if i == me:   # one coordinator round trip fewer
        out.append(value)
        continue
      try:
        out.append(client.blocking_key_value_get_bytes(f"zipccl_jax/{key}/{i}", int(timeout_s * 1000)))
      except Exception as e:  # a timeout or a coordinator error, with the process named
        raise _not_published([i], key, timeout_s, e) from None
  if forget is not None and me == 0:
    client.key_value_delete(f"zipccl_jax/{forget}")   # a directory: every key under it
  return out


def _not_published(missing, key: str, timeout_s: float, cause=None) -> RuntimeError:
  """The error of an exchange that processes `missing` did not publish to in time."""
  why = f": {cause}" if cause is not None else ""
  return RuntimeError(f"zipccl_jax: processes {missing} did not publish {key!r} within "
                      f"{timeout_s:.0f} s (they have not reached the same point of the program{why})")


def _client():
  """The jax.distributed client of a multi-process job, else None."""
  client = getattr(getattr(_distributed, "global_state", None), "client", None)
  return None if client is None or jax.process_count() == 1 else client


class ExchangeAbandoned(RuntimeError):
  """A wait of `exchange_across_processes` ended by its `exchanges_watched` check."""


# A check that the waits of `exchange_across_processes` poll (`exchanges_watched`):
# None, or the text of the error that ends the wait.
_watch: contextvars.ContextVar = contextvars.ContextVar("zipccl_jax_exchange_watch", default=None)


@contextlib.contextmanager
def exchanges_watched(check):
  """Within it, on this thread, an exchange (`exchange_across_processes`) waits by
  polling the coordinator's store and calls check() between polls: when it returns an
  error text (the processes waited for will not come: they failed elsewhere and said
  so in the store), the wait ends with that error (`ExchangeAbandoned`) instead of
  its timeout.
  For waits that happen once (those inside a trace), not per step: polling costs a
  round trip every 10-200 ms, where the barrier of many processes costs three."""
  token = _watch.set(check)
  try:
    yield
  finally:
    _watch.reset(token)


def peek_across_processes(key: str) -> dict:
  """{process: value} of what the processes have published under `key` so far (one
  directory read; no wait). Empty outside a multi-process job."""
  client = _client()
  if client is None:
    return {}
  return {int(k.rsplit("/", 1)[-1]): v for k, v in client.key_value_dir_get_bytes(f"zipccl_jax/{key}/")}


def _exchange_watched(key: str, count: int, timeout_s: float, watch) -> list:
  """The values of `exchange_across_processes` by polling its directory, with
  watch() (-> error text or None) between polls."""
  deadline, pause = time.monotonic() + timeout_s, 0.01
  while True:
    got = peek_across_processes(key)
    if len(got) == count:
      return [got[i] for i in range(count)]
    error = watch()
    if error is not None:
      raise ExchangeAbandoned(error)
    if time.monotonic() > deadline:
      raise _not_published(sorted(set(range(count)) - set(got)), key, timeout_s)
    time.sleep(pause)
    pause = min(0.2, 2 * pause)


def _exchange_by_barrier(client, key: str, count: int, timeout_s: float) -> list:
  """The values of `exchange_across_processes` after a barrier: one directory read."""
  try:
    client.wait_at_barrier(f"zipccl_jax/exchange/{key.split('/')[0]}", int(timeout_s * 1000))
  except Exception as e:  # a timeout or a coordinator error: name who is missing
    try:
      seen = set(peek_across_processes(key))
    except Exception:  # the coordinator itself failed
      seen = set()
    raise _not_published(sorted(set(range(count)) - seen) or "unknown", key, timeout_s, e) from None
  got = peek_across_processes(key)
  if sorted(got) != list(range(count)):
    raise RuntimeError(f"zipccl_jax: the exchange {key!r} found values of processes {sorted(got)}, "
                       f"expected 0..{count - 1}")
  return [got[i] for i in range(count)]
