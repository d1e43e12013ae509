"""A phase with `Sweep:` and `Pick:` under `runbook next`: run as `runbook sweep PHASE --set ... --pick
... --yes` runs it (trials, then the pick decides the phase), `--until-stop` follows the picked trial's
transition to a phase whose `Inputs:` are the picked trial's kept outputs, a second `next` runs nothing
again (and a milestone on the pick plots the chosen trial's curves), and a sweep killed with -9 goes
on with the points it had not run. Real git, real steps; the CLI
in process, a real subprocess for the kill."""

from __future__ import annotations

import json
from pathlib import Path

import helpers as H

PLAN = """\
---
runbook: 1
title: A sweep in the plan
notes: notes.md
vars:
  x: "1"
---

## Phase 1: Fit (~1 min)

Steps:
- [ ] Fit: `[ ! -f nap ] || [ {x} != 3 ] || sleep 60; mkdir -p work && echo "model x={x}" > work/model.txt && python3 -c "import sys; x=int(sys.argv[1]); print('{\\"score\\": %g}' % (1 - abs(2 - x) / 10))" {x} > "$RUNBOOK_METRICS" && echo '{"step": 1, "loss": 1}' >> "$RUNBOOK_SERIES"`

Pass: score >= 0.85
Sweep: x=1,2,3
Pick: best:score
Outputs: work/model.txt

## Phase 2: Use what Phase 1 decided

Steps:
- [ ] Use: `cp work/model.txt work/used.txt && echo '{"ok": 1}' > "$RUNBOOK_METRICS"`

Pass: ok == 1
Inputs: work/model.txt
"""

ENV = {"RUNBOOK_ENV_PROBE": "0"}


def repo_at(path: Path) -> Path:
    repo = H.make_repo(path, PLAN, notes="# Notes\n", ignore=("work/", "nap"))
    H.commit_files(repo, {"runbook.toml": 'keep_outputs = "work/kept"\n'}, "keep outputs")
    return repo


def trials(repo: Path) -> list[dict]:
    found = (json.loads(p.read_text()) for p in (repo / "state" / "runs").glob("*.json"))
    return sorted((r for r in found if r.get("trial")), key=lambda r: (r["started"], r["run_id"]))


def test_next_runs_a_sweep_phase_as_its_sweep_and_follows_the_picked_trial(tmp_path: Path) -> None:
    repo = repo_at(tmp_path / "repo")
    status = json.loads(H.runbook_inproc(repo, "status", "--json").stdout)["result"]
    assert "It runs as a sweep of 3 points (`Sweep: x=1,2,3`)" in status["next"]["why"]
    assert status["next"]["command"] == "runbook next --yes"  # the next action stays `runbook next`
    dry = H.runbook_inproc(repo, "next", "--dry-run")
    assert dry.returncode == 0 and "Phase 1 runs as a sweep" in dry.stdout, dry.stderr
    assert [line.split()[:3] for line in dry.stdout.splitlines() if "to run  " in line] == [
        ["to", "run", "1/3"], ["to", "run", "2/3"], ["to", "run", "3/3"]]
    refused = H.runbook_inproc(repo, "next", "--set", "x=5", "--yes")
    assert refused.returncode == 2 and "Phase 1 sweeps x (`Sweep:` at plans/plan.md:15)" in refused.stderr, refused.stderr
    assert "runbook sweep phase-1 --set x=V1,V2 --pick best:score --yes" in refused.stderr
    H.assert_no_traceback(refused)
    detached = H.runbook_inproc(repo, "next", "--detach", "--yes")
    assert detached.returncode == 2 and "runs as a sweep (its `Sweep:` line), which does not run detached" in \
        detached.stderr, detached.stderr
    assert not (repo / "state" / "runs").exists()

    done = H.runbook_inproc(repo, "next", "--until-stop", "--yes", "--json", env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    import jsonschema

    schema = json.loads((Path(__file__).resolve().parents[3] / "docs" / "schemas" / "next.schema.json").read_text())
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)  # trials and the pick are RunViews
    runs = doc["result"]["runs"]
    made = trials(repo)
    assert [r["vars"]["x"] for r in made] == ["1", "2", "3"] and [r["trial"]["of"] for r in made] == [3, 3, 3]
    picked = next(r for r in made if r["vars"]["x"] == "2")
    choice, used = runs[3], runs[4]
    assert [r["run_id"] for r in runs[:3]] == [r["run_id"] for r in made]
    assert (choice["phase"], choice["verdict"], choice["decision"]["run"]) == ("phase-1", "pass", picked["run_id"])
    assert choice["decision"]["why"].startswith("best:score: max score 1 of 3 passing trials")
    assert (used["phase"], used["verdict"]) == ("phase-2", "pass")
    # Phase 2 read the picked trial's model (put back from its kept copy: x=3 ran last)
    assert (repo / "work" / "used.txt").read_text() == "model x=2\n"
    status = json.loads(H.runbook_inproc(repo, "status", "--json").stdout)["result"]
    assert [p["state"] for p in status["phases"]] == ["passed", "passed"]
    assert status["phases"][0]["decided_by"] == picked["run_id"] and status["next"]["outcome"] == "finished"
    assert not H.git(repo, "status", "--porcelain", "--", "state", "plans")

    again = H.runbook_inproc(repo, "next", "--yes", "--json", env=ENV)  # nothing reruns the sweep
    assert again.returncode == 0 and json.loads(again.stdout)["result"]["runs"] == []
    assert len(trials(repo)) == 3 and len(list((repo / "state" / "sweeps").glob("*.json"))) == 1
    # a milestone on the pick's record plots the curves of the trial it chose
    recorded = H.runbook_inproc(repo, "record", "Picked", "--run", choice["run_id"], "--plot", "loss")
    assert recorded.returncode == 0, recorded.stderr
    notes = (repo / "plans" / "notes.md").read_text()
    assert f"![loss by step, run {picked['run_id']}](plots/{choice['run_id']}-loss.png)" in notes


def test_a_sweep_phase_killed_with_minus_9_goes_on_with_its_other_points_under_next(tmp_path: Path) -> None:
    repo = repo_at(tmp_path / "repo")
    (repo / "nap").write_text("")  # while it is there, the trial with x=3 sleeps a minute
    H.kill_9_once(repo, ("next", "--until-stop", "--yes"), ENV, lambda: len(trials(repo)) >= 2, "two trials recorded")
    (repo / "nap").unlink()
    done = H.runbook_inproc(repo, "next", "--until-stop", "--yes", "--json", env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "continuing sweep" in done.stdout + done.stderr
    runs = json.loads(done.stdout)["result"]["runs"]
    finished = [r for r in trials(repo) if r["verdict"] != "interrupted"]
    assert sorted(r["trial"]["index"] for r in finished) == [1, 2, 3]  # each point once, in one sweep
    assert len({r["trial"]["sweep"] for r in trials(repo)}) == 1
    assert [r["trial"]["index"] for r in runs if r.get("trial")] == [3]  # only the point not yet run
    assert [(r["phase"], r["verdict"]) for r in runs if not r.get("trial")] == [("phase-1", "pass"), ("phase-2", "pass")]
    assert (repo / "work" / "used.txt").read_text() == "model x=2\n"


def test_restart_of_a_sweep_phase_runs_a_new_sweep_of_its_points(tmp_path: Path) -> None:
    """`runbook next --phase 1 --restart` on a phase whose sweep finished and was picked from runs the
    whole grid again as a new sweep (not the finished one continued), and its pick decides the phase."""
    repo = repo_at(tmp_path / "repo")
    first = H.runbook_inproc(repo, "next", "--yes", env=ENV)
    assert first.returncode == 0, first.stderr[-3000:]
    before = {r["trial"]["sweep"] for r in trials(repo)}
    again = H.runbook_inproc(repo, "next", "--phase", "1", "--restart", "--yes", env=ENV)
    assert again.returncode == 0, again.stderr[-3000:]
    sweeps = {r["trial"]["sweep"] for r in trials(repo)}
    assert len(before) == 1 and len(sweeps) == 2
    new = sweeps - before
    assert sorted(r["trial"]["index"] for r in trials(repo) if r["trial"]["sweep"] in new) == [1, 2, 3]
    assert "continuing sweep" not in again.stdout + again.stderr
    status = json.loads(H.runbook_inproc(repo, "status", "--json").stdout)["result"]
    assert status["phases"][0]["state"] == "passed"
