"""`sr-blockwise rate build | serve | analyze`: the paper's human preference study, run locally.

The page is thin: sr_blockwise.rating builds the study, plans each rater's trials, stores the
judgments and analyses them. This file only draws the page and wires the buttons.
"""
from __future__ import annotations

import html
import os
import secrets
import sys
import threading
import time

INFO = """\
## Face rating

You will see pairs of small face images, side by side. For each pair, pick the image that answers
the question best. There are no right or wrong answers for most pairs: go with your first
impression. A few practice pairs come first (not recorded).

**What is stored:** the rater id you type below (use a code, not your name), your choices, which
side each image was on, and how long each answer took. Nothing else about you is recorded. You can
stop at any time; to continue later, come back and enter the same rater id.
"""

CSS = """
.sr-pair { display: flex; gap: 24px; justify-content: center; }
.sr-pair figure { margin: 0; text-align: center; }
.sr-pair img { width: 256px; height: 256px; image-rendering: crisp-edges; image-rendering: pixelated;
               border: 1px solid #8884; }
"""

# Left / right arrow keys press the buttons (not while typing in a text box; held keys ignored).
KEYS_JS = """
<script>
document.addEventListener("keydown", (e) => {
  if (e.repeat || e.altKey || e.ctrlKey || e.metaKey) return;
  const t = e.target;
  if (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.isContentEditable)) return;
  const id = e.key === "ArrowLeft" ? "pick-left" : e.key === "ArrowRight" ? "pick-right" : null;
  if (!id) return;
  const b = document.getElementById(id);
  if (b && b.offsetParent !== null && !b.disabled) { e.preventDefault(); b.click(); }
});
</script>
"""


def pair_html(shown) -> str:
    from sr_blockwise.rating import data_uri
    return (f'<div class="sr-pair" data-pair-number="{shown.number}">'
            f'<figure><img id="img-left" alt="left image" src="{data_uri(shown.left)}"></figure>'
            f'<figure><img id="img-right" alt="right image" src="{data_uri(shown.right)}"></figure></div>')


def build_app(service, admin_token: str):
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gradio as gr

    from sr_blockwise.rating import RatingError, analyze, report_markdown

    study = service.study
    keep = gr.update()
    locks: dict[str, threading.Lock] = {}  # one answer at a time per page session

    def view(state, shown, msg=""):
        """outputs: state, start_col, trial_col, done_col, start_msg, banner, pair, status, done, token"""
        if shown is None:
            n, total = service.progress(state)
            return (state, gr.update(visible=False), gr.update(visible=False), gr.update(visible=True), "",
                    "", "", "", f"### Thank you!\n\nYou have answered {n} of {total} pairs. "
                    f"You can close this page.", "")
        return (state, gr.update(visible=False), gr.update(visible=True), gr.update(visible=False), "",
                f"**{shown.banner}**", pair_html(shown), msg, "", shown.token)

    def restart(state, msg):
        return (state, gr.update(visible=True), gr.update(visible=False), gr.update(visible=False),
                f"**{msg}**", keep, keep, keep, keep, "")

    def on_start(rater_id, consent, state):
        try:
            state = service.begin(rater_id, consent)
            return view(state, service.show(state))
        except RatingError as e:
            return restart(state, e)

    def on_pick(side, token, state):
        if not (isinstance(state, dict) and state.get("rater")):
            return restart(None, "no rating session (the page is stale or the server restarted): "
                                 "enter your rater id and press Start")
        with locks.setdefault(state["session"], threading.Lock()):  # setdefault is atomic
            try:
                msg = service.answer(state, side, token or "")
            except RatingError as e:
                return (state, keep, keep, keep, keep, keep, keep, f"**{e}**", keep, keep)
            return view(state, service.show(state), msg)

    def on_admin(token):
        if not token or not secrets.compare_digest(token.encode(), admin_token.encode()):
            time.sleep(1.0)  # slows down guessing
            return "Wrong admin token."
        try:
            return report_markdown(analyze(study, service.db.path))
        except ValueError as e:
            return f"**{e}**"

    with gr.Blocks(title="Face rating", analytics_enabled=False) as app:
        state = gr.State(None)
        with gr.Tabs():
            with gr.Tab("Rate"):
                with gr.Column(visible=True) as start_col:
                    gr.Markdown(INFO)
                    rater = gr.Textbox(label="Rater id", max_lines=1, elem_id="rater-id")
                    consent = gr.Checkbox(label="I have read the above and agree to take part", elem_id="consent")
                    start = gr.Button("Start", variant="primary", elem_id="start-btn")
                    start_msg = gr.Markdown(elem_id="start-msg")
                with gr.Column(visible=False) as trial_col:
                    banner = gr.Markdown(elem_id="banner")
                    gr.Markdown(f"### {html.escape(study.question)}")
                    pair = gr.HTML(elem_id="pair")
                    with gr.Row():
                        left = gr.Button("◀ Left (← key)", elem_id="pick-left")
                        right = gr.Button("Right (→ key) ▶", elem_id="pick-right")
                    status = gr.Markdown(elem_id="status")
                    token_box = gr.Textbox(visible=False)  # which pair the page shows
                with gr.Column(visible=False) as done_col:
                    done = gr.Markdown(elem_id="done-msg")
            with gr.Tab("Results (admin)"):
                token = gr.Textbox(label="Admin token", type="password", max_lines=1, elem_id="admin-token")
                show = gr.Button("Show results", elem_id="admin-btn")
                results = gr.Markdown(elem_id="admin-results")

        outs = [state, start_col, trial_col, done_col, start_msg, banner, pair, status, done, token_box]
        hidden = dict(api_visibility="private", show_progress="hidden")  # no flicker between pairs
        start.click(on_start, [rater, consent, state], outs, **hidden)
        rater.submit(on_start, [rater, consent, state], outs, **hidden)
        left.click(lambda tok, s: on_pick("left", tok, s), [token_box, state], outs, **hidden)
        right.click(lambda tok, s: on_pick("right", tok, s), [token_box, state], outs, **hidden)
        show.click(on_admin, [token], [results], **hidden)
    return app


# ---------------------------------------------------------------- commands

def cmd_build(a) -> int:
    from sr_blockwise.rating import build_study
    build_study(a.study, a.conditions, a.compare or "baseline", data=a.data, split=a.split,
                n_faces=a.faces, n_practice=a.practice, seed=a.seed, question=a.question,
                frozen=a.frozen, finetuned=a.finetuned, batch_size=a.batch_size, threads=a.threads,
                progress=not a.quiet)
    return 0


def cmd_serve(a) -> int:
    from sr_blockwise.rating import RatingService, open_study

    from . import check_port
    check_port(a.host, a.port)
    service = RatingService(open_study(a.study), a.db, a.trials, a.min_answer_ms)
    token = a.admin_token or os.environ.get("SR_BLOCKWISE_ADMIN_TOKEN") or secrets.token_urlsafe(16)
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {a.host}: anyone who can reach it can rate", file=sys.stderr)
    print(f"study {service.study.study_id}: judgments go to {service.db.path}")
    if not (a.admin_token or os.environ.get("SR_BLOCKWISE_ADMIN_TOKEN")):
        print(f"admin token for the results tab: {token}")
    sys.stdout.flush()
    app = build_app(service, token)
    app.queue(default_concurrency_limit=8)
    app.launch(server_name=a.host, server_port=a.port, share=False, quiet=False, footer_links=[],
               run_history=False, enable_monitoring=False, ssr_mode=False, mcp_server=False,
               css=CSS, head=KEYS_JS)
    return 0


def cmd_analyze(a) -> int:
    from sr_blockwise.rating import RatingDB, analyze, open_study, report_markdown, write_csv
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
    from sr_blockwise.rating import DEFAULT_CONDITIONS, DEFAULT_QUESTION, FINETUNED, FROZEN, MIN_ANSWER_MS

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
