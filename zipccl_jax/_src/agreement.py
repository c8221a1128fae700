"""The agreement of a ladder transport: one all-gather of every participant's
(used size, count, plan fingerprint), reduced on each device (docs/design.md,
"Agreement"), and the host side of check_decode.

Participants whose plans differ (another codec, format version, ladder, chunking,
dtype, shape or check_decode) learn it from the same gathered rows before any
payload moves: on CPU "zipccl_agree" fails the call on every one of them; on other
backends the rung is past the raw one, a branch that moves nothing.
"""
from __future__ import annotations

import zlib

import jax.numpy as jnp
import numpy as np

from zipccl_jax._src import compat
from zipccl_jax._src import ladder as ladder_lib
from zipccl_jax._src.codecs import base

_ALIGN = ladder_lib.ALIGN


# Status of every received row when the participants' plans differ on a backend
# whose agreement cannot raise (the "zipccl_agree" CPU handler fails the call
# instead). Outside every codec's status range (codecs use small positive values).
PLAN_MISMATCH = 0x7FFF0000
# The fingerprint fields, in the order of ffi/transport.h kFingerprintFields.
FINGERPRINT_FIELDS = ("codec and format version", "slot ladder", "chunking",
                      "collective, dtype, row shape and check_decode")


def fingerprint(plan, rows_shape, where: str, check: bool) -> tuple:
  """The static plan of one ladder transport as len(FINGERPRINT_FIELDS) int32 values
  (CRC-32 of each field's canonical text, top bit cleared): what every participant
  must share for the agreement and the slot switch to mean the same thing."""
  codec = plan.codec
  impl = getattr(codec, "impl", None)
  fields = ((codec.name, getattr(impl, "FORMAT_VERSION", None), getattr(codec, "codec_id", None)),
            tuple(int(r) for r in plan.rungs),
            tuple(plan.chunk),
            (where, np.dtype(plan.dtype).name, tuple(int(d) for d in rows_shape), bool(check)))
  assert len(fields) == len(FINGERPRINT_FIELDS)
  return tuple(zlib.crc32(repr(f).encode()) & 0x7FFFFFFF for f in fields)


def agree(every, rungs, where: str):
  """(agreed, count, rung) int32[3] of the gathered agreement rows every[N, W]
  (used size in units of 128 B, count, fingerprint fields): the largest used size,
  the summed count and the first rung (slot sizes in bytes, ascending) that holds
  the agreed size, len(rungs) = the raw rung.

  A custom call ("zipccl_agree", the rung sizes and `where` attributes) on CPU
  backends, where differing fingerprints fail the call with an error naming
  `where` and the fields; jnp ops elsewhere, where differing fingerprints give
  rung len(rungs) + 1: the switch's last branch, which moves nothing.
  """
  units = np.asarray([s // _ALIGN for s in rungs], np.int32)

  def on_cpu(v):
    return base.call_target("zipccl_agree", (3,), jnp.int32, v, v, units=units, where=where,
                   vmap_method="sequential")

  def default(v):
    agreed = jnp.max(v[:, 0], initial=0)
    # the count's sum saturated at INT32_MAX, exact in int32 arithmetic: the high and
    # low 16 bits summed apart (N < 32768 participants)
    c = jnp.maximum(v[:, 1], 0)
    hi, lo = jnp.sum(c >> 16), jnp.sum(c & 0xFFFF)
    hi = hi + (lo >> 16)
    count = jnp.where(hi >= 1 << 15, np.iinfo(np.int32).max, (hi << 16) + (lo & 0xFFFF))
    differ = jnp.any(v[:, 2:] != v[:1, 2:])
    rung = jnp.where(differ, len(rungs) + 1, jnp.sum(agreed > units)).astype(jnp.int32)
    return jnp.stack([agreed, count, rung])

  if units.size == 0:   # no compressed rung: jnp ops on every backend
    return default(every)
  return compat.platform_dependent(every, cpu=on_cpu, default=default)


def gather(used, count, fp, axes, rungs, where):
  """(agreed, count, rung, bytes): the agreement of one transport.

  One all-gather of (used, count, *fp) int32 per participant, reduced on each
  device (`agree`): the same collective with or without stats, so a process that
  asks for stats runs the program of one that does not.
  """
  row = jnp.stack([used.astype(jnp.int32), count.astype(jnp.int32)]
                  + [jnp.int32(f) for f in fp])
  every = compat.all_gather_invariant(row, axes)   # [N, 2 + len(fp)]
  out = agree(every, rungs, where)
  return out[0], out[1], out[2], 4 * (2 + len(fp))


def raise_decode_error(where, codec, word, bad, worst):
  """Host side of check_decode: zero of the wire word dtype, or raises naming the
  codec and its status text (or the plan mismatch, PLAN_MISMATCH).

  A pure_callback (not a debug callback) on purpose: its error fails this call's
  results, which the caller sees at block_until_ready, and nothing else. A failing
  jax.debug.callback stays in JAX's runtime tokens and re-raises at every later
  effects barrier and at interpreter exit.
  """
  if int(bad) and int(worst) == PLAN_MISMATCH:
    raise RuntimeError(
        f"zipccl_jax: the participants of {where} planned different compressed transports "
        "(codec, format version, ladder, chunking, dtype, shape or check_decode differ); no "
        "bytes were moved and the rows hold NaN (all-one bits). Every process must call it "
        "with the same options and hold the same calibration and ZIPCCL_* settings.")
  if int(bad):
    status = (f"status {int(worst)}: {codec.decode_error_message(int(worst))}" if int(worst)
              else "on other participants")
    raise RuntimeError(
        f"zipccl_jax: {int(bad)} received row(s) of {where} failed to decode with the "
        f"{codec.name!r} codec ({status}); they hold NaN (all-one bits). The "
        "payload was corrupted in transit, or the sending process used another codec or "
        "format version.")
  return np.zeros((), word)


