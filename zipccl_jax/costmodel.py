"""The calibrated cost model behind policy="auto" (see `calibrate`, `decide`, `project`).

`calibrate` measures the codecs and the link on the user's mesh and stores the
result (a file under ~/.cache/zipccl_jax, or $ZIPCCL_CALIBRATION, and the
process-wide `set_calibration`); `decide` is the model's static per-call decision
(with no calibration: `default_calibration()`'s); `project` models other clusters;
`check_agreement` verifies that every process of a job decides alike.
`zipccl_jax.decide` answers what the collectives do: this model with a
calibration in force, their static size rule without one. `calibrate`, `project`,
`set_calibration` and `Calibration` are also in `zipccl_jax`.
"""
from zipccl_jax._src.calibrate import available_codecs, calibrate, sample_ratio, synthetic, used_nbytes
from zipccl_jax._src.calibration_agreement import (
    PROGRAM_ENV_VARS, agree_across_processes, check_agreement, decision_inputs)
from zipccl_jax._src.calibration import (
    ALGORITHMS,
    COLLECTIVES,
    DTYPES,
    ENV_VAR,
    SCHEMA_VERSION,
    Calibration,
    CodecFit,
    LinkFit,
    active_calibration,
    default_calibration,
    default_path,
    load_calibration,
    resolve_calibration,
    set_calibration,
)
from zipccl_jax._src.costmodel import (
    CHUNK_CANDIDATES,
    DEFAULT_MARGIN,
    MEASURED_OVERLAP,
    OVERLAP_ENV_VAR,
    Choice,
    ProjectionRow,
    best_chunks,
    choose,
    compressed_row_bytes,
    decide,
    fastest_codec,
    fit_alpha_beta,
    format_projection,
    model_time,
    overlap_fraction,
    project,
    projected_calibration,
)

__all__ = [
    "ALGORITHMS", "CHUNK_CANDIDATES", "COLLECTIVES", "DEFAULT_MARGIN", "DTYPES", "ENV_VAR",
    "MEASURED_OVERLAP", "OVERLAP_ENV_VAR", "PROGRAM_ENV_VARS", "SCHEMA_VERSION", "Calibration",
    "Choice", "CodecFit", "LinkFit", "ProjectionRow", "active_calibration",
    "agree_across_processes", "available_codecs", "best_chunks", "calibrate",
    "check_agreement", "choose", "compressed_row_bytes", "decide", "decision_inputs",
    "default_calibration", "default_path", "fastest_codec", "fit_alpha_beta",
    "format_projection", "load_calibration", "model_time", "overlap_fraction", "project",
    "projected_calibration", "resolve_calibration", "sample_ratio", "set_calibration",
    "synthetic", "used_nbytes",
]
