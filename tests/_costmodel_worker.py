"""One process of the cross-process calibration test (launched by test_costmodel.py).

    python tests/_costmodel_worker.py PROCESS_ID NUM_PROCESSES PORT OUT_DIR

Joins a jax.distributed job on 127.0.0.1:PORT (CPU, gloo; one device per
process), runs a tiny `calibrate` over the 1-D mesh "x" of all processes and
writes its calibration to OUT_DIR/calibration<PID>.json (each process its own
file, as on hosts with separate disks), plus the decisions of a small grid and
`check_agreement` to OUT_DIR/decisions<PID>.json. The launcher checks that all
files are byte-identical: every process holds process 0's numbers.
"""
from __future__ import annotations

import json
import os
import sys


def main(argv) -> int:
  pid, nproc, port = (int(a) for a in argv[1:4])
  out = argv[4]
  import jax
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc,
                             process_id=pid, initialization_timeout=60)
  from zipccl_jax import costmodel as cm

  mesh = jax.make_mesh((nproc,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
  cal = cm.calibrate(mesh, "x", dtypes=("bfloat16",), codec_bytes=(2**12, 2**14),
                     link_row_bytes=(2**10, 2**13), reps=2, warmup=1,
                     path=os.path.join(out, f"calibration{pid}.json"))
  grid = [(c, s, cm.decide(c, "bfloat16", s, nproc, cal))
          for c in cm.COLLECTIVES for s in (2**10, 2**16, 2**22)]
  # The meter times the slowest process: process 1 spends 50 ms more per call.
  import time
  import jax.numpy as jnp
  from zipccl_jax._src import calibrate as cm_src
  meter = cm_src._Meter(mesh, ("x",), reps=3, warmup=1)
  skewed = meter.time(lambda: (time.sleep(0.05) if pid == 1 else None, jnp.zeros(1))[1])
  with open(os.path.join(out, f"decisions{pid}.json"), "w") as f:
    json.dump({"grid": grid, "agree": cm.check_agreement(),
               "fingerprint": cal.fingerprint, "skewed_s": skewed}, f)
  jax.distributed.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
