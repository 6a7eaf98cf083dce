"""The evaluation run: speed and quality of every (weights, k, mode), measured side by side on
the held-out test split, written as JSON, a Markdown report beside the paper's Table 2, plots and
an image grid.

The paper's lesson is that block size is not speed and speed is not quality, so one run measures
all three on the same images, the same machine and the same process (a resumed run: the same
sitting for each batch of faces, see DecodeStore):
- block size: mean accepted block (tokens per decoding step, Table 2's measure), model calls;
- speed: seconds per image and speedup over greedy decoding with a KV cache, run first, in the
  same run (and over greedy without a cache, as the paper's reference code runs);
- quality: PSNR, SSIM and a perceptual distance against the real face and against the model's own
  exact (= greedy) output; the bicubic and nearest-neighbour upscalings of the 8x8 input are rows too.
The JSON layout (one record per weights x k x mode) is documented in docs/evaluate.md and in
records.RECORD_FIELDS; it is versioned by SCHEMA_VERSION.

The package, one module per job: config (modes, EvalConfig), run (decode and measure), store
(decode batches and the JSON on disk), records (the schema), merge (`--merge`), report
(Markdown) and plots. Its public names are importable from here.
"""
from __future__ import annotations

from ..decoding import DecodeOptions, DecodeStats  # as the modules use them
from .config import (
    Mode, parse_mode, parse_list, weights_spec, weights_name, infer_variant, EvalConfig, DTYPES
)
from .records import (
    SCHEMA, SCHEMA_VERSION, PAPER_TABLE2, PAPER_PEAK, RECORD_FIELDS, new_record, ratios_to_greedy,
    summarize
)
from .store import STORE_VERSION, CODE_VERSION, DecodeStore, join_batches, write_json
from .run import machine_info, time_uncached_greedy, quality, run_evaluation, evaluate
from .merge import (
    MERGE_SAME_SETTINGS, SETTING_BEFORE_IT_EXISTED, ROW_IDENTITY, pool_records, merge_results,
    merge
)
from .report import (
    head_acceptance, table2_markdown, speed_markdown, quality_markdown, exact_markdown,
    differences, report_markdown, runs_markdown, method_notes, summary_markdown, headline_markdown,
    write_all
)
from .plots import grid_image, plot_mean_block, plot_speedup, plot_quality
