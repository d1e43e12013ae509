"""An agent drives a branching plan to its end from `--json` outputs and exit codes alone.

It never reads text: each turn it asks `runbook status --json` for THE next action and runs its
`argv`; when the plan stops after a fail it changes the code (what an agent would do) and asks
again, and the tool then offers the retry. The plan: Phase 0 probes; Phase 1 trains and fails,
falling back to Phase 1b, which fails too (On fail: stop) until params.json is fixed; then Phase 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import helpers as H
import jsonschema

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"

PLAN = """\
---
runbook: 1
title: Agent loop
---

## Phase 0: Probe

Steps:
- [ ] Probe: `echo '{"score": 3}' > "$RUNBOOK_METRICS"`

Pass: `score >= 2`

## Phase 1: Train big

Steps:
- [ ] Train: `echo '{"acc": 0.2}' > "$RUNBOOK_METRICS"`

Pass: `acc >= 0.5`
On pass: Phase 2
On fail: Phase 1b

## Phase 1b: Train small {#small}

Steps:
- [ ] Train: `python3 -c 'import json, os; p = json.load(open("params.json")); json.dump({"acc": 0.9 if p["lr"] < 0.01 else 0.1}, open(os.environ["RUNBOOK_METRICS"], "w"))'`

Pass: `acc >= 0.5`
On fail: stop

## Phase 2: Serve

Steps:
- [ ] Serve: `echo '{"tok_s": 80}' > "$RUNBOOK_METRICS"`

Pass: `tok_s > 50`
"""


def rb(repo: Path, *args: str) -> dict:
    """One call, as an agent makes it: the envelope, checked against its schema and the exit status."""
    done = H.runbook_inproc(repo, *args, "--json", timeout=120)
    envelope = json.loads(done.stdout)
    schema = json.loads((SCHEMAS / f"{envelope['command']}.schema.json").read_text())
    jsonschema.validate(envelope, schema)
    assert envelope["exit_code"] == done.returncode
    return envelope


def test_an_agent_drives_a_branching_plan_to_its_end_from_json_alone(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN)
    (repo / "params.json").write_text('{"lr": 0.1}\n')
    H.git(repo, "add", "params.json")
    H.git(repo, "commit", "-qm", "params")

    ran: list[tuple[str, str, int]] = []  # (phase, verdict, exit code) of every run the agent made
    kinds: list[str] = []
    fixes = 0
    for _turn in range(20):
        status = rb(repo, "status")
        assert status["ok"]
        action = status["result"]["next"]
        kinds.append(action["kind"])
        if action["kind"] in ("run", "resume", "rerun", "retry"):
            result = rb(repo, *action["argv"][1:])
            assert result["ok"], result
            for run in result["result"]["runs"]:
                assert run["phase"] == action["phase"]
                ran.append((run["phase"], run["verdict"], result["exit_code"]))
            # where the plan goes next comes with the run
            assert result["result"]["next"] == rb(repo, "status")["result"]["next"]
        elif action["kind"] == "nothing" and action["outcome"] == "failed":
            # stopped after a fail, and nothing changed: the tool offers no retry; the agent fixes
            # the code (never the plan) and commits it, once
            assert action["argv"] is None and fixes == 0, action
            failed = status["result"]["last_run"]
            assert failed["verdict"] == "fail" and failed["comparisons"][0]["held"] is False
            assert (failed["comparisons"][0]["metric"], failed["comparisons"][0]["threshold"]) == ("acc", 0.5)
            (repo / "params.json").write_text('{"lr": 0.001}\n')
            H.git(repo, "commit", "-qam", "lower the learning rate")
            fixes += 1
        elif action["kind"] == "nothing" and action["outcome"] == "finished":
            break
        else:
            raise AssertionError(f"unexpected next action: {action}")
    else:
        raise AssertionError(f"the agent did not finish: {ran}")

    assert ran == [
        ("phase-0", "pass", 0),
        ("phase-1", "fail", 1),
        ("small", "fail", 1),
        ("small", "pass", 0),
        ("phase-2", "pass", 0),
    ]
    assert kinds == ["run", "run", "run", "nothing", "retry", "run", "nothing"]
    final = rb(repo, "status")["result"]
    assert [(p["id"], p["state"]) for p in final["phases"]] == [
        ("phase-0", "passed"), ("phase-1", "failed"), ("small", "passed"), ("phase-2", "passed")]
    assert final["summary"] == "finished: nothing left to run; failed along the way: Phase 1"
    # the retry was offered because of the code change, and named it
    history = rb(repo, "history")["result"]["runs"]
    assert [r["phase"] for r in history] == [p for p, _v, _c in ran]
    assert history[3]["commit"] != history[2]["commit"]  # the retry ran on the fixed code
