"""`runbook sweep --jobs N` on `Executor: slurm`: the trials' jobs are submitted together and each
trial is judged and committed as its job ends, on the session's real single-node Slurm cluster
(tests/support/slurm_cluster.py). One sweep of two short jobs; no time limit is waited on."""

from __future__ import annotations

import json
from pathlib import Path

import helpers as H

PLAN = """\
---
runbook: 1
title: A sweep on the cluster
vars:
  lr: "0.1"
---

## Phase 1: Fit on the cluster

Steps:
- [ ] Fit: `python3 -c "import json, os, sys, time; t0 = time.time(); time.sleep(4); json.dump({'t0': t0, 't1': time.time(), 'acc': float(sys.argv[1])}, open(os.environ['RUNBOOK_METRICS'], 'w'))" {lr}`

Pass: acc >= 0.2
Executor: slurm
Resources: nodes=1 ntasks=1 cpus-per-task=1 time=5
"""

FAST = {"RUNBOOK_HEARTBEAT_S": "0.2", "RUNBOOK_SLURM_POLL_S": "0.2", "RUNBOOK_ENV_PROBE": "0"}


def test_a_sweeps_trials_run_as_concurrent_slurm_jobs(tmp_path: Path, slurm_cluster) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN)
    done = H.runbook(repo, "sweep", "1", "--set", "lr=0.3,0.5", "--jobs", "2", "--pick", "best:acc", "--yes",
                     "--json", env={**FAST, "SLURM_CONF": slurm_cluster.env["SLURM_CONF"]}, timeout=240)
    H.assert_no_traceback(done)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    result = json.loads(done.stdout)["result"]
    runs = [p["run"] for p in result["points"]]
    assert [r["verdict"] for r in runs] == ["pass", "pass"] and all(r["executor"] == "slurm" for r in runs)
    jobs = {r["steps"][0]["job_id"] for r in runs}
    assert len(jobs) == 2 and all(r["steps"][0]["job_state"] == "COMPLETED" for r in runs)
    # the two jobs ran at the same time: each started before the other ended
    (a0, a1), (b0, b1) = ((r["metrics"]["t0"], r["metrics"]["t1"]) for r in runs)
    assert a0 < b1 and b0 < a1, (a0, a1, b0, b1)
    assert result["chosen"]["decision"]["run"] == runs[1]["run_id"]  # lr=0.5: best acc
    assert H.git(repo, "log", "--format=%s").count("[trial ") == 2
    assert not H.git(repo, "status", "--porcelain", "--", "state", "plans")
