"""Row operations the transports share: word views and byte copies of rows, a
prefix cut, the largest used size of encoded rows, pieces of a bucket's rows, and
the all-to-all of rows (on CPU as N - 1 collective permutes). Each is a custom call
on CPU backends, where XLA:CPU would compile the slice, copy or reduction into a
kernel of its own (compile time grows with every kernel), and plain XLA ops
elsewhere, with the same bits (docs/design.md, "Transport: the slot ladder")."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from zipccl_jax._src import compat
from zipccl_jax._src import dtypes
from zipccl_jax._src import ffi as _ffi
from zipccl_jax._src.codecs import base


def bits(x):
  """Same-width unsigned view: the wire dtype of the uncompressed path."""
  return lax.bitcast_convert_type(x, dtypes.info(x.dtype).word)


def unbits(u, dtype):
  return lax.bitcast_convert_type(u, dtype)


def unpack(x, widths):
  """x[..., T] cut along its last axis into pieces [..., w] of the given widths (from
  offset 0; sum(widths) <= T): a bucket's rows back into its leaves' rows.

  A custom call on CPU backends ("zipccl_row_unpack", ffi/transport.h): as slices,
  XLA:CPU compiles a kernel per leaf (~6 ms each). Elsewhere XLA slices."""
  widths = [int(w) for w in widths]

  def on_cpu(v):
    outs = [base.result_type(v.shape[:-1] + (w,), v.dtype, v) for w in widths]
    _ffi.register()
    return tuple(jax.ffi.ffi_call("zipccl_row_unpack", outs, vmap_method="broadcast_all")(v))

  def sliced(v):
    offs = np.concatenate([[0], np.cumsum(widths)]).tolist()
    return tuple(v[..., a:b] for a, b in zip(offs[:-1], offs[1:]))

  return compat.platform_dependent(x, cpu=on_cpu, default=sliced)



def _bitcast(x, dtype, shape):
  """x's bytes as dtype[shape] by XLA ops (bitcast_convert_type and reshapes)."""
  dtype = np.dtype(dtype)
  a, b = x.dtype.itemsize, dtype.itemsize
  if a < b:   # narrower words: the last axis groups b // a of them
    return lax.bitcast_convert_type(x.reshape(shape + (b // a,)), dtype)
  return lax.bitcast_convert_type(x, dtype).reshape(shape)


def copy_as(x, dtype, shape=None):
  """x's bytes as an array dtype[shape] (default: x's shape; the same byte size).

  On CPU backends a custom call ("zipccl_bitcast_copy", ffi/transport_cpu.cc)
  copies the bytes: XLA:CPU compiles a bf16 <-> u16 (or u8) bitcast_convert into a
  copy kernel of its own, one LLVM compile each (the raw rung's two views were two
  of the ladder's kernels). Elsewhere the bitcast_convert_type; same bits.
  """
  shape = tuple(x.shape) if shape is None else tuple(shape)
  dtype = np.dtype(dtype)
  if x.dtype == dtype and tuple(x.shape) == shape:
    return x
  if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != x.size * x.dtype.itemsize:
    raise ValueError(f"copy_as: {dtype}{list(shape)} does not hold the {x.size * x.dtype.itemsize} "
                     f"bytes of {x.dtype}{list(x.shape)}")

  def on_cpu(v):
    return base.call_target("zipccl_bitcast_copy", shape, dtype, v, v, vmap_method="broadcast_all")

  return compat.platform_dependent(x, cpu=on_cpu, default=lambda v: _bitcast(v, dtype, shape))


USED_COLUMN = 2   # an encoder's stats rows s32[R, 4]: the column of a row's used size


@jax.custom_batching.custom_vmap
def used_max(st):
  """max(0, st[:, USED_COLUMN]) of an encoder's stats rows s32[R, 4] (used sizes, units of 128 B).

  A custom call on CPU backends ("zipccl_used_max"): the slice and reduction
  would be a kernel of their own for XLA:CPU to compile. Elsewhere jnp.max.

  Under jax.vmap the maximum is taken over the batch as well and is not batched
  (`_used_max_vmap`): every batch member then moves on the same rung, one switch,
  instead of a batched switch index, which JAX turns into running every rung's
  collectives and selecting (and the custom call has no batched form).
  """
  def on_cpu(v):   # "sequential": where JAX batches the call itself (see below)
    return base.call_target("zipccl_used_max", (), jnp.int32, v, v, vmap_method="sequential")

  return compat.platform_dependent(st, cpu=on_cpu, default=lambda v: jnp.max(v[:, USED_COLUMN], initial=0))


@used_max.def_vmap
def _used_max_vmap(axis_size, in_batched, st):
  del axis_size
  if in_batched[0]:   # [B, R, 4] -> [B * R, 4]: the batch's rows are rows like any other
    st = st.reshape(-1, st.shape[-1])
  return used_max(st), False


def row_prefix(payload, slot: int):
  """payload[..., :slot], the operand of a rung's collective.

  On CPU backends a custom call ("zipccl_row_prefix", ffi/transport_cpu.cc) makes
  the copy: XLA:CPU compiles every slice into its own kernel, ~15 ms of compile
  time per rung, while a custom call compiles to nothing. Other backends slice
  (a GPU compiles a slice fast; the target's CUDA handler, cuda/transport.cu, only
  keeps programs lowered for CPU and GPU at once compiling). Same bytes either way.
  """
  if slot == payload.shape[-1]:
    return payload

  def on_cpu(p):
    return base.call_target("zipccl_row_prefix", p.shape[:-1] + (slot,), jnp.uint8, p, p,
                   vmap_method="broadcast_all")

  return compat.platform_dependent(payload, cpu=on_cpu, default=lambda p: p[..., :slot])


def a2a_by_permutes() -> bool:
  """Whether an all-to-all ladder traced now runs its rungs as N - 1 permutes
  (`a2a_slot`'s CPU path): the static bookkeeping of the bytes it hands to XLA
  (stats), read from the traced mesh's platform."""
  return compat.mesh_platform() == "cpu"


def a2a_rows_sent(n_peers: int) -> int:
  """Rows an all-to-all hands to XLA per device: N - 1 by permutes (the own row
  stays here), N otherwise."""
  return n_peers - 1 if n_peers > 1 and a2a_by_permutes() else n_peers


def _permute_index(axes):
  """(axes in mesh order, index): index[t] is the ppermute index over those axes of
  the peer whose lax.axis_index(axes) is t.

  lax.all_to_all and lax.axis_index over a tuple of axes number the peers in the
  tuple's order; lax.ppermute (jax 0.10) numbers them in mesh order whatever the
  tuple's order (measured: over ("b", "a") of an ("a", "b") mesh a shift by one
  reached the wrong peers). The permutes therefore run over the axes sorted into
  mesh order, where every convention agrees, with the pairs translated.
  """
  names = (axes,) if isinstance(axes, str) else tuple(axes)
  order = compat.mesh_axis_names()
  canon = tuple(sorted(names, key=order.index)) if all(a in order for a in names) else names
  sizes = {a: compat.axis_size((a,)) for a in names}
  index = []
  for t in range(int(np.prod([sizes[a] for a in names], dtype=np.int64))):
    coord = {}
    for a in reversed(names):    # row-major over the tuple's order
      t, coord[a] = divmod(t, sizes[a])
    c = 0
    for a in canon:
      c = c * sizes[a] + coord[a]
    index.append(c)
  return (canon[0] if isinstance(axes, str) else canon), index


def _permute_rows(p, slot: int, axes, me):
  """The CPU all-to-all of p[:, :slot] (p u8[N, L]) as N - 1 collective permutes."""
  _ffi.register()
  n_peers = p.shape[0]
  piece = base.result_type((slot,), jnp.uint8, p)
  my = lax.axis_index(axes).astype(jnp.int32) if me is None else me
  # Under jax.vmap both custom calls run once per batch member ("sequential"); the
  # permutes between them batch as lax's do.
  pieces = jax.ffi.ffi_call("zipccl_row_split", [piece] * (n_peers - 1), vmap_method="sequential")(p, my)
  canon, index = _permute_index(axes)
  moved = [lax.ppermute(q, canon, [(index[j], index[(j + k) % n_peers]) for j in range(n_peers)])
           for k, q in enumerate(pieces, 1)]
  return base.call_target("zipccl_row_join", (n_peers, slot), jnp.uint8, p, p, my, *moved,
                 vmap_method="sequential")


def a2a_slot(payload, slot: int, axes, me=None):
  """lax.all_to_all(payload[:, :slot], axes, 0, 0, tiled=True) for payload u8[N, L].

  On CPU backends the all-to-all is N - 1 collective permutes: shift k = 1..N-1
  moves, from every device j, its row for peer (j + k) mod N. One custom call
  ("zipccl_row_split", ffi/transport_cpu.cc) cuts the N - 1 slot-sized rows to
  send, one ("zipccl_row_join") puts the received rows and the own row (the
  payload's, never sent) back in peer order: the same bytes as the all-to-all.
  Why: XLA:CPU compiles an array all-to-all into a tuple all-to-all of N per-peer
  slice kernels and a concatenate, ~10 kernels per ladder rung, while custom calls
  and collective permutes compile to no kernel (docs/design.md, "Transport: the slot ladder"). Other
  backends (a GPU's NCCL all-to-all) keep lax.all_to_all; the targets' CUDA
  handlers only keep programs lowered for CPU and GPU at once compiling.

  me: lax.axis_index(axes) as int32, computed once outside a ladder's switch (in
  a branch it is one more kernel per rung).
  """
  n_peers = payload.shape[0]

  def default(p):
    return lax.all_to_all(p[:, :slot], axes, 0, 0, tiled=True)

  if n_peers < 2:
    return default(payload)
  return compat.platform_dependent(payload, cpu=lambda p: _permute_rows(p, slot, axes, me),
                                default=default)


def a2a_raw(rows, axes, me=None):
  """unbits(lax.all_to_all(bits(rows), axes, 0, 0, tiled=True)) for rows[N, m] of a
  float dtype: an all-to-all ladder's raw rung, on CPU as the same N - 1 permutes
  as its compressed rungs (`a2a_slot` on the rows' bytes, which `copy_as` views
  as u8 and back: no kernel).

  Why the raw rung too: XLA:CPU's collective-permute rendezvous spans every device
  named in its source-target pairs, the other groups of a transport over one axis
  of a larger mesh included, while an all-to-all's spans its own group. Groups
  that agree on different rungs of one switch must therefore issue the same
  collectives in the same order (docs/design.md, "Transport: the slot ladder"): here N - 1
  permutes with the same pairs on every rung.
  """
  n_peers, m = rows.shape

  def default(r):
    return unbits(lax.all_to_all(bits(r), axes, 0, 0, tiled=True), r.dtype)

  if n_peers < 2:
    return default(rows)

  def on_cpu(r):
    nbytes = m * r.dtype.itemsize
    b = copy_as(r, jnp.uint8, (n_peers, nbytes))
    return copy_as(_permute_rows(b, nbytes, axes, me), r.dtype, (n_peers, m))

  return compat.platform_dependent(rows, cpu=on_cpu, default=default)
