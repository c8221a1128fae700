"""The calibrated cost model behind policy="auto" (see `calibrate`, `decide`, `project`).

`calibrate` measures the codecs and the link on the user's mesh and stores the
result (a file under ~/.cache/zipccl_jax, or $ZIPCCL_CALIBRATION, and the
process-wide `set_calibration`); `decide` is the static per-call decision;
`project` models other clusters. The same names `calibrate`, `decide`,
`project`, `set_calibration` and `Calibration` are also in `zipccl_jax`.
"""
from zipccl_jax._src.costmodel import (
    ALGORITHMS,
    CHUNK_CANDIDATES,
    COLLECTIVES,
    DEFAULT_MARGIN,
    DTYPES,
    ENV_VAR,
    MEASURED_OVERLAP,
    OVERLAP_ENV_VAR,
    SCHEMA_VERSION,
    Calibration,
    CodecFit,
    LinkFit,
    ProjectionRow,
    active_calibration,
    agree_across_processes,
    available_codecs,
    best_chunks,
    calibrate,
    check_agreement,
    compressed_row_bytes,
    decide,
    default_calibration,
    default_path,
    fastest_codec,
    fit_alpha_beta,
    format_projection,
    load_calibration,
    model_time,
    overlap_fraction,
    project,
    projected_calibration,
    resolve_calibration,
    sample_ratio,
    set_calibration,
    synthetic,
    used_nbytes,
)

__all__ = [
    "ALGORITHMS", "CHUNK_CANDIDATES", "COLLECTIVES", "DEFAULT_MARGIN", "DTYPES", "ENV_VAR",
    "MEASURED_OVERLAP", "OVERLAP_ENV_VAR", "SCHEMA_VERSION", "best_chunks", "overlap_fraction",
    "Calibration", "CodecFit", "LinkFit", "ProjectionRow", "active_calibration",
    "agree_across_processes",
    "available_codecs", "calibrate", "check_agreement", "compressed_row_bytes", "decide",
    "default_calibration", "default_path", "fit_alpha_beta", "format_projection",
    "load_calibration", "model_time", "project", "projected_calibration",
    "resolve_calibration", "sample_ratio", "set_calibration", "synthetic", "used_nbytes",
]
