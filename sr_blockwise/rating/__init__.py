"""Human rating studies: the paper's pairwise preference study (Table 3), run locally.

Raters see two 32x32 faces made from the same 8x8 input, in random order, and pick the one "more
likely taken by a camera". This package holds everything but the web page (apps/rating.py),
one concern a module:

- conditions.py: the conditions (a decode mode and its weights, or the real photo) and the
  comparisons between them;
- images.py: the study's image files (PNG bytes, atomic writes, hashes, attention-check images);
- build.py: decode every study face once per condition and write a study folder
      manifest.json          conditions, comparisons, weights sha256, settings, seed, face ids,
                             sha256 of every image; study_id = a hash of all of it
      images/<cond>/NNNN.png 32x32 outputs (images/real = the photos, images/broken = the
                             attention-check images); faces n..n+p-1 are for practice only
      ratings.sqlite         the judgments (default place)
- study.py: an opened, verified study and the rater plans: each rater gets their own random trial
  order and left/right sides from a seed derived from the study seed and the rater id (the seed
  is recorded); about 1 trial in 10 is an attention check (the real photo against an obviously
  broken image).
- store.py: SQLite in WAL mode, synchronous=FULL, one transaction per judgment, UNIQUE (rater, pair)
  so a rater never judges a pair twice. A judgment is only acknowledged after its COMMIT.
- session.py: a rater's session (start, show the next pair, record an answer), without the page.
- analysis.py: preference per comparison with a 90% bootstrap interval (raters and images
  resampled), a two-sided binomial test, left-side bias, attention-check exclusion; Table 3
  beside the paper.
- common.py: the layout version, the errors and timestamps every part shares.
"""
from __future__ import annotations

from .analysis import (PAPER_FOOLED, PAPER_TABLE3, analyze, analyze_judgments, attention_summary,  # noqa: F401
                       bootstrap_ci, exclusion_rule, fooled_table, report_markdown, same_distribution, table3,
                       write_csv)
from .build import DEFAULT_QUESTION, build_study  # noqa: F401
from .common import FORMAT, RATING_VERSION, RatingError, StudyError, app_version, now_iso  # noqa: F401
from .conditions import (DEFAULT_CONDITIONS, FINETUNED, FROZEN, Condition, parse_comparisons,  # noqa: F401
                         parse_conditions, sample_seeds, weights_label)
from .images import broken_image, data_uri, png_bytes, read_png, sha256_bytes, write_file  # noqa: F401
from .session import MAX_RATER_ID, MIN_ANSWER_MS, RatingService, Shown  # noqa: F401
from .store import JUDGMENT_COLUMNS, REFUSALS_SCHEMA, SCHEMA, RatingDB  # noqa: F401
from .study import ATTENTION_EVERY, Study, Trial, damaged_files, open_study  # noqa: F401
