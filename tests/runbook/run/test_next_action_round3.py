"""Issue 47 ("Agents and handovers, round three"), the next action: each finding reproduced with the
real CLI and real git, then what runbook does now.

- a detour (`--phase 2` timed out after Phase 1's error) does not become the plan's position
  (the state `detour-after-error` of tests/support/plan_states.py; here end to end);
- the same failure twice with nothing changed: the third identical run is not offered (outcome
  `repeated`), `--phase ID --yes` still runs it, a change offers it again; inconclusive is kind `rerun`;
- a cancelled `--set` run: every reader shows the values the resume will use, and how to forget it;
- PATH: a step's `python` is the first on the user's PATH, runbook's venv first included.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import plan_states as S
import pytest

H = S.H


def rb(repo: Path, *args: str, env: dict[str, str] | None = None):
    return H.runbook_inproc(repo, *args, timeout=120, env=env)


def js(repo: Path, *args: str) -> dict:
    done = rb(repo, *args, "--json")
    envelope = json.loads(done.stdout)
    assert envelope["exit_code"] == done.returncode, done.stderr[-2000:]
    return envelope


def readers(repo: Path) -> dict[str, dict]:
    """The next action as status, next --dry-run and brief give it, with their texts."""
    out = {}
    for key, args in (("status", ["status"]), ("dry", ["next", "--dry-run"]), ("brief", ["brief"])):
        out[key] = js(repo, *args)["result"]
        done = rb(repo, *args)
        assert done.returncode == 0, done.stderr
        out[f"{key}_text"] = done.stdout
    assert out["status"]["next"] == out["dry"]["next"] == out["brief"]["next"]
    return out


# ---- 1. a detour is not the plan's position ------------------------------------------------------


def test_a_timed_out_detour_after_an_error_leaves_the_plan_at_the_phase_that_errored(tmp_path: Path) -> None:
    repo = S.fresh_repo(tmp_path / "repo")
    assert rb(repo, "next", "--yes").returncode == 0  # Phase 0 pass
    S.knob(repo, "crash", "1")
    assert rb(repo, "next", "--yes").returncode == 4  # Phase 1: error (a traceback)
    S.knob(repo, "slow", "1")
    assert rb(repo, "next", "--phase", "2", "--yes").returncode == 4  # the detour: timeout
    v = readers(repo)
    action = v["status"]["next"]
    assert (action["kind"], action["phase"]) == ("resume", "phase-1")
    assert v["dry"]["selected"]["phase"] == "phase-1"
    assert all("resume Phase 2" not in v[k] for k in ("status_text", "dry_text", "brief_text"))
    assert "next: Phase 1 (phase-1), resume" in v["status_text"]
    assert "## Next: Phase 1 (`phase-1`)" in v["brief_text"]
    # the detour is named, with both ways out
    assert "ended timeout off the plan's flow, so it waits" in action["why"] and "runbook forget " in action["why"]
    assert "ended timeout off the plan's flow, so it waits" in v["dry_text"].splitlines()[0]
    # and `runbook next` does what they say: Phase 1 resumes (and, fixed, passes); then the flow reaches Phase 2
    (repo / "work" / "crash").unlink()
    (repo / "work" / "slow").unlink()
    ran = js(repo, "next", "--yes")["result"]
    assert [r["phase"] for r in ran["runs"]] == ["phase-1"] and ran["runs"][0]["verdict"] == "fail"
    after = js(repo, "status")["result"]["next"]
    assert (after["kind"], after["phase"]) == ("run", "phase-2") and "off the plan's flow" not in after["why"]


# ---- 2. the same failure twice: not offered a third time -----------------------------------------


def test_the_same_error_twice_with_nothing_changed_is_not_offered_a_third_time(tmp_path: Path) -> None:
    repo = S.fresh_repo(tmp_path / "repo")
    assert rb(repo, "next", "--yes").returncode == 0
    S.knob(repo, "crash", "1")
    assert rb(repo, "next", "--yes").returncode == 4
    once = js(repo, "status")["result"]["next"]
    assert (once["kind"], once["attempts"]) == ("resume", 1)
    assert "A second run that ends the same way with nothing changed stops these offers" in once["why"]
    assert rb(repo, "next", "--yes").returncode == 4  # the offered resume: the same error
    v = readers(repo)
    action = v["status"]["next"]
    assert (action["kind"], action["outcome"], action["phase"], action["attempts"]) == (
        "nothing", "repeated", "phase-1", 2)
    assert action["argv"] is None and "RuntimeError: boom" in action["look_at"]
    assert "held back: Phase 1 ended the same failure 2 times" in v["status_text"]
    # a plain `runbook next` runs nothing (exit 0) and says why
    runs = len(list((repo / "state" / "runs").glob("*.json")))
    done = js(repo, "next", "--yes")
    assert done["exit_code"] == 0 and done["result"]["runs"] == [] and done["result"]["next"]["outcome"] == "repeated"
    assert len(list((repo / "state" / "runs").glob("*.json"))) == runs
    # forced: `--phase 1 --yes` runs it as it is
    forced = js(repo, "next", "--phase", "1", "--yes")["result"]
    assert [r["verdict"] for r in forced["runs"]] == ["error"] and forced["next"]["attempts"] == 3
    # a change to a tracked file: offered again, saying so
    H.commit_files(repo, {"train.py": "print('fixed')\n"}, "fix the training code")
    again = js(repo, "status")["result"]["next"]
    assert (again["kind"], again["phase"], again["attempts"]) == ("resume", "phase-1", 3)
    assert "files changed since, so it may end differently" in again["why"]


INCONCLUSIVE = """\
---
runbook: 1
title: Inconclusive
vars:
  name: acc
---

## Phase 0: Measure

Steps:
- [ ] Measure: `printf '{"%s": 1}' {name} > "$RUNBOOK_METRICS"`

Pass: `accuracy >= 0.5`
"""


def test_inconclusive_is_its_own_kind_and_is_held_back_after_twice(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", INCONCLUSIVE)
    assert rb(repo, "next", "--yes").returncode == 3
    action = js(repo, "status")["result"]["next"]
    assert (action["kind"], action["attempts"], action["changed"]) == ("rerun", 1, [])
    assert any("no step wrote accuracy" in line for line in action["look_at"])
    assert rb(repo, "next", "--yes").returncode == 3
    held = js(repo, "status")["result"]["next"]
    assert (held["kind"], held["outcome"], held["attempts"]) == ("nothing", "repeated", 2)
    assert "what its steps wrote and the Pass: line" in held["why"]
    assert js(repo, "next", "--yes")["result"]["runs"] == []  # held back
    # another value for a var is another attempt: `runbook next --set` runs it (and it passes)
    ran = js(repo, "next", "--set", "name=accuracy", "--yes")["result"]["runs"]
    assert [(r["verdict"], r["vars"]) for r in ran] == [("pass", {"name": "accuracy"})]
    # so is an edit of the phase: the Pass: line fixed, the phase's verdict is stale and it runs
    plan = repo / "plans" / "plan.md"
    plan.write_text(plan.read_text().replace("Pass: `accuracy >= 0.5`", "Pass: `acc >= 0.5`"))
    H.git(repo, "commit", "-qam", "the metric is acc")
    assert js(repo, "status")["result"]["next"]["kind"] == "run"
    assert rb(repo, "next", "--yes").returncode == 0


# ---- 3. a cancelled --set run: one answer everywhere ----------------------------------------------

SET_PLAN = """\
---
runbook: 1
title: Sets
vars:
  fb_epochs: 100
---

## Phase 0: Train

Steps:
- [ ] Train: `echo "--epochs {fb_epochs}" >> work/args.txt; while [ ! -f work/go ]; do sleep 0.05; done`
"""


def _lock(repo: Path) -> dict:
    try:
        return json.loads((repo / "state" / "lock").read_text())
    except (OSError, ValueError):
        return {}


def test_a_cancelled_set_run_shows_its_values_everywhere_and_how_to_forget_it(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", SET_PLAN)
    (repo / ".gitignore").write_text((repo / ".gitignore").read_text() + "work/\n")
    H.git(repo, "commit", "-qam", "ignore work/")
    (repo / "work").mkdir()
    proc = H.popen_runbook(repo, "next", "--yes", "--set", "fb_epochs=3000")
    try:
        H.wait_for(lambda: (repo / "work" / "args.txt").exists() and _lock(repo).get("step_pgid"), timeout=60)
        cancelled = js(repo, "cancel")["result"]
        assert cancelled["cancelled"] is True and cancelled["run"]["verdict"] == "interrupted"
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.communicate(timeout=60)
    run_id = cancelled["run"]["run_id"]
    v = readers(repo)
    action = v["status"]["next"]
    assert action["kind"] == "resume" and action["run_id"] == run_id and action["overrides"] == {"fb_epochs": "3000"}
    # every reader shows what the resume will run: 3000, never the plan's 100
    for shown in (action["steps"], v["dry"]["selected"]["steps"]):
        assert shown[0]["command"].startswith('echo "--epochs 3000"'), shown
    assert "--epochs 100" not in json.dumps([v["status"], v["dry"], v["brief"]])
    assert "--epochs 3000" in v["brief_text"] and "--epochs 100" not in v["brief_text"]
    # the texts show the overrides, and how to drop the run
    assert f"last run {run_id} (Phase 0) ran with --set fb_epochs=3000" in v["status_text"]
    assert f"  with --set fb_epochs=3000 (the values run {run_id} was started with)" in v["status_text"]
    assert "Set with `--set`: `fb_epochs=3000`" in v["brief_text"] and "With `--set`: `fb_epochs=3000`" in v["brief_text"]
    assert f"To drop run {run_id} instead of resuming it: runbook forget {run_id}." in action["why"]
    # and `runbook next` resumes with 3000, as shown
    (repo / "work" / "go").touch()
    ran = js(repo, "next", "--yes")["result"]
    assert ran["runs"][0]["verdict"] == "pass" and ran["runs"][0]["vars"] == {"fb_epochs": "3000"}
    assert (repo / "work" / "args.txt").read_text().splitlines() == ["--epochs 3000", "--epochs 3000"]


# ---- 4. PATH: the user's order is kept ------------------------------------------------------------

PATH_PLAN = """\
---
runbook: 1
title: Path
---

## Phase 0: Which python

Steps:
- [ ] Which: `command -v python > which.txt; printf '%s' "$PATH" > path.txt`
"""


@pytest.mark.parametrize("bindir_on_path", ["first", "missing"])
def test_a_steps_python_is_the_first_on_the_users_path(tmp_path: Path, bindir_on_path: str) -> None:
    """The README's setup: runbook's venv first on PATH (activated), pyenv's shims after it."""
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "python").write_text("#!/bin/sh\necho shim\n")
    (shims / "python").chmod(0o755)
    repo = H.make_repo(tmp_path / "repo", PATH_PLAN)
    H.commit_files(repo, {".gitignore": (repo / ".gitignore").read_text() + "*.txt\n"}, "ignore")
    bindir = str(Path(sys.executable).parent)
    rest = [p for p in os.environ["PATH"].split(os.pathsep) if p and os.path.realpath(p) != os.path.realpath(bindir)]
    given = [bindir, str(shims), *rest] if bindir_on_path == "first" else [str(shims), *rest]
    done = rb(repo, "next", "--yes", env={"PATH": os.pathsep.join(given)})
    assert done.returncode == 0, done.stdout + done.stderr
    which = (repo / "which.txt").read_text().strip()
    path = (repo / "path.txt").read_text().split(os.pathsep)
    if bindir_on_path == "first":
        assert which == str(Path(bindir) / "python")  # the venv's, not the shim behind it
        assert path == given  # the user's PATH as it was
    else:
        assert which == str(shims / "python")  # the user's first python
        assert path == [*given, bindir]  # runbook's directory added at the end, where it was missing
