"""`runbook sweep` and `runbook choose`: a grid of trials that decide nothing until one is picked or
chosen, then decides the phase and routes the plan; a sweep killed with -9 goes on with the points it
had not run. Real git, real steps; the CLI in process where only output and files are checked, a real
subprocess for the kill."""

from __future__ import annotations

import json
from pathlib import Path

import helpers as H

PLAN = """\
---
runbook: 1
title: Sweep a fit
vars:
  lr: "0.1"
  hidden: "8"
---

## Phase 1: Fit (~1 min)

Steps:
- [ ] Fit: `[ ! -f nap ] || [ {hidden} != 40 ] || sleep 60; python3 -c "import sys; lr=float(sys.argv[1]); h=int(sys.argv[2]); print('{\\"acc\\": %g}' % (0.5 + lr + h/100))" {lr} {hidden} > "$RUNBOOK_METRICS"`

Pass: acc >= 0.7
On pass: Phase 2
On fail: Phase 3

## Phase 2: Use the fit

Steps:
- [ ] Use: `true`

## Phase 3: Fallback

Steps:
- [ ] Fallback: `true`
"""

GRID = ("--set", "lr=0.01,0.3", "--set", "hidden=1,2,40")  # 2x3; acc = 0.5 + lr + hidden/100


SCHEMAS = Path(__file__).resolve().parents[3] / "docs" / "schemas"


def ok(result, code: int = 0) -> dict:
    """The envelope of a --json call (checked against docs/schemas/), or {} for text."""
    assert result.returncode == code, (result.returncode, result.stdout[-2000:], result.stderr[-3000:])
    if not result.stdout.lstrip().startswith("{"):
        return {}
    doc = json.loads(result.stdout)
    import jsonschema

    schema = json.loads((SCHEMAS / f"{doc['command']}.schema.json").read_text())
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    assert doc["exit_code"] == code
    return doc


def records(repo: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in (repo / "state" / "runs").glob("*.json")),
                  key=lambda r: (r["started"], r["run_id"]))


def trials(repo: Path) -> list[dict]:
    return [r for r in records(repo) if r.get("trial")]


def test_a_grid_of_trials_decides_nothing_until_picked_then_routes_from_the_pick(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN)
    ok(H.runbook_inproc(repo, "next", "--yes"), 1)  # the plan's own values: acc 0.68, fail -> Phase 3
    before = ok(H.runbook_inproc(repo, "status", "--json"))["result"]
    assert before["phases"][0]["state"] == "failed" and before["next"]["phase"] == "phase-3"

    swept = ok(H.runbook_inproc(repo, "sweep", "1", *GRID, "--yes", "--json"))["result"]
    assert len(swept["ran"]) == 6 and swept["pending"] == 0 and swept["chosen"] is None
    assert [p["point"] for p in swept["points"]] == [
        {"lr": lr, "hidden": h} for lr in ("0.01", "0.3") for h in ("1", "2", "40")]
    assert [p["run"]["verdict"] for p in swept["points"]] == ["fail", "fail", "pass", "pass", "pass", "pass"]
    # six trials recorded and committed, each with its point; one commit for the sweep's spec
    made = trials(repo)
    assert len(made) == 6 and {r["trial"]["sweep"] for r in made} == {swept["sweep_id"]}
    assert [r["vars"]["lr"] + "/" + r["vars"]["hidden"] for r in made] == [
        "0.01/1", "0.01/2", "0.01/40", "0.3/1", "0.3/2", "0.3/40"]
    log = H.git(repo, "log", "--format=%s")
    assert log.count("[trial ") == 6 and f"sweep {swept['sweep_id']} of phase-1 (6 points)" in log
    assert not H.git(repo, "status", "--porcelain", "--", "state", "plans")
    # ... and the phase's verdict is still its own run's: failed, On fail -> Phase 3
    status = ok(H.runbook_inproc(repo, "status", "--json"))["result"]
    row = status["phases"][0]
    assert (row["state"], row["verdict"], row["decided_how"]) == ("failed", "fail", "last run")
    assert row["decided_by"] == row["run_id"] == before["phases"][0]["run_id"]
    assert status["next"]["phase"] == "phase-3"
    plan_text = (repo / "plans" / "plan.md").read_text()
    assert "**Status:** fail" in plan_text and plan_text.count("(trial ") == 6  # in the results table
    history = ok(H.runbook_inproc(repo, "history", "1", "--metric", "acc", "--json"))["result"]
    assert sum(1 for r in history["runs"] if r["trial"]) == 6

    # --pick on the finished sweep: the best passing trial (lr 0.3, hidden 40: acc 1.2) decides
    picked = ok(H.runbook_inproc(repo, "sweep", "--resume", "--pick", "best:acc", "--yes", "--json"))["result"]
    assert picked["ran"] == [] and picked["sweep_id"] == swept["sweep_id"]
    best = swept["points"][5]["run"]["run_id"]
    assert picked["chosen"]["decision"]["run"] == best and picked["chosen"]["verdict"] == "pass"
    assert picked["next"]["phase"] == "phase-2"  # routed from the pick: On pass
    status = ok(H.runbook_inproc(repo, "status", "--json"))["result"]
    row = status["phases"][0]
    assert (row["state"], row["decided_by"]) == ("passed", best)
    assert row["decided_how"].startswith("picked by best:acc: max acc 1.2 of 4 passing trials")
    text = H.runbook_inproc(repo, "status").stdout
    assert f"decided by run {best}, picked by best:acc" in text
    brief = ok(H.runbook_inproc(repo, "brief", "--json"))["result"]
    assert brief["phases"][0]["decided_by"] == best and brief["next"]["phase"] == "phase-2"
    assert f"{best} (picked by best:acc" in H.runbook_inproc(repo, "brief").stdout
    assert f"decided by run {best}" in (repo / "plans" / "plan.md").read_text()

    # `runbook choose` another trial: it decides now, and the plan routes from its verdict (fail -> Phase 3)
    worst = swept["points"][0]["run"]["run_id"]
    chose = ok(H.runbook_inproc(repo, "choose", worst, "--json"))["result"]
    assert chose["chosen"]["run_id"] == worst and chose["record"]["decision"]["by"] == "choose"
    assert chose["next"]["phase"] == "phase-3"
    row = ok(H.runbook_inproc(repo, "status", "--json"))["result"]["phases"][0]
    assert (row["state"], row["decided_by"], row["decided_how"]) == ("failed", worst, "chosen by `runbook choose`")


def test_refusals_name_the_fix_and_run_nothing(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN)
    head = H.git(repo, "rev-parse", "HEAD")
    for args, words in [
        (("sweep", "1", "--set", "lrr=1,2", "--yes"), "did you mean lr"),
        (("sweep", "1", "--set", "lr=", "--yes"), "NAME=V1,V2"),
        (("sweep", "1", "--yes"), "a sweep needs points"),
        (("sweep", "1", "--set", "lr=1,2", "--pick", "best:hidden", "--yes"), "--pick max:hidden or --pick min:hidden"),
        (("sweep", "1", "--set", "lr=1,2", "--pick", "top:acc", "--yes"), "best:METRIC"),
        (("sweep", "1", "--set", "lr=1,2"), "pass --yes"),
        (("sweep", "--resume", "--yes"), "no unfinished sweep"),
        (("choose", "nope"), "nope"),
    ]:
        done = H.runbook_inproc(repo, *args)
        assert done.returncode == 2 and words in done.stderr, (args, done.stderr)
        H.assert_no_traceback(done)
    assert H.git(repo, "rev-parse", "HEAD") == head and not (repo / "state" / "runs").exists()


def test_a_sweep_killed_with_minus_9_after_two_trials_goes_on_with_the_other_four(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN)
    args = ("sweep", "1", *GRID, "--yes")
    env = {"RUNBOOK_ENV_PROBE": "0"}
    (repo / "nap").write_text("")  # while it is there, a trial with hidden=40 (the third) sleeps a minute
    H.kill_9_once(repo, args, env, lambda: len(trials(repo)) >= 2, "two trials recorded")
    (repo / "nap").unlink()
    assert sorted(r["trial"]["index"] for r in trials(repo)) == [1, 2]
    again = ok(H.runbook_inproc(repo, *args, "--json", env=env))["result"]  # the same command again
    assert again["resumed"] is True and again["pending"] == 0 and len(again["ran"]) == 4
    ran_now = [r["trial"]["index"] for r in trials(repo) if r["run_id"] in again["ran"]]
    assert ran_now == [3, 4, 5, 6]  # only the points not yet run
    interrupted = [r for r in trials(repo) if r["verdict"] == "interrupted"]
    assert [r["trial"]["index"] for r in interrupted] in ([], [3])  # the killed trial 3, if it had started
    finished = [r for r in trials(repo) if r["verdict"] != "interrupted"]
    assert sorted(r["trial"]["index"] for r in finished) == [1, 2, 3, 4, 5, 6]
    status = ok(H.runbook_inproc(repo, "status", "--json"))["result"]
    assert status["phases"][0]["state"] == "not_run"  # trials, the killed one too, decide nothing
    assert not H.git(repo, "status", "--porcelain", "--", "state", "plans")  # all committed


def test_the_mcp_sweep_tool_runs_the_same_command_line() -> None:
    import importlib

    from runbook.cli import COMMANDS
    from runbook.mcp_server import SweepArgs

    argv = SweepArgs(phase="1", grid={"lr": ["0.1", "0.3"]}, points=[{"lr": "1", "hidden": "2"}], pick="best:acc",
                     jobs=2).argv()
    assert argv == ["sweep", "1", "--yes", "--json", "--set", "lr=0.1,0.3", "--point", "lr=1,hidden=2",
                    "--pick", "best:acc", "--jobs", "2"]
    command = importlib.import_module(COMMANDS["sweep"][0]).command
    assert {a for a in argv if a.startswith("--")} <= {opt for param in command.params for opt in param.opts}


OUTPUTS_PLAN = """\
---
runbook: 1
title: A model, then its evaluation
vars:
  lr: "0.1"
---

## Phase 1: Train (~1 min) {#train}

Steps:
- [ ] Train: `mkdir -p work && echo "model lr={lr}" > work/model.txt && echo '{"score": '"$(python3 -c "print(1 - abs(0.3 - {lr}))")"'}' > "$RUNBOOK_METRICS"`

Pass: score >= 0.5
Outputs: work/model.txt

## Phase 2: Evaluate what Phase 1 decided (~1 min)

Steps:
- [ ] Evaluate: `grep -o 'lr=.*' work/model.txt > work/evaluated.txt && echo '{"ok": 1}' > "$RUNBOOK_METRICS"`

Pass: ok == 1
Inputs: work/model.txt
"""


def test_a_consumer_refuses_outputs_of_another_run_until_the_chosen_trials_are_in_place(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", OUTPUTS_PLAN)
    H.commit_files(repo, {"runbook.toml": 'keep_outputs = "work/kept"\n', ".gitignore": "work/\n"}, "keep outputs")
    first = ok(H.runbook_inproc(repo, "next", "--yes", "--json"))["result"]["runs"][0]
    [made] = first["outputs"]  # the hash, size and mtime are in the run record
    assert made["path"] == "work/model.txt" and made["kind"] == "file" and made["size"] == len("model lr=0.1\n")
    assert made["hash"].startswith("xxh128:") and len(made["hash"]) == len("xxh128:") + 32 and made["mtime"]
    assert made["kept"] == f"work/kept/{first['run_id']}/work/model.txt"

    swept = ok(H.runbook_inproc(repo, "sweep", "train", "--set", "lr=0.2,0.3,0.5", "--yes", "--json"))["result"]
    trial_ids = [p["run"]["run_id"] for p in swept["points"]]
    hashes = [p["run"]["outputs"][0]["hash"] for p in swept["points"]]
    assert len(set(hashes + [made["hash"]])) == 4  # each trial's model is its own
    assert (repo / "work" / "model.txt").read_text() == "model lr=0.5\n"  # the last trial's
    # the deciding run is still the first; the file is the last trial's: the consumer refuses, naming both
    refused = H.runbook_inproc(repo, "next", "--yes")
    assert refused.returncode == 2, refused.stderr
    assert (f"work/model.txt was made by run {trial_ids[2]} (trial 3/3 of sweep {swept['sweep_id']}), not by run "
            f"{first['run_id']}, which decides Phase 1 (last run" in refused.stderr)
    assert f"runbook choose {trial_ids[2]}" in refused.stderr and f"runbook choose {first['run_id']}" in refused.stderr
    H.assert_no_traceback(refused)
    assert not (repo / "work" / "evaluated.txt").exists()
    swept_consumer = H.runbook_inproc(repo, "sweep", "2", "--point", "lr=0.9", "--yes")  # a sweep of it too
    assert swept_consumer.returncode == 2 and "was made by run" in swept_consumer.stderr
    assert len(list((repo / "state" / "sweeps").glob("*.json"))) == 1  # and nothing of it was written
    status = ok(H.runbook_inproc(repo, "status", "--json"))["result"]
    assert status["phases"][1]["state"] == "not_run"
    # status tells what next will do: the consumer is blocked on its inputs, the first fix is the command
    action = status["next"]
    assert (action["kind"], action["phase"]) == ("blocked", "phase-2"), action
    assert action["command"] == f"runbook choose {trial_ids[2]}" and action["argv"][1:] == ["choose", trial_ids[2]]
    assert f"was made by run {trial_ids[2]}" in action["why"] and status["summary"].startswith("blocked: Phase 2")
    brief = H.runbook_inproc(repo, "brief")
    assert brief.returncode == 0 and f"runbook choose {trial_ids[2]}" in brief.stdout

    # pick the best trial (lr=0.3, not the last one run): its kept model goes back in place, and the consumer runs
    picked = ok(H.runbook_inproc(repo, "sweep", "--resume", "--pick", "best:score", "--yes", "--json"))["result"]
    assert picked["chosen"]["decision"]["run"] == trial_ids[1]
    assert (repo / "work" / "model.txt").read_text() == "model lr=0.3\n"
    action = ok(H.runbook_inproc(repo, "status", "--json"))["result"]["next"]
    assert (action["kind"], action["phase"]) == ("run", "phase-2"), action
    evaluated = ok(H.runbook_inproc(repo, "next", "--yes", "--json"))["result"]["runs"][0]
    assert (evaluated["phase"], evaluated["verdict"]) == ("phase-2", "pass")
    assert (repo / "work" / "evaluated.txt").read_text() == "lr=0.3\n"


TOGETHER_PLAN = """\
---
runbook: 1
title: Trials at once
vars:
  lr: "0.1"
---

## Phase 1: Fit

Steps:
- [ ] Fit: `python3 -c "import json, os, sys, time; t0 = time.time(); time.sleep(1); json.dump({'t0': t0, 't1': time.time(), 'acc': float(sys.argv[1])}, open(os.environ['RUNBOOK_METRICS'], 'w'))" {lr}`

Pass: acc >= 0.2
"""


def test_jobs_runs_local_trials_at_once_and_one_after_another_without_it(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", TOGETHER_PLAN)

    def spans(result: dict) -> list[tuple[float, float]]:
        return [(p["run"]["metrics"]["t0"], p["run"]["metrics"]["t1"]) for p in result["points"]]

    (a0, a1), (b0, b1) = spans(ok(H.runbook_inproc(repo, "sweep", "1", "--set", "lr=0.3,0.5", "--yes", "--json"))["result"])
    assert a1 <= b0  # one after another
    together = ok(H.runbook_inproc(repo, "sweep", "1", "--set", "lr=0.7,0.9", "--jobs", "2", "--yes", "--json"))
    (a0, a1), (b0, b1) = spans(together["result"])
    assert a0 < b1 and b0 < a1  # at once
    assert len(trials(repo)) == 4 and not H.git(repo, "status", "--porcelain", "--", "state", "plans")
    assert (repo / "plans" / "plan.md").read_text().count("(trial ") == 4  # each written back, none lost
