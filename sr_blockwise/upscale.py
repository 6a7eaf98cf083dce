"""Batch upscaling: folders, files and globs of faces in, 32x32 results out. The code lives in
sr_blockwise/batch/, a module per part; these are its public names."""
from __future__ import annotations

from .batch.files import (FOREIGN, SAVE_ARGS, SOFTWARE, TEMP_STALE_S, check_writable,  # noqa: F401
                          foreign_beside_inputs, made_here, save_atomic, sweep_temp_files)
from .batch.photos import Photo, compare_strip, load_ground_truth, load_photo, paste_plan_of, quality  # noqa: F401
from .batch.plan import (FACES, NO_FACE, Config, Job, already_done, find_inputs, parse_shard, plan,  # noqa: F401
                         readable_exts, shard_of)
from .batch.report import METRIC_FIELDS, Metrics, Summary, metrics_path  # noqa: F401
from .batch.run import BatchRun, after_batch, decode_batch, dry_paste_plan, job_seed, run, validate  # noqa: F401
from .data import BadImage  # noqa: F401 (what load_photo raises for a file it cannot read)
