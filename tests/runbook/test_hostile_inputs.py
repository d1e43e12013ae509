"""Hostile inputs found by the round-two trial: plans judged without their criterion, unbounded
reads, alias bombs and undecodable config files. Real repositories, the real `runbook` CLI.

- `Pass:` written right under the last step (a CommonMark lazy continuation line) is the phase's
  criterion, not step text; a field indented under a step is a warning.
- A plan with lone-CR line endings parses exactly like its LF twin, and runs and is judged.
- A fenced block that is never closed: a warning, and an error when it swallows a phase.
- A NUL byte in a step is an error (markdown-it would turn it into U+FFFD and run that).
- `/dev/zero`, a FIFO or a directory as the plan: a message, exit 2, at once.
- A YAML alias bomb in the front matter: an error in milliseconds, not minutes and gigabytes.
- A runbook.toml / pyproject.toml that is not UTF-8 (or nests 5,000 deep, or holds a 5,000-digit
  number): every command says so (runbook.toml) or ignores it (pyproject.toml), no traceback.
- A milestone body holding `## Next steps`, `## Lessons learned`, a status marker or an open fence
  cannot take over the notes: later records leave its text alone.
- A plan that is a symlink to a file outside the repository is refused; nothing is written there.
- An unreadable ledger file (truncated JSON, a FIFO) is named by every reader, and `next` refuses
  to choose a phase from a ledger with a hole in it.
- On a read-only filesystem, writing verbs say so (exit 2), nothing changes, no traceback.
- Arguments that are not UTF-8 (a title, a lesson, a --var), or a repository under such a path: a usage
  error naming it (exit 2), nothing written.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import helpers as H
import pytest

from runbook.plan.parse import parse_plan

LAZY = """\
---
runbook: 1
title: Lazy criterion
---

## Phase 0: Probe

Steps:
- [ ] Write m: `echo '{"m": 1}' > "$RUNBOOK_METRICS"`
- [ ] Again: `true`
Pass: m >= 5
On fail: stop

## Phase 1: Never reached

Steps:
- [ ] x: `touch REACHED`
"""


def _summary(text: str) -> list[tuple]:
    plan, problems = parse_plan(text, "p.md")
    assert plan is not None
    return [
        (p.id, [(s.command, s.text) for s in p.steps], p.criterion.text if p.criterion else None, p.on_fail)
        for p in plan.phases
    ] + [[str(x).replace("p.md", "") for x in problems if x.severity == "error"]]


def test_pass_right_under_the_last_step_is_the_criterion(tmp_path: Path, counts) -> None:
    plan, problems = parse_plan(LAZY, "p.md")
    phase = plan.phases[0]
    assert phase.criterion is not None and phase.criterion.text == "m >= 5"
    assert phase.on_fail == "stop"
    assert [s.text for s in phase.steps] == ["Write m: `echo '{\"m\": 1}' > \"$RUNBOOK_METRICS\"`", "Again: `true`"]
    assert not [p for p in problems if p.severity == "error"]
    # through the real CLI: the phase is judged (fail: m 1 < 5), not passed unjudged
    repo = H.make_repo(tmp_path / "repo", LAZY)
    result = H.runbook(repo, "next", "--yes")
    H.assert_no_traceback(result)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "m 1 >= 5" in result.stdout + result.stderr
    assert not (repo / "REACHED").exists()
    counts.add("hostile_plans_judged")


def test_field_indented_under_a_step_is_a_warning() -> None:
    text = LAZY.replace("\nPass: m >= 5\nOn fail: stop\n", "\n  Pass: m >= 5\n")
    plan, problems = parse_plan(text, "p.md")
    assert plan.phases[0].criterion is None
    warnings = [p for p in problems if p.severity == "warning" and "indented under a step" in p.message]
    assert len(warnings) == 1 and warnings[0].line == 11


def test_lone_cr_plan_parses_like_its_lf_twin_and_runs(tmp_path: Path, counts) -> None:
    cr = LAZY.replace("\n", "\r")
    assert _summary(cr) == _summary(LAZY)
    assert _summary(LAZY.replace("\n", "\r\n")) == _summary(LAZY)
    repo = H.make_repo(tmp_path / "repo", cr)
    result = H.runbook(repo, "next", "--yes")
    H.assert_no_traceback(result)
    assert result.returncode == 1, result.stdout + result.stderr  # judged: m 1 < 5
    text = (repo / "plans" / "plan.md").read_bytes()
    assert b"\n" not in text, "the plan keeps its CR line endings"
    assert b"[x] Write m" in text and b"runbook:status" in text
    counts.add("hostile_plans_judged")


UNCLOSED = """\
---
runbook: 1
---

## Phase 0: a

Steps:
- [ ] x: `true`

```sh
example

## Phase 1: b

Steps:
- [ ] y: `true`
"""


def test_unclosed_fence_that_swallows_a_phase_is_an_error(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", UNCLOSED)
    result = H.runbook(repo, "validate")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "plans/plan.md:10:1: fenced block opened here" in result.stderr and "line 13" in result.stderr
    plan, problems = parse_plan(UNCLOSED.split("## Phase 1")[0], "p.md")
    assert [p.severity for p in problems] == ["warning"] and "never closed" in problems[0].message


def test_nul_byte_in_a_step_is_an_error() -> None:
    plan, problems = parse_plan(LAZY.replace("`true`", "`tr\0ue`"), "p.md")
    errors = [p for p in problems if p.severity == "error"]
    assert len(errors) == 1 and "NUL" in errors[0].message and (errors[0].line, errors[0].col) == (10, 17)


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "directory"])
def test_plan_path_that_is_not_a_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    repo = H.make_repo(tmp_path / "repo", LAZY)
    if kind == "dev-zero":
        target = "/dev/zero"
    elif kind == "fifo":
        os.mkfifo(repo / "plans" / "pipe.md")
        target = "plans/pipe.md"
    else:
        target = "plans"
    for args in (["validate", target], ["next", "--yes", "--plan", target], ["status", "--plan", target],
                 ["brief", "--plan", target]):
        t0 = time.monotonic()
        result = H.runbook(repo, *args, timeout=60)
        H.assert_no_traceback(result, " ".join(args))
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert time.monotonic() - t0 < 30


def test_yaml_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    lines = ["---", "a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    lines += ["runbook: *a9", "---", "", "## Phase 0: a", "", "Steps:", "- [ ] x: `true`", ""]
    text = "\n".join(lines)
    assert len(text) < 1000
    repo = H.make_repo(tmp_path / "repo", text)
    t0 = time.monotonic()
    result = H.runbook(repo, "validate", timeout=60)
    assert time.monotonic() - t0 < 20
    H.assert_no_traceback(result)
    assert result.returncode == 2 and "aliases" in result.stderr, result.stderr
    assert len(result.stderr) < 2000


CONFIGS = {
    "not-utf8": b'plans = ["plans/*.md"]\nstate = "\xff\xfe"\n',
    "deep": b"a = " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "huge-int": b"a = " + b"9" * 5000 + b"\n",
}
COMMANDS = [["status"], ["validate"], ["next", "--yes"], ["next", "--dry-run"], ["brief"], ["history"],
            ["show", "0"], ["record", "A milestone", "--no-commit"]]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_bad_runbook_toml_is_named_by_every_command(tmp_path: Path, name: str, counts) -> None:
    repo = H.make_repo(tmp_path / "repo", LAZY)
    (repo / "runbook.toml").write_bytes(CONFIGS[name])
    for args in COMMANDS:
        result = H.runbook(repo, *args)
        H.assert_no_traceback(result, f"{name}: {' '.join(args)}")
        assert result.returncode == 2, (name, args, result.stdout, result.stderr)
        assert "runbook.toml" in result.stderr, (name, args, result.stderr)
    counts.add("config_files_refused", len(COMMANDS))


def test_undecodable_pyproject_is_not_ours_to_judge(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", LAZY)
    (repo / "pyproject.toml").write_bytes(b'[project]\nname = "\xff"\n')
    H.git(repo, "add", "pyproject.toml")
    H.git(repo, "commit", "-qm", "pyproject")
    for args in (["status"], ["validate"], ["brief"]):
        result = H.runbook(repo, *args)
        H.assert_no_traceback(result, " ".join(args))
        assert result.returncode == 0, (args, result.stdout, result.stderr)


def test_fifo_metrics_plan_read_does_not_block_signals(tmp_path: Path) -> None:
    """Reading a FIFO plan returns at once even with no writer (O_NONBLOCK, then refused)."""
    fifo = tmp_path / "p.md"
    os.mkfifo(fifo)
    from runbook.plan.parse import read_plan

    done = threading.Event()
    out: list = []

    def read() -> None:
        out.append(read_plan(fifo))
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(5), "read_plan blocked on a FIFO"
    plan, problems = out[0]
    assert plan is None and "FIFO" in problems[0].message
    json.dumps([p.model_dump() for p in problems])


# ---- notes, links, the ledger, read-only disks ------------------------------------------------------

NOTES_PLAN = LAZY.replace("title: Lazy criterion\n", "title: Lazy criterion\nnotes: notes.md\n")


def test_milestone_body_cannot_take_over_the_notes(tmp_path: Path) -> None:
    from runbook.report import notes

    repo = H.make_repo(tmp_path / "repo", NOTES_PLAN, notes="# Notes\n")
    body = ("Found it.\n\n## Next steps\n\n- body's own step\n\n## Lessons learned\n\n- body's lesson\n\n"
            "<!-- runbook:notes-status -->\n\n# Milestones\n\n```sh\n## a heading in code stays\n")
    first = H.runbook(repo, "record", "First", "--body", "-", "--next", "real next", input=body)
    assert first.returncode == 0, first.stderr
    second = H.runbook(repo, "record", "Second", "--next", "newer next", "--lesson", "a real lesson")
    assert second.returncode == 0, second.stderr
    text = (repo / "plans" / "notes.md").read_text()
    assert notes.read_next_steps(text) == ["real next", "newer next"]  # --next adds; the body's own step is not one
    assert notes.read_lessons(text) == ["a real lesson"]
    entries = notes.read_milestones(text)
    assert [e.heading.split(" · ")[-1] for e in entries] == ["First", "Second"]
    first_entry = entries[0].text
    for kept in ("Found it.", "##### Next steps", "- body's own step", "##### Lessons learned", "- body's lesson",
                 "## a heading in code stays"):
        assert kept in first_entry, kept  # the body's own text survives every later record
    assert notes.problems(text) == []


def test_arguments_that_are_not_utf8_are_a_usage_error_and_nothing_is_written(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 on the command line (Python keeps 0xff as the lone surrogate \\udcff) made
    `runbook record` fail with an internal error while writing the notes; every verb now refuses them
    before it starts, naming the argument, and changes nothing."""
    repo = H.make_repo(tmp_path / "repo", NOTES_PLAN, notes="# Notes\n")
    notes_before, head = (repo / "plans" / "notes.md").read_bytes(), H.git(repo, "rev-parse", "HEAD")
    for argv, bad in (([b"record", b"bad \xff title"], 2), ([b"record", b"fine", b"--lesson", b"x\xfe"], 4),
                      ([b"next", b"--var", b"lr=\xff", b"--yes"], 3)):
        proc = subprocess.run([*map(os.fsencode, H.RUNBOOK), *argv], cwd=repo, env=H.cli_env(), capture_output=True)
        err = proc.stderr.decode("utf-8", "replace")
        assert proc.returncode == 2, (argv, err)
        assert f"argument {bad} (" in err and "which is not UTF-8 text" in err, err
        assert "Traceback" not in err and "internal error" not in err
    assert (repo / "plans" / "notes.md").read_bytes() == notes_before and H.git(repo, "rev-parse", "HEAD") == head
    assert H.git(repo, "status", "--porcelain") == ""


def test_a_repository_at_a_path_that_is_not_utf8_is_refused_by_name(tmp_path: Path) -> None:
    """`next` in a repository under a directory named with a byte that is not UTF-8 failed with an internal
    error (the run lock records the path); every verb that opens the workspace now says so, exit 2."""
    repo = H.make_repo(tmp_path / os.fsdecode(b"under-\xff") / "repo", LAZY)
    head = H.git(repo, "rev-parse", "HEAD")
    for verb in (["next", "--yes"], ["status"], ["record", "a title"]):
        proc = H.runbook(repo, *verb)
        assert proc.returncode == 2, proc.stderr
        assert "under-\\xff/repo is not UTF-8 text" in proc.stderr and "internal error" not in proc.stderr
    assert H.git(repo, "rev-parse", "HEAD") == head and H.git(repo, "status", "--porcelain") == ""


def test_symlinked_plan_outside_the_repo_is_refused(tmp_path: Path) -> None:
    elsewhere = H.make_repo(tmp_path / "elsewhere", LAZY)
    repo = H.make_repo(tmp_path / "repo", LAZY.replace("Lazy criterion", "Mine"))
    (repo / "plans" / "link.md").symlink_to(elsewhere / "plans" / "plan.md")
    H.git(repo, "add", "plans/link.md")
    H.git(repo, "commit", "-qm", "link")
    before = H.tree_snapshot(elsewhere)
    for args in (["next", "--yes", "--plan", "plans/link.md"], ["status", "--plan", "plans/link.md"],
                 ["record", "x", "--plan", "plans/link.md"]):
        result = H.runbook(repo, *args)
        H.assert_no_traceback(result, " ".join(args))
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "outside the repository" in result.stderr, result.stderr
    assert H.tree_snapshot(elsewhere) == before
    assert not (elsewhere / "state").exists()


def test_corrupt_ledger_file_stops_next_and_is_named_everywhere(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", LAZY.replace("Pass: m >= 5", "Pass: m >= 1"))
    assert H.runbook(repo, "next", "--yes").returncode == 0
    record = sorted((repo / "state" / "runs").glob("*.json"))[0]
    record.write_text('{"run_id": "truncated')
    for args in (["status"], ["brief"], ["history"]):
        result = H.runbook(repo, *args)
        H.assert_no_traceback(result, " ".join(args))
        assert record.name in result.stderr, (args, result.stderr)
    for args in (["next", "--yes"], ["next", "--dry-run"]):
        result = H.runbook(repo, *args)
        H.assert_no_traceback(result, " ".join(args))
        assert result.returncode == 2 and record.name in result.stderr and "git checkout" in result.stderr, result.stderr
    assert not (repo / "REACHED").exists()
    record.unlink()
    os.mkfifo(record)  # a ledger file that is a FIFO: named, never a hang
    result = H.runbook(repo, "status", timeout=60)
    assert result.returncode == 0 and record.name in result.stderr and "FIFO" in result.stderr


SERIES_PLAN = """\
---
runbook: 1
title: Series
---

## Phase 0: Train

Steps:
- [ ] Train: `echo working; printf '{"step": 1, "loss": 2.0}\\n{"step": 2, "loss": 1.0}\\n' > "$RUNBOOK_SERIES"; echo '{"loss": 1.0}' > "$RUNBOOK_METRICS"`
Pass: loss <= 1.5
"""

READERS = (["status"], ["history"], ["brief"], ["show", "0"], ["diff"], ["logs"], ["plot", "--metric", "loss"],
           ["next", "--dry-run"])


def test_a_fifo_where_runbook_keeps_its_ledger_index_hangs_no_reader(tmp_path: Path) -> None:
    """A FIFO at state/index/runs.idx, at the index's key ($XDG_CACHE_HOME/runbook/index.key) and at a
    run's kept series: every reading verb answers at once (the index is rebuilt from the records, the
    series left out) instead of waiting forever for a writer (status, history, brief, show, diff, logs,
    plot and next --dry-run all hung)."""
    from runbook.store.index import index_path
    from runbook.store.ledger import series_path

    repo = H.make_repo(tmp_path / "repo", SERIES_PLAN)
    assert H.runbook_inproc(repo, "next", "--yes").returncode == 0
    first = json.loads(sorted((repo / "state" / "runs").glob("*.json"))[0].read_text())["run_id"]
    assert H.runbook_inproc(repo, "next", "--phase", "0", "--restart", "--yes").returncode == 0
    cache = tmp_path / "cache"
    (cache / "runbook").mkdir(parents=True)
    os.mkfifo(cache / "runbook" / "index.key")
    index = index_path(repo / "state")
    index.parent.mkdir(parents=True, exist_ok=True)
    index.unlink(missing_ok=True)
    os.mkfifo(index)
    series_path(repo / "state", first).unlink()
    os.mkfifo(series_path(repo / "state", first))
    for args in READERS:
        result = H.runbook(repo, *args, env={"XDG_CACHE_HOME": str(cache)}, timeout=60)
        H.assert_no_traceback(result, " ".join(args))
        assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-2000:])
    assert index.is_file()  # rebuilt over the FIFO by the first reader


def test_a_step_that_swaps_its_log_for_a_fifo_is_recorded_and_hangs_nothing(tmp_path: Path) -> None:
    """A step that replaces its own log with a FIFO: `runbook next` records and commits the run at once
    (it hung after the step, deaf to SIGTERM, and every verb hung after it); logs and status answer."""
    swap = 'echo before; log=$(dirname "$RUNBOOK_METRICS")/step-1.log; rm -f "$log"; mkfifo "$log"'
    repo = H.make_repo(tmp_path / "repo", LAZY.replace("`echo '{\"m\": 1}'", f"`{swap}; echo '{{\"m\": 9}}'")
                       .replace("Pass: m >= 5\nOn fail: stop", "Pass: m >= 5\nOn pass: stop"))
    result = H.runbook(repo, "next", "--yes", timeout=120)
    H.assert_no_traceback(result)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (record,) = [json.loads(p.read_text()) for p in (repo / "state" / "runs").glob("*.json")]
    assert record["verdict"] == "pass" and record["steps"][0]["log_tail"] == []
    assert record["run_id"] in H.committed_runs(repo)
    log = repo / "state" / "runs" / record["run_id"] / "step-1.log"
    assert log.is_fifo()
    for args in (["logs"], ["logs", "--step", "1"], ["status"], ["history"]):
        shown = H.runbook(repo, *args, timeout=60)
        H.assert_no_traceback(shown, " ".join(args))
        assert shown.returncode == 0, (args, shown.stderr)


def _read_only(repo: Path, *args: str) -> subprocess.CompletedProcess:
    """Run runbook with the repository bind-mounted read-only, in a mount namespace of its own."""
    script = f'mount --bind "{repo}" "{repo}" && mount -o remount,bind,ro "{repo}" && cd "{repo}" && exec "$@"'
    return subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", *H.RUNBOOK, *args], capture_output=True,
                          text=True, env=H.cli_env(), timeout=120, stdin=subprocess.DEVNULL)


def test_read_only_filesystem_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", NOTES_PLAN, notes="# Notes\n")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("needs `unshare -m` (root) for a read-only bind mount")
    before = H.tree_snapshot(repo)
    for args in (["record", "M1", "--lesson", "l"], ["next", "--yes"], ["reset", "0"], ["status"], ["brief"]):
        result = _read_only(repo, *args)
        H.assert_no_traceback(result, " ".join(args))
        if args[0] in ("record", "next", "reset"):
            assert result.returncode == 2, (args, result.stdout, result.stderr)
            assert "Read-only file system" in result.stderr, (args, result.stderr)
    assert H.tree_snapshot(repo) == before


_FULL_DISK = r"""
import errno, json, os, shutil, subprocess, sys
from pathlib import Path
disk, repo_src, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
runbook = sys.argv[4:]
from runbook.store.lock import read_lock, run_lock
state = disk / "bare-state"
state.mkdir()
repo = disk / "repo"
shutil.copytree(repo_src, repo, symlinks=True)
filler = disk / "filler"
fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
for size in (4096, 1):  # fill the disk to the last byte
    try:
        while True:
            os.write(fd, b"\0" * size)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
os.close(fd)
doc = {}
try:
    with run_lock(state, run_id="r1"):
        doc["locked"] = True
except OSError as exc:
    doc["errno"] = exc.errno
doc["bare_left"] = sorted(p.name for p in state.iterdir())
full = subprocess.run([*runbook, "next", "--yes"], cwd=repo, capture_output=True, text=True, timeout=120)
doc["full"] = [full.returncode, full.stdout, full.stderr]
doc["lock_after_full"] = (repo / "state" / "lock").exists()
filler.unlink()
with run_lock(state, run_id="r2"):
    doc["relocked"] = read_lock(state / "lock").run_id
again = subprocess.run([*runbook, "next", "--yes"], cwd=repo, capture_output=True, text=True, timeout=120)
doc["again"] = [again.returncode, again.stdout, again.stderr]
doc["lock_after_again"] = (repo / "state" / "lock").exists()
out.write_text(json.dumps(doc))
"""


def test_disk_full_while_next_takes_the_lock_leaves_no_lock(tmp_path: Path) -> None:
    """A full disk when the run lock is created leaves no lock at all (never an empty one that
    refuses every later `runbook next`); once there is room, the lock and `next` work again. On a
    small tmpfs in a mount namespace of its own (root)."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs `unshare -m` (root) for a small tmpfs")
    src = H.make_repo(tmp_path / "repo", LAZY.replace("Pass: m >= 5", "Pass: m >= 1"))
    disk, out = tmp_path / "disk", tmp_path / "out.json"
    disk.mkdir()
    (tmp_path / "driver.py").write_text(_FULL_DISK)
    script = 'mount -t tmpfs -o size=4m tmpfs "$1" && shift && exec "$@"'
    done = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", str(disk), sys.executable,
                           str(tmp_path / "driver.py"), str(disk), str(src), str(out), *H.RUNBOOK],
                          capture_output=True, text=True, env=H.cli_env(), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc.get("errno") == errno.ENOSPC and "locked" not in doc, doc
    assert doc["bare_left"] == [], "no lock, empty or partial, and no temporary file is left"
    code, stdout, stderr = doc["full"]
    H.assert_no_traceback((stdout, stderr), "next on a full disk")
    assert code != 0 and "No space left on device" in stderr, (code, stdout, stderr)
    assert doc["lock_after_full"] is False
    assert doc["relocked"] == "r2"
    code, stdout, stderr = doc["again"]
    assert code == 0 and doc["lock_after_again"] is False, (code, stdout, stderr)
