"""The repository stands alone: no file points at notes outside it, and every
docs/*.md that a file cites exists (a clone has nothing else)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_TEXT_SUFFIXES = {".py", ".md", ".h", ".cc", ".cu", ".cmake", ".txt", ".toml", ".sh", ".cfg",
                  ".yml", ".yaml", ""}
# Notes that lived next to the repository while it was written; they are not part of it.
_OUTSIDE = re.compile(r"\.\./shared|/work/|paper-notes|(?<!docs/)jax-notes\.md")


def _files():
  try:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    paths = [ROOT / p for p in out.splitlines()]
  except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist)
    paths = [p for p in ROOT.rglob("*") if ".venv" not in p.parts and "build" not in p.parts]
  return [p for p in paths if p.is_file() and p.suffix in _TEXT_SUFFIXES
          and p.name != Path(__file__).name]


def test_no_reference_to_notes_outside_the_repository():
  bad = []
  for p in _files():
    text = p.read_text(errors="replace")
    for i, line in enumerate(text.splitlines(), 1):
      if _OUTSIDE.search(line):
        bad.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
  assert not bad, "references to files outside the repository:\n" + "\n".join(bad)


def test_cited_docs_exist():
  cited = set()
  for p in _files():
    cited |= set(re.findall(r"docs/([A-Za-z0-9_\-]+\.md)", p.read_text(errors="replace")))
  missing = sorted(c for c in cited if not (ROOT / "docs" / c).is_file())
  assert "jax-notes.md" in cited
  assert not missing, f"cited but missing: {missing}"
