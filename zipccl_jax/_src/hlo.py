"""`hlo_wire_bytes`: the bytes the collectives of a compiled HLO module move.

A parser of XLA's HLO text (`jax.jit(f).lower(...).compile().as_text()`), so that
benchmarks and tests measure the wire from what XLA actually runs (after any
dtype widening), not from what the Python code meant to send.
"""
from __future__ import annotations

import dataclasses
import re

_COLLECTIVE_OPCODES = ("all-gather", "all-gather-start", "all-to-all", "collective-permute",
                       "collective-permute-start", "reduce-scatter", "all-reduce",
                       "all-reduce-start", "ragged-all-to-all", "collective-broadcast")
_ELEM_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
               "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY_RE = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128|f8\w*)\[([\d,]*)\]")
_INSTR_RE = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_COMP_RE = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")


def _group_size(attrs: str, default: int) -> int:
  m = re.search(r"replica_groups=\{\{([\d,\s]*)\}", attrs)
  if m:
    return len([v for v in m.group(1).split(",") if v.strip()])
  m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attrs)
  if m:
    return int(m.group(2))
  return default


def _sent_model(opcode: str, nbytes: int, group: int) -> float:
  """Bytes one device sends for a collective of `nbytes` operand bytes over `group`."""
  base = opcode.removesuffix("-start")
  if base == "all-gather":
    return float(nbytes * (group - 1))
  if base in ("all-to-all", "reduce-scatter", "ragged-all-to-all"):
    return nbytes * (group - 1) / group
  if base == "all-reduce":
    return 2.0 * nbytes * (group - 1) / group
  return float(nbytes)


@dataclasses.dataclass(frozen=True)
class HloCollective:
  """One collective instruction of a compiled HLO module."""
  computation: str
  opcode: str
  operand_bytes: int
  path: str   # "always" (outside conditionals), "common" (first branches only),
              # "fallback" (last branches only), "other" (a middle rung of a switch)
  group_size: int = 1
  sent_bytes: float = 0.0   # modelled bytes one device sends (see hlo_wire_bytes)
  branches: tuple = ()      # ((conditional, branch index), ...) on the way from ENTRY


@dataclasses.dataclass(frozen=True)
class HloConditional:
  """A conditional (`lax.cond` / `lax.switch`) with collectives in its branches.

  Attributes:
    name: the conditional instruction's name.
    branch_bytes: per branch, the operand bytes of the collectives inside it (a
      slot ladder's switch: one entry per rung, the raw rung last; its final
      branch, which moves nothing and runs only when the participants' plans
      differ, is left out).
    opcodes: the collective opcodes found in its branches (to tell switches apart).
  """
  name: str
  branch_bytes: tuple
  opcodes: tuple


@dataclasses.dataclass(frozen=True)
class HloWireBytes:
  """Operand bytes of the collectives in a compiled module.

  A switch of collectives (the slot ladder, one branch per rung) runs exactly one
  branch per call, so its bytes are counted per branch, never summed:
  common: every conditional takes its FIRST branch (the ladder's smallest rung;
    the false branch of a two-way `lax.cond`);
  fallback: every conditional takes its LAST branch (the ladder's raw rung);
  total: every collective in the module, whichever branch it is in (an upper
    bound no run reaches);
  conditionals: per conditional, the bytes of each branch; `taken()` adds up the
    path of given branch choices (e.g. the rungs a call's stats report).
  *_sent: the same sums of `HloCollective.sent_bytes`, a model of the bytes that
    leave one device, which makes different collectives comparable (an
    all-reduce of B operand bytes sends ~2B(G-1)/G, an all-gather B(G-1)).

  Which field to read:
  * against lax (or any other program): the `*_sent` fields only. A compressed
    psum moves byte rows over an all-to-all and an all-gather, lax's psum is one
    all-reduce: their operand bytes are not comparable, the bytes they send are.
  * a ladder program (`jax.jit`): `common_sent` is the best case (every call on its
    smallest rung), `fallback_sent` the worst (raw). What a call takes depends on
    its data: `taken(rungs)` with the rungs its `CollectiveStats.rung` report, or
    per tensor `zipccl_jax.analyze(x).wire_nbytes` (the slot its collective moves).
  * a planned program (`zipccl_jax.jit(f).compiled(...)`): no conditionals, so
    common == fallback == what every step moves (the planned slots).
  """
  common: int
  fallback: int
  total: int
  ops: tuple
  common_sent: float = 0.0
  fallback_sent: float = 0.0
  total_sent: float = 0.0
  conditionals: tuple = ()

  def taken(self, choice) -> int:
    """Operand bytes when conditional c takes branch choice[c] (a dict by name, or a
    sequence in the order of `conditionals`); unlisted conditionals take branch 0."""
    if not isinstance(choice, dict):
      choice = {c.name: int(i) for c, i in zip(self.conditionals, choice)}
    return sum(op.operand_bytes for op in self.ops
               if all(choice.get(c, 0) == i for c, i in op.branches))


def _shape_bytes(shape: str) -> int:
  total = 0
  for dt, dims in _ARRAY_RE.findall(shape):
    size = _ELEM_BYTES.get(dt, 1)
    for d in filter(None, dims.split(",")):
      size *= int(d)
    total += size
  return total


def _split_top(s: str, open_ch: str, close_ch: str):
  """Returns (text inside the first balanced open..close group, the rest)."""
  depth = 0
  start = s.index(open_ch)
  for i in range(start, len(s)):
    if s[i] == open_ch:
      depth += 1
    elif s[i] == close_ch:
      depth -= 1
      if depth == 0:
        return s[start + 1:i], s[i + 1:]
  return s[start + 1:], ""


def hlo_wire_bytes(hlo_text: str) -> HloWireBytes:
  """Sums the operand bytes of every collective in compiled HLO text.

  Use it on `jax.jit(f).lower(*args).compile().as_text()`: the bytes there are
  what XLA actually moves (after any dtype widening). A while loop body counts
  once. Async start/done pairs count once (the start). A conditional runs one
  branch: a slot ladder's `lax.switch` is counted per rung (`conditionals`), and
  the sums take the first branches (`common`), the last ones (`fallback`, the raw
  rung) or all of them (`total`).

  Returns:
    An `HloWireBytes` with those sums, the branch bytes of every conditional, and
    every collective found (`ops`).

  Raises:
    ValueError: the text has no ENTRY computation.
  """
  comps: dict[str, list] = {}
  m = re.search(r"num_partitions=(\d+)", hlo_text)
  n_dev = int(m.group(1)) if m else 1
  if n_dev == 1:
    m = re.search(r"replica_count=(\d+)", hlo_text)
    n_dev = int(m.group(1)) if m else 1
  entry = None
  cur = None
  for line in hlo_text.splitlines():
    m = _COMP_RE.match(line)   # computation headers start in column 0
    if m:
      cur = m.group(2)
      comps[cur] = []
      if m.group(1):
        entry = cur
      continue
    if cur is None:
      continue
    if line.strip() == "}":
      cur = None
      continue
    im = _INSTR_RE.match(line)
    if not im:
      continue
    name, rest = im.group(1), im.group(2)
    if rest.startswith("("):
      inner, after = _split_top(rest, "(", ")")
      shape = "(" + inner + ")"
      after = after.lstrip()
    else:
      shape, _, after = rest.partition(" ")
    opcode = after.split("(", 1)[0].strip()
    operands_txt, attrs = _split_top(after, "(", ")") if "(" in after else ("", after)
    operands = re.findall(r"%([\w.\-]+)", operands_txt)
    comps[cur].append((name, shape, opcode, operands, attrs))
  if entry is None:
    raise ValueError("hlo_wire_bytes: no ENTRY computation found in the HLO text")

  conds: dict = {}

  def walk(comp, path, seen, out):
    """Collectives reachable from comp, each with its path of (conditional, branch)."""
    if comp in seen or comp not in comps:
      return
    seen = seen | {comp}
    shapes = {name: shape for name, shape, *_ in comps[comp]}
    for name, _, opcode, operands, attrs in comps[comp]:
      if opcode in _COLLECTIVE_OPCODES:
        nbytes = sum(_shape_bytes(shapes.get(o, "")) for o in operands)
        group = _group_size(attrs, n_dev)
        out[(comp, name)] = (opcode, nbytes, group, _sent_model(opcode, nbytes, group), path)
      if opcode == "conditional":
        m = re.search(r"branch_computations=\{([^}]*)\}", attrs)
        if m:
          branches = re.findall(r"%([\w.\-]+)", m.group(1))
        else:
          t = re.search(r"true_computation=%([\w.\-]+)", attrs)
          f = re.search(r"false_computation=%([\w.\-]+)", attrs)
          branches = [f.group(1), t.group(1)] if t and f else []
        conds[name] = len(branches)
        for i, b in enumerate(branches):
          walk(b, path + ((name, i),), seen, out)
        continue
      for key in ("calls", "to_apply", "body", "condition"):
        for sub in re.findall(key + r"=%([\w.\-]+)", attrs):
          walk(sub, path, seen, out)

  found = {}
  walk(entry, (), frozenset(), found)
  # A slot ladder's switch ends with the plan-mismatch branch, which moves nothing
  # (taken only when the participants planned different transports): not counted,
  # so that the last branch counted is the raw rung.
  for c, nb in list(conds.items()):
    if nb >= 3 and not any((c, nb - 1) in v[4] for v in found.values()):
      conds[c] = nb - 1
  ops = []
  for key, (opcode, nbytes, group, sent, path) in found.items():
    first = all(i == 0 for _, i in path)
    last = all(i == conds[c] - 1 for c, i in path)
    label = ("always" if not path else "common" if first and not last else
             "fallback" if last and not first else "always" if first and last else "other")
    ops.append(HloCollective(key[0], opcode, nbytes, label, group, sent, path))

  def pick(which, attr):
    return sum(getattr(o, attr) for o in ops
               if which is None or all(i == (0 if which == "first" else conds[c] - 1)
                                       for c, i in o.branches))

  inner = [c for c in conds if any(c in dict(o.branches) for o in ops)]
  conditionals = tuple(
      HloConditional(c, tuple(sum(o.operand_bytes for o in ops if (c, i) in o.branches)
                              for i in range(conds[c])),
                     tuple(sorted({o.opcode for o in ops if c in dict(o.branches)})))
      for c in inner)
  return HloWireBytes(pick("first", "operand_bytes"), pick("last", "operand_bytes"),
                      pick(None, "operand_bytes"), tuple(ops),
                      pick("first", "sent_bytes"), pick("last", "sent_bytes"),
                      pick(None, "sent_bytes"), conditionals)
