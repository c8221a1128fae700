"""Hand-made calibrations for the cost-model tests: exact numbers, so that decisions
do not depend on how busy the machine is."""
from __future__ import annotations

from zipccl_jax import costmodel as cm

GBIT = 1e9 / 8   # bytes per second of 1 Gbit/s


def cal(link_gbit=1.0, enc_GBps=3.0, dec_GBps=3.5, ratio=1.40, alpha=50e-6, n_peers=2,
         codecs=("zipccl",)):
  link = cm.LinkFit(alpha, 1.0 / (link_gbit * GBIT))
  fits = {d: cm.CodecFit(20e-6, 1e-9 / enc_GBps, 20e-6, 1e-9 / dec_GBps, ratio, ratio, ratio)
          for d in cm.DTYPES}
  return cm.Calibration(platform="cpu", n_peers=n_peers,
                        links={a: link for a in cm.ALGORITHMS},
                        codecs={c: dict(fits) for c in codecs},
                        reduce={d: cm.LinkFit(10e-6, 1e-10) for d in cm.DTYPES},
                        source="measured", meta={"test": True})
