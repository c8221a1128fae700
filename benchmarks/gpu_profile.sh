#!/usr/bin/env bash
# Nsight Compute profile of the CUDA codec kernels on a GPU machine: one launch each of
# the entropy codec's block kernels (ent_encode_kernel, ent_decode_blocks) and the window
# codec's tile kernels (encode_kernel, decode_kernel) on 64 MiB of Gaussian bf16, with
# the full section set (occupancy, memory and warp-stall breakdowns). Clocks are left as
# they are (--clock-control none).
#
#   bash benchmarks/gpu_profile.sh OUTDIR [--skip-build]
#
# Writes OUTDIR/prof.ncu-rep (open with ncu-ui or `ncu --import`), OUTDIR/details.txt
# (every section of every profiled launch) and OUTDIR/build.log. Needs nvcc, ncu, jax
# with its CUDA plugin, nanobind and scikit-build-core; no network.
set -euo pipefail
out=${1:?usage: bash benchmarks/gpu_profile.sh OUTDIR [--skip-build]}
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
if [ "${2:-}" != --skip-build ]; then
  echo "[gpu_profile] building the CUDA module (sm_90)"
  (cd "$here" && ZIPCCL_CUDA=ON python3 -m pip install --no-build-isolation --no-deps --no-index \
      -C cmake.define.ZIPCCL_CUDA_ARCHITECTURES=90 . >"$out/build.log" 2>&1) \
    || { tail -40 "$out/build.log"; exit 1; }
fi
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "[gpu_profile] ncu not found"; exit 1; }
prog=$(mktemp --suffix=.py)
cat >"$prog" <<'PY'
import jax, jax.numpy as jnp
import zipccl_jax as zc
assert zc.has_cuda_support(), "the CUDA module is not installed"
n = 32 << 20                                   # 64 MiB of bf16
x = (jax.random.normal(jax.random.PRNGKey(0), (1, n), jnp.float32) * 0.02).astype(jnp.bfloat16)
for name in ("entropy", "zipccl"):             # one launch of each kernel, in this order
  c = zc.get_codec(name)
  p, s = jax.jit(c.encode_rows)(x)
  y, st = jax.jit(lambda q: c.decode_rows(q, n, jnp.bfloat16))(p)
  ok = bool(jnp.array_equal(jax.lax.bitcast_convert_type(y, jnp.uint16),
                            jax.lax.bitcast_convert_type(x, jnp.uint16)))
  print(f"{name}: used {int(s[0, 2]) * 128} B of {2 * n}, round trip bit-exact: {ok}", flush=True)
PY
echo "[gpu_profile] $ncu"
XLA_PYTHON_CLIENT_PREALLOCATE=false "$ncu" --clock-control none --set full \
  -k 'regex:ent_encode_kernel|ent_decode_blocks|encode_kernel|decode_kernel' -c 4 \
  -f -o "$out/prof" python3 "$prog"
"$ncu" --import "$out/prof.ncu-rep" --page details >"$out/details.txt"
grep -E '^  [a-z_]+.*\(|Duration|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|No Eligible' \
  "$out/details.txt" | head -120
rm -f "$prog"
