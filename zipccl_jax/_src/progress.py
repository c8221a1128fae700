"""One progress bar for the CLI and the examples: tqdm when installed, else a plain one."""
from __future__ import annotations

import sys


class SimpleBar:
  """A minimal stand-in for tqdm (used when tqdm is not installed)."""

  def __init__(self, total: int, desc: str, file, width: int = 30):
    self.total, self.desc, self.file, self.width, self.n = total, desc, file, width, 0
    self.postfix = ""
    self._draw()

  def _draw(self):
    done = self.width * self.n // max(self.total, 1)
    self.file.write(f"\r{self.desc} [{'#' * done}{'.' * (self.width - done)}] "
                    f"{self.n}/{self.total}{self.postfix}")
    self.file.flush()

  def update(self, k: int = 1):
    self.n += k
    self._draw()

  def set_postfix(self, refresh: bool = True, **values):
    self.postfix = "".join(f" {k}={v}" for k, v in values.items())
    if refresh:
      self._draw()

  def close(self):
    self.file.write("\n")
    self.file.flush()


class NoBar:
  """What `progress_bar` returns when disabled: the same methods, no output."""

  def update(self, k: int = 1):
    pass

  def set_postfix(self, refresh: bool = True, **values):
    pass

  def close(self):
    pass


def progress_bar(total: int, desc: str, *, unit: str = "it", enabled: bool = True,
                 file=None, leave: bool = True):
  """A progress bar of `total` steps on `file` (default stderr).

  Args:
    total: number of steps.
    desc: label in front of the bar.
    unit: what a step is ("tensor", "step").
    enabled: False gives a bar that prints nothing.
    file: the stream (default sys.stderr).
    leave: keep tqdm's bar on screen when closed.

  Returns:
    An object with update(k=1), set_postfix(**values) and close().
  """
  if not enabled:
    return NoBar()
  file = sys.stderr if file is None else file
  try:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  except ImportError:  # tqdm is in the test extra; the plain bar does without it
    return SimpleBar(total, desc, file=file)
  return tqdm(total=total, desc=desc, unit=unit, file=file, leave=leave, dynamic_ncols=True)
