"""The rater page of `sr-blockwise rate serve` (sr_blockwise/cli/rate.py): the paper's human
preference study, run locally.

The page is thin: sr_blockwise.rating builds the study, plans each rater's trials, stores the
judgments and analyses them. This file only draws the page and wires the buttons.
"""
from __future__ import annotations

import html
import os
import secrets
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


def serve(service, admin_token: str, host: str, port: int) -> None:
    """The rater page for `service`, served on host:port until stopped."""
    app = build_app(service, admin_token)
    app.queue(default_concurrency_limit=8)
    app.launch(server_name=host, server_port=port, share=False, quiet=False, footer_links=[],
               run_history=False, enable_monitoring=False, ssr_mode=False, mcp_server=False,
               css=CSS, head=KEYS_JS)
