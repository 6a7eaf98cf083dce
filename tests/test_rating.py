"""Human rating study: build, rater sessions (library and real browser), storage, analysis."""
import json
import multiprocessing as mp
import os
import re
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sr_blockwise import rating
from sr_blockwise.cli import main as cli_main
from sr_blockwise.rating import RatingError, RatingService, StudyError

ROOT = Path(__file__).resolve().parent.parent
N_FACES, N_PRACTICE = 4, 2


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory, tiny_weights, celeba_npz):
    """A tiny study: 4 faces (+2 practice) x greedy, eps=255:k=10 (fast) and the real photo."""
    import torch
    threads = torch.get_num_threads()
    folder = tmp_path_factory.mktemp("study") / "s"
    rating.build_study(folder, [f"greedy@{tiny_weights}", f"eps=255:k=10@{tiny_weights}", "real"],
                       data=celeba_npz, n_faces=N_FACES, n_practice=N_PRACTICE, threads=1, progress=False,
                       log=lambda *a: None)
    torch.set_num_threads(threads)
    return folder


@pytest.fixture
def study_copy(study_dir, tmp_path):
    dst = tmp_path / "study"
    shutil.copytree(study_dir, dst, ignore=shutil.ignore_patterns("ratings.sqlite*"))
    return dst


# ---------------------------------------------------------------- study building

def test_conditions_and_comparisons():
    conds, refs = rating.parse_conditions(rating.DEFAULT_CONDITIONS)
    names = [c.name for c in conds]
    assert names[0] == "greedy@cpu-frozen" and "exact:k=6@cpu-finetuned" in names
    assert "eps=2:k=10@cpu-finetuned" in names and names[-1] == "real" and len(names) == 12
    assert refs == {"cpu-frozen": "cpu-frozen", "cpu-finetuned": "cpu-finetuned"}
    pairs = rating.parse_comparisons("baseline", conds)
    assert ("eps=2:k=6@cpu-finetuned", "greedy@cpu-frozen") in pairs
    assert ("greedy@cpu-frozen", "real") in pairs and len(pairs) == 11
    (c,), refs = rating.parse_conditions(["exact:k=4@/x/y/my-weights.json"])
    assert c.name == "exact:k=4@my-weights" and refs["my-weights"] == "/x/y/my-weights.json"
    assert rating.parse_comparisons(["exact:k=2 vs greedy"], rating.parse_conditions(
        ["greedy", "exact:k=2"])[0]) == [("exact:k=2@cpu-finetuned", "greedy@cpu-frozen")]
    for bad, msg in [(["greedy:k=3"], "greedy decodes one token"), (["beam:k=2"], "unknown decode mode 'beam'"),
                     (["exact"], "block size"), (["greedy", "greedy"], "listed twice")]:
        with pytest.raises(StudyError, match=msg):
            rating.parse_conditions(bad)


def test_build_manifest_and_resume(study_dir, study_copy, tiny_weights, celeba_npz):
    st = rating.open_study(study_dir)
    m = st.manifest
    assert m["complete"] and len(st.study_id) == 16
    s = m["settings"]
    assert s["weights"]["tiny-random"]["sha256"] == json.loads(Path(tiny_weights).read_text())["sha256"]
    assert s["seed"] == 0 and s["n_faces"] == N_FACES and s["question"] == rating.DEFAULT_QUESTION
    assert st.comparisons == [("eps=255:k=10@tiny-random", "greedy@tiny-random"), ("greedy@tiny-random", "real")]
    assert st.images["greedy@tiny-random"].shape == (N_FACES + N_PRACTICE, 32, 32, 3)
    assert m["decode"]["eps=255:k=10@tiny-random"]["mean_block"] > 9
    # a killed build: manifest not complete, one image missing -> the rerun decodes just that one
    mp_ = study_copy / "manifest.json"
    man = json.loads(mp_.read_text())
    keep = {k: v for k, v in man.items() if k not in ("files", "study_id", "decode")}
    mp_.write_text(json.dumps({**keep, "complete": False}))
    cdir = study_copy / s["conditions"][1]["dir"]
    (cdir / "0002.png").unlink()
    before = (cdir / "0001.png").stat().st_mtime_ns
    with pytest.raises(StudyError, match="did not finish"):
        rating.open_study(study_copy)
    args = dict(conditions=[f"greedy@{tiny_weights}", f"eps=255:k=10@{tiny_weights}", "real"], data=celeba_npz,
                n_faces=N_FACES, n_practice=N_PRACTICE, threads=1, progress=False, log=lambda *a: None)
    again = rating.build_study(study_copy, **args)
    assert again["study_id"] == st.study_id and (cdir / "0002.png").exists()
    assert (cdir / "0001.png").stat().st_mtime_ns == before
    with pytest.raises(StudyError, match="different study.*n_faces"):
        rating.build_study(study_copy, **{**args, "n_faces": 3})


def test_build_restores_a_complete_study(study_dir, study_copy, tiny_weights, celeba_npz):
    """A complete study with an image deleted and one altered: serving refuses it, and building
    again with its settings makes the two again, bit for bit as recorded (the same study id, so
    its ratings database still belongs to it), writing no other file."""
    st = rating.open_study(study_dir)
    cdir = study_copy / st.manifest["settings"]["conditions"][1]["dir"]
    (cdir / "0002.png").unlink()
    real = study_copy / "images" / "real" / "0001.png"
    real.write_bytes(real.read_bytes()[:-5] + b"xxxxx")
    with pytest.raises(StudyError, match="2 study image.*makes them again"):
        rating.open_study(study_copy)

    def stamps():
        return {p: p.stat().st_mtime_ns for p in study_copy.rglob("*.png") if p not in (real, cdir / "0002.png")}
    before = stamps()
    args = dict(conditions=[f"greedy@{tiny_weights}", f"eps=255:k=10@{tiny_weights}", "real"], data=celeba_npz,
                n_faces=N_FACES, n_practice=N_PRACTICE, threads=1, progress=False)
    logged = []
    again = rating.build_study(study_copy, **args, log=logged.append)
    assert again["study_id"] == st.study_id and "restored" in logged[-1]
    assert rating.open_study(study_copy).study_id == st.study_id
    assert stamps() == before
    # an image that comes out otherwise than recorded (other faces under --data, another
    # processor's rounding) is not written, and nothing else is touched
    man = json.loads((study_copy / "manifest.json").read_text())
    gone = f"{cdir.relative_to(study_copy).as_posix()}/0003.png"
    (study_copy / gone).unlink()
    man["files"][gone] = "0" * 64
    man["study_id"] = rating.sha256_bytes(json.dumps({"settings": man["settings"], "files": man["files"]},
                                                     sort_keys=True).encode())[:16]
    (study_copy / "manifest.json").write_text(json.dumps(man))
    before = stamps()
    with pytest.raises(StudyError, match="1 image.*differ from the study's.*not written.*new folder"):
        rating.build_study(study_copy, **args, log=lambda *a: None)
    assert stamps() == before and not (study_copy / gone).exists()


# ---------------------------------------------------------------- rater sessions (library)

def test_an_answer_sooner_than_a_person_could_compare_is_refused(study_copy):
    """The next pair is on screen ~10 ms after an answer, so the second press of a double press
    lands on it: an answer within min_answer_ms of its pair is refused, nothing is recorded, and
    the pair waits for a real one."""
    st = rating.open_study(study_copy)
    svc = RatingService(st, trials_per_rater=0, min_answer_ms=300)
    s = svc.begin("quick", consent=True)
    while svc.show(s).trial.practice:
        time.sleep(0.31)
        svc.answer(s, "left")
    time.sleep(0.31)
    assert svc.answer(s, "left").startswith("Recorded")
    shown = svc.show(s)
    with pytest.raises(RatingError, match="Too quick.*this pair still waits"):
        svc.answer(s, "right", token=shown.token)
    assert len(svc.db.judgments()) == 1 and s["pending"]["token"] == shown.token
    time.sleep(0.31)
    assert svc.answer(s, "right", token=shown.token) == "Recorded answer 2."
    with pytest.raises(StudyError, match=">= 0 ms"):
        RatingService(st, min_answer_ms=-1)
    # the refusal is kept beside the judgments, and the analysis counts it per rater
    (refused,) = svc.db.refusals()
    assert (refused["rater"], refused["trial"], refused["practice"], refused["min_answer_ms"]) == (
        "quick", shown.trial.index, 0, 300) and refused["rt_ms"] < 300
    res = rating.analyze(st, n_boot=10)
    assert res["refused_quick"] == {"n": 1, "min_answer_ms": [300], "by_rater": {"quick": 1}}
    assert "Presses refused as too quick (under 300 ms after their pair appeared; not judgments): 1, by rater: quick 1" \
        in rating.report_markdown(res)


def test_plan_resume_and_limits(study_copy):
    st = rating.open_study(study_copy)
    plan = st.plan(st.rater_seed("r1"))
    assert len(plan) == 2 * N_FACES + 1 and sum(t.attention for t in plan) == 1
    assert len({t.pair for t in plan}) == len(plan)
    assert plan != st.plan(st.rater_seed("r2"))  # order / sides differ per rater
    svc = RatingService(st, trials_per_rater=6, min_answer_ms=0)
    s = svc.begin("r1", consent=True)
    assert svc.db.rater("r1")[0] == st.rater_seed("r1")  # the seed is recorded
    for _ in range(N_PRACTICE):
        assert svc.show(s).trial.practice
        svc.answer(s, "left")
    sides = ["left", "right", "left"]
    for side in sides:
        sh = svc.show(s)
        assert not sh.trial.practice and sh.banner.startswith(f"Pair {sh.number} of 6")
        assert svc.answer(s, side).startswith("Recorded")
    svc.show(s)  # shown, not answered: the rater leaves
    s2 = svc.begin("r1", consent=False)  # comes back: no practice, resumes at the 4th pair
    sh = svc.show(s2)
    assert not sh.trial.practice and sh.trial.index == 3 and sh.number == 4
    svc.answer(s2, "right")
    # the first window still shows pair 4 and answers it: refused, nothing changes
    assert "already answered" in svc.answer(s, "left")
    sh = svc.show(s2)  # an answer quoting a pair no longer on screen is refused
    with pytest.raises(RatingError, match="no longer on screen"):
        svc.answer(s2, "left", token="0" * 12)
    svc.answer(s2, "left", token=sh.token)
    svc.show(s2)
    svc.answer(s2, "left")
    assert svc.show(s2) is None  # the 6-pair limit
    rows = svc.db.judgments()
    assert [r["trial"] for r in rows] == list(range(6))
    assert [r["chosen_side"] for r in rows] == sides + ["right", "left", "left"]
    assert len({r["session"] for r in rows}) == 2
    for r in rows:
        t = plan[r["trial"]]
        assert (r["pair"], r["left_cond"], r["attention"]) == (t.pair, t.left, int(t.attention))
        assert r["chosen_cond"] == (t.left if r["chosen_side"] == "left" else t.right)
        assert r["rt_ms"] >= 0 and r["app_version"].startswith("sr-blockwise")
        assert r["weights"] == ("" if t.attention else f"tiny-random:{st.weights_sha['tiny-random'][:12]}")


def test_bad_input_messages(study_dir, study_copy, tmp_path):
    with pytest.raises(StudyError, match="no study folder"):
        rating.open_study(tmp_path / "nope")
    st = rating.open_study(study_copy)
    svc = RatingService(st, min_answer_ms=0)
    with pytest.raises(RatingError, match="consent"):
        svc.begin("newbie", consent=False)
    with pytest.raises(RatingError, match="rater id"):
        svc.begin("  ", consent=True)
    s = svc.begin("r1", consent=True)
    s["practice"] = N_PRACTICE
    svc.show(s)
    svc.answer(s, "left")
    before = svc.db.judgments()
    with pytest.raises(RatingError, match="no pair is waiting"):
        svc.answer(s, "left")
    svc.show(s)
    with pytest.raises(RatingError, match="unknown action 'up'"):
        svc.answer(s, "up")
    with pytest.raises(RatingError, match="no rating session"):
        svc.answer(None, "left")
    assert svc.db.judgments() == before
    # a database of another study, and a file that is not a database
    other = tmp_path / "other.sqlite"
    rating.RatingDB(other, "0123456789abcdef")
    with pytest.raises(StudyError, match="another study"):
        RatingService(st, other)
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database\n" * 100)
    with pytest.raises(StudyError, match="not a usable ratings database"):
        RatingService(st, junk)
    # an altered image / manifest: refused, and the recorded judgments are untouched
    img = next((study_copy / "images" / "real").glob("*.png"))
    data = img.read_bytes()
    img.write_bytes(data[:-5] + b"xxxxx")
    with pytest.raises(StudyError, match="missing or altered"):
        rating.open_study(study_copy)
    img.write_bytes(data)
    man = json.loads((study_copy / "manifest.json").read_text())
    man["settings"]["question"] = "Which is prettier?"
    (study_copy / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(StudyError, match="manifest.json was altered"):
        rating.open_study(study_copy)
    assert rating.RatingDB(study_copy / "ratings.sqlite", st.study_id).judgments() == before
    # the command line says it plainly
    assert cli_main(["rate", "analyze", str(study_copy)]) == 2
    assert cli_main(["rate", "serve", str(tmp_path / "nope")]) == 2


def test_a_failed_write_keeps_the_pair_waiting(study_copy):
    """The disk fails once while an answer is saved (a trigger stands in for a full disk): the
    rater gets a clear message, the pair stays on screen and waiting, and the same click stored
    once the disk works again. A negative trial count is refused."""
    st = rating.open_study(study_copy)
    svc = RatingService(st, min_answer_ms=0)
    s = svc.begin("r1", consent=True)
    s["practice"] = N_PRACTICE
    shown = svc.show(s)
    with sqlite3.connect(svc.db.path) as con:
        con.execute("CREATE TRIGGER fail BEFORE INSERT ON judgments "
                    "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END")
    with pytest.raises(RatingError, match="could not be saved.*disk is full.*choose again"):
        svc.answer(s, "left", token=shown.token)
    assert s["pending"] and s["pending"]["token"] == shown.token and svc.db.judgments() == []
    with sqlite3.connect(svc.db.path) as con:
        con.execute("DROP TRIGGER fail")
    assert svc.answer(s, "left", token=shown.token) == "Recorded answer 1."
    [row] = svc.db.judgments()
    assert row["trial"] == shown.trial.index and row["chosen_side"] == "left"
    with pytest.raises(StudyError, match="trials per rater must be >= 0"):
        RatingService(st, trials_per_rater=-3)
    # the same at the end of practice (the rater's last practice pair stays waiting, not stuck)
    # and at Start; and a database that cannot be written at all is refused when serving starts
    p = svc.begin("r2", consent=True)
    for _ in range(N_PRACTICE - 1):
        svc.show(p)
        svc.answer(p, "left")
    last = svc.show(p)
    fail = "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END"
    with sqlite3.connect(svc.db.path) as con:
        con.execute(f"CREATE TRIGGER fail BEFORE UPDATE ON raters {fail}")
    with pytest.raises(RatingError, match="end of your practice could not be saved.*choose again"):
        svc.answer(p, "right", token=last.token)
    assert p["pending"]["token"] == last.token and p["practice"] == N_PRACTICE - 1
    with sqlite3.connect(svc.db.path) as con:
        con.execute("DROP TRIGGER fail")
        con.execute(f"CREATE TRIGGER fail BEFORE INSERT ON raters {fail}")
        con.execute(f"CREATE TRIGGER fail_meta BEFORE UPDATE ON meta {fail}")
    with pytest.raises(RatingError, match="cannot be written to right now.*press Start again"):
        svc.begin("r3", consent=True)
    with pytest.raises(StudyError, match="judgments could not be written there"):
        RatingService(st)
    with sqlite3.connect(svc.db.path) as con:
        con.execute("DROP TRIGGER fail")
        con.execute("DROP TRIGGER fail_meta")
    assert svc.answer(p, "right", token=last.token).startswith("Practice finished")
    assert svc.begin("r3", consent=True)["practice"] == 0


def _rater_worker(folder, db, rater, q):
    svc = RatingService(rating.open_study(folder), db, trials_per_rater=0, min_answer_ms=0)
    s = svc.begin(rater, consent=True)
    s["practice"] = N_PRACTICE
    acks = 0
    while (sh := svc.show(s)) is not None:
        acks += svc.answer(s, "left" if sh.trial.index % 3 else "right").startswith("Recorded")
    q.put((rater, acks))


def test_concurrent_raters(study_copy):
    """Six writers at once, two of them the same rater in two windows: nothing lost or doubled."""
    st = rating.open_study(study_copy)
    db = study_copy / "ratings.sqlite"
    RatingService(st, db)  # create the database once, as `serve` does
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    raters = ["a", "b", "c", "d", "shared", "shared"]
    procs = [ctx.Process(target=_rater_worker, args=(study_copy, db, r, q)) for r in raters]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    acks = [q.get(timeout=5) for _ in procs]
    n = len(st.plan(0))
    rows = rating.RatingDB(db, st.study_id).judgments()
    assert len(rows) == 5 * n == sum(a for _, a in acks)  # every acknowledged judgment is stored
    for r in set(raters):
        mine = [x for x in rows if x["rater"] == r]
        assert sorted(x["trial"] for x in mine) == list(range(n))
        assert len({x["pair"] for x in mine}) == n


# ---------------------------------------------------------------- analysis

def _synthetic(p_true=0.7, n_raters=30, n_images=60, bad=3, seed=1,
               a="exact:k=6@cpu-finetuned", b="greedy@cpu-frozen"):
    """Raters judging a (default exact:k=6) vs b (greedy) with a known preference for a; `bad`
    raters fail attention checks and always pick b."""
    rng = np.random.default_rng(seed)
    rows, t = [], 0
    for i in range(n_raters + bad):
        rater = f"r{i}"
        is_bad = i >= n_raters
        for j in rng.choice(n_images, 40, replace=False):
            left = a if rng.random() < 0.5 else b
            chosen = b if is_bad else (a if rng.random() < p_true else b)
            rows.append(dict(id=t, rater=rater, session="s", trial=t, pair=f"{a} vs {b} #{j}", image=int(j),
                             input_id=int(j), cond_a=a, cond_b=b, left_cond=left, right_cond=b if left == a else a,
                             chosen_side="left" if chosen == left else "right", chosen_cond=chosen, rt_ms=900,
                             attention=0, shown_at="", answered_at="", app_version="", weights=""))
            t += 1
        for j in range(4):
            chosen = "broken" if (is_bad and j < 3) else "real"
            rows.append(dict(rows[-1], id=t, trial=t, pair=f"attention #{j}", cond_a="real", cond_b="broken",
                             left_cond="real", right_cond="broken", chosen_cond=chosen, attention=1,
                             chosen_side="left" if chosen == "real" else "right"))
            t += 1
    return rows, [(a, b)]


def test_analyze_recovers_known_preference(tmp_path):
    rows, comps = _synthetic()
    res = rating.analyze_judgments(rows, comps, n_boot=1000)
    c = res["comparisons"][0]
    assert res["excluded"] == ["r30", "r31", "r32"]
    assert c["n"] == 30 * 40 and c["raters"] == 30
    lo, hi = c["ci"]
    assert lo < 0.7 < hi and lo > 0.6 and hi < 0.8 and abs(c["rate"] - 0.7) < 0.04
    assert c["p_binomial"] < 1e-6 and 0.4 < c["left_rate"] < 0.6
    # without the exclusion the bad raters would pull the preference down
    res_all = rating.analyze_judgments(rows, comps, min_attention=0.0, n_boot=200)
    assert res_all["comparisons"][0]["rate"] < c["rate"] - 0.03 and not res_all["excluded"]
    md = rating.report_markdown(res)
    assert "| 6 | 53.2 |" in md and "excluded when they picked the real photo in fewer than 80%" in md
    assert "Left-side bias" in md and "r30 (1/4 checks passed)" in md
    out = rating.write_csv(rows, tmp_path / "j.csv", set(res["excluded"]))
    lines = out.read_text().splitlines()
    assert len(lines) == len(rows) + 1 and lines[0].endswith("rater_excluded")


def rate_every_pair(svc, rater: str, side=lambda shown: "left") -> None:
    """A rater, past the practice pairs, answering every pair of the plan."""
    s = svc.begin(rater, consent=True)
    s["practice"] = N_PRACTICE
    while (shown := svc.show(s)) is not None:
        svc.answer(s, side(shown))


def test_analyze_command_on_study(study_copy, tmp_path, capsys):
    st = rating.open_study(study_copy)
    svc = RatingService(st, trials_per_rater=0, min_answer_ms=0)
    for rater in ("x", "y"):
        rate_every_pair(svc, rater, lambda shown: "left" if shown.trial.left != "broken" else "right")
    csv_path, md_path = tmp_path / "all.csv", tmp_path / "report.md"
    assert cli_main(["rate", "analyze", str(study_copy), "--csv", str(csv_path), "--out", str(md_path),
                     "--boot", "200"]) == 0
    out = capsys.readouterr().out
    assert f"Human rating study {st.study_id}" in out and "eps=255:k=10@tiny-random vs greedy@tiny-random" in out
    assert re.search(r"\| greedy@tiny-random \| [0-9.]+ \[[0-9.]+, [0-9.]+\] \(8\) \| — \|", out)  # % fooled
    assert "| 10 | — |" in out  # Table 3 row for k=10 (eps=255 has no paper number)
    assert len(csv_path.read_text().splitlines()) == 1 + 2 * len(st.plan(0))
    assert md_path.read_text().strip() == out.strip()


def test_analyze_reads_a_study_on_read_only_storage(study_copy, tmp_path):
    """An archived study on a read-only mount (SQLite cannot make the reader's NAME-shm there)
    analyzes as it does where it was rated; judgments that may be only in a write-ahead log
    there are said, not silently left out. The mount is made in a private mount namespace."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("no private mount namespace here (unshare -m needs root)")
    st = rating.open_study(study_copy)
    svc = RatingService(st, trials_per_rater=0, min_answer_ms=0)
    rate_every_pair(svc, "x")
    archive = tmp_path / "archive"
    shutil.copytree(study_copy, archive, ignore=shutil.ignore_patterns("ratings.sqlite-*"))

    def analyze_read_only():
        here, python = shlex.quote(str(archive)), shlex.quote(sys.executable)
        cmd = f"mount --bind -o ro {here} {here} && {python} -m sr_blockwise rate analyze {here} --boot 100"
        return subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, cwd=ROOT, timeout=300)

    before = (archive / "ratings.sqlite").read_bytes()
    r = analyze_read_only()
    assert r.returncode == 0, r.stderr
    assert f"1 raters (0 excluded), {len(svc.db.judgments())} judgments recorded" in r.stdout, r.stdout
    assert (archive / "ratings.sqlite").read_bytes() == before
    (archive / "ratings.sqlite-wal").write_bytes(b"\0" * 4096)
    r = analyze_read_only()
    assert r.returncode == 2 and "write-ahead log ratings.sqlite-wal: copy the folder somewhere writable" in r.stderr, r.stderr


# ---------------------------------------------------------------- the real server in a real browser

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(study, port, log):
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "sr_blockwise", "rate", "serve", str(study), "--port", str(port),
                             "--trials", "6", "--admin-token", "tok3n"], cwd=ROOT, env=env,
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline:
        assert proc.poll() is None, Path(log).read_text()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise AssertionError("server did not start:\n" + Path(log).read_text())


def test_browser_session_resume_and_kill(study_copy, tmp_path):
    """Practice, pairs by keyboard and mouse, a double press, reload and resume, SIGKILL right
    after an acknowledgement and restart: the database holds exactly the judgments made on screen."""
    import playwright.sync_api as sync_api  # a dev dependency: its absence is a failure
    chromium = shutil.which("chromium")
    if not chromium:  # in CI, setup.sh installs it: there a missing browser is a failure
        (pytest.fail if os.environ.get("CI") else pytest.skip)("chromium not installed")
    log = tmp_path / "server.log"
    port = _free_port()
    server = _serve(study_copy, port, log)
    pressed = []  # (trial number, side) in the order the rater answered
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"])
            page = browser.new_page()
            page.set_default_timeout(60_000)  # the CI machine may be loaded: slow is not wrong
            banner = page.locator("#banner")

            def start(url, tick=False):
                page.goto(url)
                page.locator("#rater-id input").fill("rater-7")
                if tick:
                    page.locator("#consent input").check()
                page.locator("#start-btn").click()
                page.wait_for_selector("#img-left")

            def answer(side, how, expect):
                m = re.search(r"(Practice|Pair) (\d+) of", banner.inner_text())
                page.wait_for_timeout(rating.MIN_ANSWER_MS + 100)  # a look at the pair first
                if how == "key":
                    page.locator("body").click(position={"x": 5, "y": 5})  # focus off the text box
                    page.keyboard.press("ArrowLeft" if side == "left" else "ArrowRight")
                else:
                    page.locator(f"#pick-{side}").click()
                # acknowledged: the next pair's banner (or the thank-you page) is on screen
                page.wait_for_selector(f"#banner >> text={expect}" if expect != "done" else
                                       "#done-msg >> text=Thank you")
                if m.group(1) == "Pair":
                    pressed.append((int(m.group(2)), side))

            url = f"http://127.0.0.1:{port}/"
            page.goto(url)
            page.locator("#rater-id input").fill("rater-7")
            page.locator("#start-btn").click()  # no consent yet: refused with a message
            page.wait_for_function("() => document.querySelector('#start-msg').innerText.includes('consent')")
            start(url, tick=True)
            assert banner.inner_text().startswith("Practice 1 of 2")
            answer("left", "key", "Practice 2 of 2")
            answer("right", "mouse", "Pair 1 of 6")
            answer("right", "key", "Pair 2 of 6")
            answer("left", "mouse", "Pair 3 of 6")
            # both buttons pressed before the answer comes back: one answer counts, not two
            page.wait_for_timeout(rating.MIN_ANSWER_MS + 100)
            page.evaluate("() => { document.getElementById('pick-left').click();"
                          " document.getElementById('pick-right').click(); }")
            page.wait_for_selector("#banner >> text=Pair 4 of 6")
            time.sleep(1.0)
            assert banner.inner_text().startswith("Pair 4 of 6")
            rows = rating.RatingDB(study_copy / "ratings.sqlite", rating.open_study(study_copy).study_id).judgments()
            assert len(rows) == 3 and rows[-1]["trial"] == 2
            pressed.append((3, rows[-1]["chosen_side"]))
            # a double press at a person's speed: its second press lands on the next pair, too
            # soon to be a judgment of it, and is refused with a message
            page.wait_for_timeout(rating.MIN_ANSWER_MS + 100)
            page.locator("body").click(position={"x": 5, "y": 5})
            page.keyboard.press("ArrowRight")
            page.wait_for_timeout(150)
            page.keyboard.press("ArrowLeft")
            page.wait_for_selector("#banner >> text=Pair 5 of 6")
            page.wait_for_selector("#status >> text=Too quick")
            assert banner.inner_text().startswith("Pair 5 of 6")
            pressed.append((4, "right"))

            page.reload()  # reload: back to the start page; same id resumes at pair 5, no practice
            start(url)
            assert banner.inner_text().startswith("Pair 5 of 6")
            answer("right", "mouse", "Pair 6 of 6")
            server.send_signal(signal.SIGKILL)  # right after the acknowledgement
            server.wait(10)
            rows = rating.RatingDB(study_copy / "ratings.sqlite", rating.open_study(study_copy).study_id).judgments()
            assert [(r["trial"] + 1, r["chosen_side"]) for r in rows] == pressed

            port = _free_port()
            server = _serve(study_copy, port, log)
            start(f"http://127.0.0.1:{port}/")
            assert banner.inner_text().startswith("Pair 6 of 6")
            answer("right", "mouse", "done")
            page.wait_for_selector("#done-msg >> text=answered 6 of 6")
            # the results tab needs the admin token
            page.get_by_role("tab", name="Results (admin)").click()
            page.locator("#admin-token input").fill("wrong")
            page.locator("#admin-btn").click()
            page.wait_for_selector("#admin-results >> text=Wrong admin token")
            page.locator("#admin-token input").fill("tok3n")
            page.locator("#admin-btn").click()
            page.wait_for_selector("#admin-results >> text=All comparisons")
            browser.close()
    finally:
        server.kill()
        server.wait(10)
    st = rating.open_study(study_copy)
    rows = rating.RatingDB(study_copy / "ratings.sqlite", st.study_id).judgments()
    assert [(r["trial"] + 1, r["chosen_side"]) for r in rows] == pressed and len(rows) == 6
    assert len({r["pair"] for r in rows}) == 6 and all(r["rater"] == "rater-7" for r in rows)
    assert len({r["session"] for r in rows}) == 3  # first visit, reload, after the restart
    plan = st.plan(st.rater_seed("rater-7"))
    for r in rows:
        t = plan[r["trial"]]
        assert r["pair"] == t.pair and r["left_cond"] == t.left and r["rt_ms"] > 0
    with sqlite3.connect(study_copy / "ratings.sqlite") as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_guided_conditions_decode_at_their_prior_weight(tiny_weights, celeba_npz, tmp_path):
    """greedy:w=3 / eps=E:k=K:w=3: a condition decoded with input guidance, named so, recorded in
    the manifest (only where the weight is not 1, so older studies keep their id), with images
    the library gives at that weight, and Table 3 columns of its own without the paper's numbers."""
    from sr_blockwise.checkpoints import load_model
    from sr_blockwise.data import downsample_8, load_faces
    from sr_blockwise.decoding import DecodeOptions, decode
    conds, _ = rating.parse_conditions(["greedy", "greedy:w=3", "eps=2:k=4,6:w=2.5@x"])
    assert [c.name for c in conds] == ["greedy@cpu-frozen", "greedy:w=3@cpu-frozen", "eps=2:k=4:w=2.5@x",
                                       "eps=2:k=6:w=2.5@x"]
    assert rating.Condition.from_name("eps=2:k=6:w=2.5@x") == conds[3]
    assert conds[3].options() == DecodeOptions(k=6, rule="eps", eps=2, prior_weight=2.5)
    with pytest.raises(StudyError, match="not a number"):
        rating.parse_conditions(["greedy:w=1.2.3"])
    folder = tmp_path / "guided"
    rating.build_study(folder, [f"greedy@{tiny_weights}", f"greedy:w=3@{tiny_weights}"], data=celeba_npz,
                       n_faces=2, n_practice=1, threads=1, progress=False, log=lambda *a: None)
    st = rating.open_study(folder)
    assert st.comparisons == [("greedy:w=3@tiny-random", "greedy@tiny-random")]
    by_name = {c["name"]: c for c in st.manifest["settings"]["conditions"]}
    assert "prior_weight" not in by_name["greedy@tiny-random"] and by_name["greedy:w=3@tiny-random"]["prior_weight"] == 3
    model = load_model(tiny_weights)
    ids = [f["input_id"] for f in st.manifest["settings"]["faces"]]
    test = load_faces(celeba_npz, part="test")
    lr = downsample_8(test.images[[list(test.ids).index(i) for i in ids]])
    want = decode(model, lr, DecodeOptions(k=1, prior_weight=3.0)).images
    np.testing.assert_array_equal(st.images["greedy:w=3@tiny-random"], want)
    assert not np.array_equal(st.images["greedy@tiny-random"], want)
    res = {"level": 0.9, "comparisons": [
        {"a": "eps=2:k=6:w=2@m", "b": "greedy@m", "n": 10, "rate": 0.5, "ci": [0.3, 0.7]},
        {"a": "eps=2:k=6@m", "b": "greedy@m", "n": 10, "rate": 0.6, "ci": [0.4, 0.8]}]}
    table = rating.table3(res)
    assert "eps=2:w=2" in table and "| 6 | — | 50.0 [30.0, 70.0] (n=10) | 56.8 | 60.0 [40.0, 80.0]" in table, table
    # the cell guard likewise: its own columns, without the paper's numbers
    res["comparisons"][0]["a"] = "eps=2:k=6:guard=32@m"
    table = rating.table3(res)
    assert "eps=2:guard=32" in table and "| 6 | — | 50.0 [30.0, 70.0] (n=10) | 56.8 | 60.0 [40.0, 80.0]" in table, table
    guarded = rating.Condition.from_name("exact:k=2:w=2:guard=32@m")
    assert guarded.guard == 32 and guarded.options() == DecodeOptions(k=2, prior_weight=2.0, guard=32)


# ---------------------------------------------------------------- sampled conditions

def test_sample_conditions_in_the_decode_mode_grammar():
    """sample:k=K:T=T[@W] conditions: settings in any order, a list of k, the fine-tuned weights
    by default for both plain (k=1) and speculative sampling, clear messages for bad ones."""
    from sr_blockwise.decoding import DecodeOptions
    conds, refs = rating.parse_conditions(["greedy", "sample:T=0.8:k=1,4", "sample:k=4:T=1:seed=2:w=2@x", "real"])
    assert [c.name for c in conds] == ["greedy@cpu-frozen", "sample:k=1:T=0.8@cpu-finetuned",
                                       "sample:k=4:T=0.8@cpu-finetuned", "sample:k=4:w=2:T=1:seed=2@x", "real"]
    assert [c.rule for c in conds] == ["greedy", "sample", "sample", "sample", "real"]
    assert conds[2].options() == DecodeOptions(k=4, temperature=0.8)
    assert rating.Condition.from_name(conds[3].name) == conds[3] and refs["x"] == "x"
    assert rating.same_distribution(conds[1], conds[2]) and not rating.same_distribution(conds[2], conds[3])
    guarded = rating.Condition.from_name("sample:k=4:T=0.8:guard=32@cpu-finetuned")
    assert not rating.same_distribution(conds[1], guarded)  # the guard changes the distribution
    for bad, msg in [(["sample:k=4"], "needs a temperature"), (["sample:k=4:T=0"], "T > 0"),
                     (["sample:k=4:T=0.8@"], "say the weights"), (["exact:k=4:T=0.8"], "for the sample mode"),
                     (["sample:k=17:T=1"], "outside 1..16")]:
        with pytest.raises(StudyError, match=msg):
            rating.parse_conditions(bad)


def test_sampled_study_holds_the_library_samples_and_rebuilds_identically(tiny_weights, celeba_npz, tmp_path):
    """A study of plain and speculative samples: each face's seed is in the manifest, its image is
    what the library samples for that seed, the two samplers' images differ, and the study built
    again in another folder is identical, image for image and in its id. (Sampling runs on the
    PyTorch step: two faces keep this short.)"""
    from sr_blockwise.checkpoints import load_model
    from sr_blockwise.data import downsample_8, load_faces
    from sr_blockwise.decoding import decode
    conds = [f"greedy@{tiny_weights}", f"sample:k=1:T=0.8@{tiny_weights}", f"sample:k=4:T=0.8@{tiny_weights}"]
    args = dict(data=celeba_npz, n_faces=1, n_practice=1, seed=5, threads=1, progress=False, log=lambda *a: None)
    rating.build_study(tmp_path / "a", conds, **args)
    st = rating.open_study(tmp_path / "a")
    plain, spec = "sample:k=1:T=0.8@tiny-random", "sample:k=4:T=0.8@tiny-random"
    assert st.comparisons == [(plain, "greedy@tiny-random"), (spec, "greedy@tiny-random")]
    by_name = {c["name"]: c for c in st.manifest["settings"]["conditions"]}
    seeds = {n: by_name[n]["seeds"] for n in (plain, spec)}
    assert by_name[spec]["temperature"] == 0.8 and "seeds" not in by_name["greedy@tiny-random"]
    assert len(seeds[plain]) == 2 and len(set(seeds[plain] + seeds[spec])) == 4  # independent draws
    model = load_model(tiny_weights)
    test = load_faces(celeba_npz, part="test")
    ids = [f["input_id"] for f in st.manifest["settings"]["faces"]]
    lr = downsample_8(test.images[[list(test.ids).index(i) for i in ids]])
    for name in (plain, spec):
        want = decode(model, lr, rating.Condition.from_name(name).options(), seeds=seeds[name]).images
        np.testing.assert_array_equal(st.images[name], want)
    assert not np.array_equal(st.images[plain], st.images[spec])
    assert not np.array_equal(st.images[plain], st.images["greedy@tiny-random"])
    assert st.manifest["decode"][spec]["mean_block"] >= 1 and st.manifest["decode"][plain]["mean_block"] == 1
    again = rating.build_study(tmp_path / "b", conds, **args)
    assert again["study_id"] == st.study_id and again["files"] == st.manifest["files"]
    assert again["settings"] == st.manifest["settings"]


def test_analysis_reports_percent_fooled_and_the_speculative_check():
    """Simulated raters fooled 36% of the time by samples, 20% by greedy outputs, and unable to
    tell speculative from plain samples: the report recovers each, "% fooled" beside the Image
    Transformer paper's ~36% (for the T=0.8 samples only) and the 50% check of the method."""
    sample, plain, greedy = "sample:k=4:T=0.8@cpu-finetuned", "sample:k=1:T=0.8@cpu-finetuned", "greedy@cpu-frozen"
    rows, comps = [], []
    for i, (a, b, p) in enumerate([(sample, "real", 0.36), ("real", greedy, 0.8), (sample, plain, 0.5)]):
        r, c = _synthetic(p_true=p, n_raters=20, bad=0, seed=10 + i, a=a, b=b)
        off = len(rows)
        rows += [dict(x, id=x["id"] + off, trial=x["trial"] + off, rater=f"{x['rater']}-{i}") for x in r]
        comps += c
    res = rating.analyze_judgments(rows, comps, n_boot=500)
    fooled, photo, check = res["comparisons"]
    for c, want in ((fooled, 0.36), (photo, 0.8), (check, 0.5)):
        assert c["ci"][0] < want < c["ci"][1] and c["n"] == 20 * 40, c
    md = rating.report_markdown(res)
    row = re.search(r"\| sample:k=4:T=0.8@cpu-finetuned \| ([0-9.]+) \[([0-9.]+), ([0-9.]+)\] \(800\) \| ~36 \|", md)
    assert row and abs(float(row.group(1)) - 100 * fooled["rate"]) < 0.051, md
    # the photo named first: fooled is the other side of its preference
    row = re.search(r"\| greedy@cpu-frozen \| ([0-9.]+) \[([0-9.]+), ([0-9.]+)\] \(800\) \| — \|", md)
    assert row and abs(float(row.group(1)) - 100 * (1 - photo["rate"])) < 0.051, md
    assert float(row.group(2)) < 20 < float(row.group(3))
    assert "## Check of the method" in md and f"- {sample} vs {plain}: " in md
    # before any judgment: the comparison with the photo is there, its judgments are not
    empty = rating.analyze_judgments([], comps, n_boot=10)
    assert "(no judgments yet of a model output against the real photo)" in rating.fooled_table(empty)
    none = rating.analyze_judgments([], [(sample, plain)], n_boot=10)
    assert "(no comparison of a model output against the real photo in this study)" in rating.fooled_table(none)
    assert "(no comparison of a k>1 condition against greedy" in md  # samples are not Table 3 rows
