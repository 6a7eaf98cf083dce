"""`sr-blockwise rate build | serve | analyze`: the paper's human preference study, run locally
(docs/rating.md). The study is sr_blockwise.rating's; the rater page, apps/rating.py's."""
from __future__ import annotations

import os
import secrets
import sys


def cmd_build(a) -> int:
    from ..rating import build_study
    build_study(a.study, a.conditions, a.compare or "baseline", data=a.data, split=a.split,
                n_faces=a.faces, n_practice=a.practice, seed=a.seed, question=a.question,
                frozen=a.frozen, finetuned=a.finetuned, batch_size=a.batch_size, threads=a.threads,
                progress=not a.quiet)
    return 0


def cmd_serve(a) -> int:
    from apps import check_port

    from ..rating import RatingService, open_study
    check_port(a.host, a.port)
    service = RatingService(open_study(a.study), a.db, a.trials, a.min_answer_ms)
    token = a.admin_token or os.environ.get("SR_BLOCKWISE_ADMIN_TOKEN") or secrets.token_urlsafe(16)
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {a.host}: anyone who can reach it can rate", file=sys.stderr)
    print(f"study {service.study.study_id}: judgments go to {service.db.path}")
    if not (a.admin_token or os.environ.get("SR_BLOCKWISE_ADMIN_TOKEN")):
        print(f"admin token for the results tab: {token}")
    sys.stdout.flush()
    from apps.rating import serve  # gradio, after the study opened: a bad study is reported first
    serve(service, token, a.host, a.port)
    return 0


def cmd_analyze(a) -> int:
    from ..rating import RatingDB, analyze, open_study, report_markdown, write_csv
    study = open_study(a.study)
    res = analyze(study, a.db, min_attention=a.min_attention, n_boot=a.boot, level=a.level, seed=a.seed)
    text = report_markdown(res)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(text)
    if a.csv:
        db = RatingDB(a.db or study.folder / "ratings.sqlite", study.study_id, create=False)
        print(f"judgments written to {write_csv(db.judgments(), a.csv, set(res['excluded']))}", file=sys.stderr)
    return 0


def register(sub) -> None:
    from ..rating import DEFAULT_CONDITIONS, DEFAULT_QUESTION, FINETUNED, FROZEN, MIN_ANSWER_MS

    p = sub.add_parser("rate", help="human pairwise rating study (paper Table 3): build, serve, analyze")
    rs = p.add_subparsers(dest="rate_command", required=True, metavar="{build,serve,analyze}")

    b = rs.add_parser("build", help="decode the study faces once per condition into a study folder (resumable)")
    b.add_argument("study", help="study folder to create or finish")
    b.add_argument("--conditions", nargs="+", default=DEFAULT_CONDITIONS,
                   help="decode modes in the project's grammar, K may be a list, then @W: greedy[@W] | "
                        "exact:k=K[,K..][@W] | eps=E:k=K[,K..][@W] | sample:k=K:T=T[@W] | ... (:w=G: input "
                        "guidance), or real (default: the paper's Table 3 conditions and the real photo)")
    b.add_argument("--compare", nargs="+", default=None,
                   help="'baseline' (default: every condition against the first), 'all', or 'A vs B' items")
    b.add_argument("--frozen", default=FROZEN, help="weights for greedy without @W")
    b.add_argument("--finetuned", default=FINETUNED, help="weights for every other mode without @W")
    b.add_argument("--data", default=None, help="faces: .npz, CelebA folder or photo folder")
    b.add_argument("--split", default="test", choices=["train", "val", "test", "all"])
    b.add_argument("--faces", type=int, default=100, help="faces rated per comparison")
    b.add_argument("--practice", type=int, default=3, help="extra faces for practice trials")
    b.add_argument("--seed", type=int, default=0, help="picks the faces, and each sampled face's seed")
    b.add_argument("--question", default=DEFAULT_QUESTION)
    b.add_argument("--batch-size", type=int, default=16)
    b.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    b.add_argument("--quiet", action="store_true")
    b.set_defaults(func=cmd_build)

    s = rs.add_parser("serve", help="the rater web page on 127.0.0.1")
    s.add_argument("study")
    s.add_argument("--db", default=None, help="judgments database (default STUDY/ratings.sqlite)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=7861)
    s.add_argument("--trials", type=int, default=100, help="pairs per rater (0: every pair of the study)")
    s.add_argument("--min-answer-ms", type=int, default=MIN_ANSWER_MS,
                   help="answers sooner than this after their pair appeared are refused as double presses "
                        "(nothing recorded; the pair stays); default %(default)s, 0: off")
    s.add_argument("--admin-token", default=None,
                   help="token for the results tab (default: $SR_BLOCKWISE_ADMIN_TOKEN or a random one, printed)")
    s.set_defaults(func=cmd_serve)

    z = rs.add_parser("analyze", help="preference per comparison with bootstrap CIs; Table 3 beside the paper")
    z.add_argument("study")
    z.add_argument("--db", default=None)
    z.add_argument("--csv", default=None, help="also write every judgment to this CSV file")
    z.add_argument("--out", default=None, help="also write the Markdown report here")
    z.add_argument("--min-attention", type=float, default=0.8,
                   help="exclude raters passing fewer than this share of attention checks")
    z.add_argument("--boot", type=int, default=2000, help="bootstrap resamples")
    z.add_argument("--level", type=float, default=0.90, help="confidence level")
    z.add_argument("--seed", type=int, default=0)
    z.set_defaults(func=cmd_analyze)
