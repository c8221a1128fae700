"""Saved plans of `zipccl_jax.jit` (`Planned.save_plans` / `load_plans`).

A JSON document, so that a restart starts planned instead of measuring:

  {"version": PLANS_VERSION, "function": the function's name,
   "plans": [{"key": the argument signature (treedef, shapes and dtypes, static args),
              "sites": [{"signature": the site's (collective, codec, dtype, rows shape,
                                      chunk, check decode, rows on the wire), as
                                      nested lists,
                         "raw_row": raw bytes of one row,
                         "slot": planned bytes per row, or null for raw words}]}]}

A loaded plan is used by the first call with the same key whose traced sites match
it; a slot its site cannot move (`planned_sites.fits`: a multiple of 128 bytes
within the site's ladder) moves raw words (always exact).
"""
from __future__ import annotations

import json
import os

from zipccl_jax._src.planned_sites import RAW

# 2: the signature's last field, the rows a site puts on the wire (planned_sites.wire_rows)
PLANS_VERSION = 2


def save(path: str, function: str, plans: list) -> None:
  """Writes `plans` [(key text, sites, plan)] to `path` atomically (a temporary file
  in the same directory, renamed over it)."""
  doc = {"version": PLANS_VERSION, "function": function, "plans": [
      {"key": key, "sites": [{"signature": _jsonable(sig), "raw_row": raw,
                              "slot": None if slot == RAW else slot}
                             for (sig, _, raw), slot in zip(sites, plan)]}
      for key, sites, plan in plans]}
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(doc, f, indent=1)
  os.replace(tmp, path)


def load(path: str) -> dict:
  """{key text: (sites [(signature, None, raw_row)], plan)} read from `path`, with
  RAW for the slots saved as null (or as RAW). ValueError naming the file when
  malformed."""
  out = {}
  try:
    with open(path) as f:
      doc = json.load(f)
    if doc.get("version") != PLANS_VERSION:
      raise ValueError(f"version must be {PLANS_VERSION}, got {doc.get('version')!r}")
    for p in doc["plans"]:
      sites = [(_tupled(s["signature"]), None, int(s["raw_row"])) for s in p["sites"]]
      plan = tuple(RAW if s["slot"] in (None, RAW) else int(s["slot"]) for s in p["sites"])
      out[str(p["key"])] = (sites, plan)
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    raise ValueError(f"zipccl_jax.jit: cannot load plans from {path!r}: {e}") from None
  return out


def _jsonable(v):
  return [_jsonable(x) for x in v] if isinstance(v, tuple) else v


def _tupled(v):
  return tuple(_tupled(x) for x in v) if isinstance(v, list) else v
