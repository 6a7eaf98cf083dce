"""The rater page of `sr-blockwise rate serve` (sr_blockwise/cli/rate.py): the paper's human
preference study, run locally.

The page is thin: sr_blockwise.rating builds the study, plans each rater's trials, stores the
judgments and analyses them. This file only draws the page and wires the buttons.
"""
from __future__ import annotations

import os

# before gradio is imported: no usage analytics, no calls to the Hugging Face hub
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import html
import secrets
import threading
import time
from dataclasses import dataclass

import gradio as gr

from sr_blockwise.rating import RatingError, analyze, data_uri, report_markdown

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
    return (f'<div class="sr-pair" data-pair-number="{shown.number}">'
            f'<figure><img id="img-left" alt="left image" src="{data_uri(shown.left)}"></figure>'
            f'<figure><img id="img-right" alt="right image" src="{data_uri(shown.right)}"></figure></div>')


def build_app(service, admin_token: str):
    """The rater page for a rating.RatingService; admin_token opens the results tab."""
    with gr.Blocks(title="Face rating", analytics_enabled=False) as app:
        page = layout(service.study.question)
        wire(page, RaterHandlers(service, admin_token))
    return app


@dataclass
class RaterPage:
    """The rater page's components that its events read or update."""
    state: gr.State  # the rater's session (rating.RatingService.begin)
    rater: gr.Textbox
    consent: gr.Checkbox
    start: gr.Button
    start_col: gr.Column
    start_msg: gr.Markdown
    trial_col: gr.Column
    banner: gr.Markdown
    pair: gr.HTML
    left: gr.Button
    right: gr.Button
    status: gr.Markdown
    token_box: gr.Textbox  # which pair the page shows
    done_col: gr.Column
    done: gr.Markdown
    admin_token: gr.Textbox
    show: gr.Button
    results: gr.Markdown

    def outputs(self) -> list:
        """What a start or a pick updates: RaterHandlers.view's values, in its order."""
        return [self.state, self.start_col, self.trial_col, self.done_col, self.start_msg, self.banner,
                self.pair, self.status, self.done, self.token_box]


def layout(question: str) -> RaterPage:
    """The page's components, made inside the gr.Blocks being built: a start, a trial and a done
    view (one shown at a time) on the Rate tab, and the admin's results tab."""
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
                gr.Markdown(f"### {html.escape(question)}")
                pair = gr.HTML(elem_id="pair")
                with gr.Row():
                    left = gr.Button("◀ Left (← key)", elem_id="pick-left")
                    right = gr.Button("Right (→ key) ▶", elem_id="pick-right")
                status = gr.Markdown(elem_id="status")
                token_box = gr.Textbox(visible=False)
            with gr.Column(visible=False) as done_col:
                done = gr.Markdown(elem_id="done-msg")
        with gr.Tab("Results (admin)"):
            admin_token = gr.Textbox(label="Admin token", type="password", max_lines=1, elem_id="admin-token")
            show = gr.Button("Show results", elem_id="admin-btn")
            results = gr.Markdown(elem_id="admin-results")
    return RaterPage(state=state, rater=rater, consent=consent, start=start, start_col=start_col,
                     start_msg=start_msg, trial_col=trial_col, banner=banner, pair=pair, left=left, right=right,
                     status=status, token_box=token_box, done_col=done_col, done=done, admin_token=admin_token,
                     show=show, results=results)


class RaterHandlers:
    """The page's buttons, on a rating.RatingService: each returns the values of RaterPage.outputs
    (or, for the admin's button, the results' text)."""

    def __init__(self, service, admin_token: str):
        self.service, self.admin_token = service, admin_token
        self.keep = gr.update()
        self.locks: dict[str, threading.Lock] = {}  # one answer at a time per page session

    def view(self, state, shown, msg=""):
        """outputs: state, start_col, trial_col, done_col, start_msg, banner, pair, status, done, token"""
        if shown is None:
            n, total = self.service.progress(state)
            return (state, gr.update(visible=False), gr.update(visible=False), gr.update(visible=True), "",
                    "", "", "", f"### Thank you!\n\nYou have answered {n} of {total} pairs. "
                    f"You can close this page.", "")
        return (state, gr.update(visible=False), gr.update(visible=True), gr.update(visible=False), "",
                f"**{shown.banner}**", pair_html(shown), msg, "", shown.token)

    def restart(self, state, msg):
        keep = self.keep
        return (state, gr.update(visible=True), gr.update(visible=False), gr.update(visible=False),
                f"**{msg}**", keep, keep, keep, keep, "")

    def on_start(self, rater_id, consent, state):
        try:
            state = self.service.begin(rater_id, consent)
            return self.view(state, self.service.show(state))
        except RatingError as e:
            return self.restart(state, e)

    def on_pick(self, side, token, state):
        if not (isinstance(state, dict) and state.get("rater")):
            return self.restart(None, "no rating session (the page is stale or the server restarted): "
                                      "enter your rater id and press Start")
        with self.locks.setdefault(state["session"], threading.Lock()):  # setdefault is atomic
            try:
                msg = self.service.answer(state, side, token or "")
            except RatingError as e:
                keep = self.keep
                return (state, keep, keep, keep, keep, keep, keep, f"**{e}**", keep, keep)
            return self.view(state, self.service.show(state), msg)

    def on_admin(self, token):
        if not token or not secrets.compare_digest(token.encode(), self.admin_token.encode()):
            time.sleep(1.0)  # slows down guessing
            return "Wrong admin token."
        try:
            return report_markdown(analyze(self.service.study, self.service.db.path))
        except ValueError as e:
            return f"**{e}**"


def wire(page: RaterPage, handlers: RaterHandlers) -> None:
    """The page's events, inside the gr.Blocks being built."""
    outs = page.outputs()
    hidden = dict(api_visibility="private", show_progress="hidden")  # no flicker between pairs
    page.start.click(handlers.on_start, [page.rater, page.consent, page.state], outs, **hidden)
    page.rater.submit(handlers.on_start, [page.rater, page.consent, page.state], outs, **hidden)
    page.left.click(lambda tok, s: handlers.on_pick("left", tok, s), [page.token_box, page.state], outs, **hidden)
    page.right.click(lambda tok, s: handlers.on_pick("right", tok, s), [page.token_box, page.state], outs, **hidden)
    page.show.click(handlers.on_admin, [page.admin_token], [page.results], **hidden)


def serve(service, admin_token: str, host: str, port: int) -> None:
    """The rater page for `service`, served on host:port until stopped."""
    app = build_app(service, admin_token)
    app.queue(default_concurrency_limit=8)
    app.launch(server_name=host, server_port=port, share=False, quiet=False, footer_links=[],
               run_history=False, enable_monitoring=False, ssr_mode=False, mcp_server=False,
               css=CSS, head=KEYS_JS)
