"""Calibration files (zipccl_jax/_src/calibration.py): round trip, lookup order,
validation with the field named, atomic writes, and the agreement of the inputs of
decisions between processes.
"""
from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from zipccl_jax import costmodel as cm

from tests.costmodel_cases import cal as _cal

pytestmark = pytest.mark.usefixtures("no_global_calibration")


def test_calibration_file_round_trip_and_lookup_order(tmp_path, monkeypatch):
  cal = _cal(link_gbit=2)
  p = cal.save(tmp_path / "sub" / "c.json")
  assert p.exists() and cm.Calibration.load(p) == cal
  assert json.loads(p.read_text())["schema"] == cm.SCHEMA_VERSION
  # Float fields survive exactly (repr round-trips).
  assert cm.Calibration.load(p).links["all_gather"].beta_s_per_byte == \
      cal.links["all_gather"].beta_s_per_byte
  # The env var names the file resolve_calibration reads...
  monkeypatch.setenv(cm.ENV_VAR, str(p))
  assert cm.default_path() == p
  assert cm.resolve_calibration(None) == cal == cm.active_calibration()
  # ...a path argument is read directly, and set_calibration wins over the file.
  assert cm.resolve_calibration(str(p)) == cal
  other = _cal(link_gbit=7)
  cm.set_calibration(other)
  assert cm.resolve_calibration(None) == other
  assert cm.resolve_calibration(cal) == cal      # an explicit object wins over everything
  cm.set_calibration(None)
  # A rewritten file is re-read (cache keyed by mtime and size).
  time.sleep(0.01)
  other.save(p)
  assert cm.resolve_calibration(None) == other
  # Without the env var: XDG_CACHE_HOME/zipccl_jax/calibration.json.
  monkeypatch.delenv(cm.ENV_VAR)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert cm.default_path() == tmp_path / "xdg" / "zipccl_jax" / "calibration.json"
  assert cm.load_calibration() is None


def test_malformed_calibrations_name_the_problem(tmp_path):
  good = _cal().to_dict()
  with pytest.raises(ValueError, match="schema"):
    cm.Calibration.from_dict(dict(good, schema=99))
  bad = dict(good)
  del bad["links"]
  with pytest.raises(ValueError, match="malformed"):
    cm.Calibration.from_dict(bad)
  bad = json.loads(json.dumps(good))
  del bad["links"]["all_reduce"]
  with pytest.raises(ValueError, match="all_reduce"):
    cm.Calibration.from_dict(bad)
  with pytest.raises(ValueError, match="not JSON"):
    cm.Calibration.from_json("{oops")
  with pytest.raises(TypeError, match="set_calibration: calibration"):
    cm.set_calibration({"links": 1})
  with pytest.raises(TypeError, match="calibration must be"):
    cm.decide("psum", "bfloat16", 10, 2, calibration=3)


@pytest.mark.parametrize("field, value, match", [
    ("ratio", float("nan"), "must be finite"),
    ("ratio", -1.0, "must be > 0"),
    ("encode_s_per_byte", -1e-9, "must be >= 0"),
    ("decode_s_per_byte", "fast", "must be a number"),
    ("bogus", 1.0, "not a field of CodecFit"),
])
def test_calibration_file_is_validated_and_named(tmp_path, field, value, match):
  d = _cal().to_dict()
  codec = next(iter(d["codecs"]))
  d["codecs"][codec]["bfloat16"][field] = value
  p = tmp_path / "cal.json"
  p.write_text(json.dumps(d))
  with pytest.raises(ValueError, match=f"calibration file {p}.*codecs.{codec}.bfloat16.{field}.*{match}"):
    cm.Calibration.load(p)


def test_a_bad_default_file_is_ignored_with_a_warning(tmp_path, monkeypatch):
  """A malformed file in force by default never breaks an explicit call: it is
  ignored (no calibration) with a warning naming it."""
  p = tmp_path / "calibration.json"
  p.write_text('{"schema": 1, "platform": "cpu", "n_peers": "two"}')
  monkeypatch.setenv(cm.ENV_VAR, str(p))
  cm.set_calibration(None)
  with pytest.warns(RuntimeWarning, match=f"ignoring the calibration file {p}"):
    assert cm.active_calibration() is None
  assert cm.decision_inputs()["calibration"] == "none"


def test_save_is_atomic_and_follows_no_symlink(tmp_path):
  target = tmp_path / "victim.txt"
  target.write_text("keep me")
  p = tmp_path / "cal.json"
  p.symlink_to(target)                       # a link planted where the file goes
  cal = _cal()
  cal.save(p)
  assert target.read_text() == "keep me"     # the link was replaced, not followed
  assert not p.is_symlink() and cm.Calibration.load(p) == cal
  assert [q.name for q in tmp_path.iterdir() if q.name.endswith(".tmp")] == []
  # concurrent writers each use their own temporary file: every result is whole
  errors = []

  def write(i):
    try:
      for _ in range(20):
        _cal(link_gbit=1 + i).save(tmp_path / "shared.json")
    except Exception as e:   # pragma: no cover - reported below
      errors.append(e)

  threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors, errors
  cm.Calibration.load(tmp_path / "shared.json")


def test_check_agreement_is_symmetric_and_covers_env_knobs(monkeypatch):
  cm.set_calibration(None)
  monkeypatch.setenv(cm.ENV_VAR, "/nonexistent/zipccl-calibration.json")
  from zipccl_jax._src import calibration_agreement as cal_src
  mine = cal_src._digest(cm.decision_inputs())
  assert cm.check_agreement(allgather=lambda a: np.stack([a, a]))
  monkeypatch.setenv("ZIPCCL_CHUNKS", "4")
  other = cal_src._digest(cm.decision_inputs())
  assert not np.array_equal(mine, other)
  # every process sees both digests, so every process gets the same verdict
  assert not cm.check_agreement(allgather=lambda a: np.stack([mine, a]))
  with pytest.raises(RuntimeError, match="processes \\[1\\] differ"):
    cm.check_agreement(raise_on_mismatch=True, allgather=lambda a: np.stack([mine, a]))
