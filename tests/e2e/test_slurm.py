"""`Executor: slurm` on a real single-node Slurm cluster (the `slurm_cluster` fixture, tests/support/slurm_cluster.py).

Each step is an sbatch job; runbook polls squeue / scontrol (no accounting), streams the job's
output into the step log and reads $RUNBOOK_METRICS from the shared filesystem. The tests run
the real console script against the session's private cluster (SLURM_CONF) and signal only the
runbook process they started themselves.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import helpers as H
import pytest

from runbook.plan.parse import parse_plan
from runbook.plan.resources import ResourcesError, parse_resources, sbatch_args
from runbook.run.executor import StepSpec
from runbook.run.slurm import JobInfo, job_script, parse_job, verdict_of
from runbook.store.project import ConfigError, load_config

FAST = {"RUNBOOK_HEARTBEAT_S": "0.2", "RUNBOOK_SLURM_POLL_S": "0.2"}


def plan(*steps: str, resources: str = "nodes=1 time=5", criterion: str = "") -> str:
    lines = "\n".join(f"- [ ] Step {i}: `{cmd}`" for i, cmd in enumerate(steps, 1))
    return f"""\
---
runbook: 1
title: Cluster
---

# Cluster

## Phase 0: On the cluster

Steps:
{lines}

Executor: slurm
Resources: {resources}
{criterion}
"""


def make(tmp_path: Path, text: str) -> Path:
    repo = H.make_repo(tmp_path / "repo", text)
    (repo / ".gitignore").write_text((repo / ".gitignore").read_text() + "go\n")
    H.git(repo, "commit", "-qam", "ignore go")
    return repo


def rb(repo: Path, cluster, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    result = H.runbook(repo, *args, env={**FAST, "SLURM_CONF": cluster.env["SLURM_CONF"]}, timeout=timeout)
    H.assert_no_traceback(result, " ".join(args))
    return result


def rb_json(repo: Path, cluster, *args: str, timeout: float = 240) -> dict:
    result = rb(repo, cluster, *args, "--json", timeout=timeout)
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == result.returncode, result.stdout
    return doc


wait_for = H.wait_for


def live_state(repo: Path) -> dict | None:
    for path in (repo / "state" / "runs").glob("*/live.json"):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None
    return None


# ---- pure parts -------------------------------------------------------------------------------


def test_resources_become_sbatch_options_and_typos_are_refused() -> None:
    res = parse_resources("nodes=2 gpus-per-node=8 time=48:00:00 partition=gpu")
    assert sbatch_args(res) == ["--nodes=2", "--gpus-per-node=8", "--time=48:00:00", "--partition=gpu"]
    for bad, word in (("nodes=2 gpus_per_node=8", "gpus_per_node"), ("time=soon", "time=soon"), ("nodes", "nodes"),
                      ("nodes=1 nodes=2", "twice")):
        with pytest.raises(ResourcesError, match=word):
            parse_resources(bad)


def test_executor_and_resources_are_plan_fields_checked_at_their_line() -> None:
    text = plan("true", resources="nodes=2 gpus-per-node=8 time=48:00:00 partition=gpu")
    parsed, problems = parse_plan(text, "p.md")
    assert problems == [] and parsed is not None
    phase = parsed.phases[0]
    assert phase.executor == "slurm"
    assert phase.resources == {"nodes": "2", "gpus-per-node": "8", "time": "48:00:00", "partition": "gpu"}
    local = text.replace("Executor: slurm\n", "")
    parsed, problems = parse_plan(local, "p.md")
    assert parsed.phases[0].executor is None
    assert [(p.line, p.severity) for p in problems] == [(13, "warning")]  # the Resources: line
    assert "used only by `Executor: slurm`" in problems[0].message


def test_runbook_toml_slurm_defaults_are_checked(tmp_path: Path) -> None:
    (tmp_path / "runbook.toml").write_text('[slurm]\nresources = "time=2:00:00 partition=gpu"\npoll_s = 5\n')
    config = load_config(tmp_path)
    assert config.slurm.poll_s == 5 and parse_resources(config.slurm.resources)["partition"] == "gpu"
    (tmp_path / "runbook.toml").write_text('[slurm]\nresources = "nodes=two"\n')
    with pytest.raises(ConfigError, match=r"runbook.toml: slurm.resources: `nodes=two`: expected a number"):
        load_config(tmp_path)


def test_a_repository_path_with_a_newline_injects_no_line_into_the_job_script(tmp_path: Path) -> None:
    """The sbatch script names the command it was submitted with in a comment; a path holding a
    newline and shell code (the repository's, the log's) stays inside that comment and runs nothing."""
    evil = str(tmp_path / "repo\ntouch PWNED\r\n#")
    script = tmp_path / "step-1.sbatch"
    exit_path = tmp_path / "exit"
    script.write_text(job_script(StepSpec(step_id="step-1", command="echo ran"), "20260101-000000-abcd", "phase-0",
                                 exit_path, ["sbatch", f"--chdir={evil}", f"--output={evil}/log", str(script)]))
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout == "ran\n", (done.stdout, done.stderr)
    assert not (tmp_path / "PWNED").exists() and exit_path.read_text() == "0\n"
    body = [line for line in script.read_text().splitlines() if not line.startswith("#")]
    assert body == ["bash -c 'echo ran'", "code=$?", f"echo \"$code\" > {exit_path}", 'exit "$code"'], body


def test_slurm_states_map_to_verdicts() -> None:
    def job(state: str, exit_code: str = "0:0") -> JobInfo:
        return parse_job("7", f"JobId=7 JobName=runbook-x-step-1 JobState={state} Reason=None ExitCode={exit_code} "
                               "RunTime=00:00:01")

    assert verdict_of(job("COMPLETED"), None) == (None, 0, "COMPLETED")
    assert verdict_of(job("FAILED", "3:0"), None) == ("error", 3, "FAILED")
    assert verdict_of(job("OUT_OF_MEMORY", "0:125"), None)[0] == "error"
    assert verdict_of(job("NODE_FAIL"), None)[0] == "error"
    assert verdict_of(job("TIMEOUT", "0:15"), None) == ("timeout", -15, "TIMEOUT")
    assert verdict_of(job("CANCELLED", "0:15"), None) == ("interrupted", -15, "CANCELLED")
    assert job("RUNNING").name == "runbook-x-step-1"
    # the controller forgot the job (no accounting): the exit code its script wrote decides
    assert verdict_of(None, 0) == (None, 0, "COMPLETED")
    assert verdict_of(None, 2) == ("error", 2, "FAILED")
    assert verdict_of(None, None) == ("error", None, "UNKNOWN")


# ---- on the cluster ---------------------------------------------------------------------------


def test_slurm_phase_passes_with_its_job_ids_logs_and_metrics(slurm_cluster, tmp_path: Path) -> None:
    repo = make(tmp_path, plan('echo "job $SLURM_JOB_ID step $RUNBOOK_STEP"; echo \'{"loss": 0.25}\' > "$RUNBOOK_METRICS"',
                               "echo second", criterion="Pass: `loss < 1`", resources="nodes=1"))
    (repo / "runbook.toml").write_text('[slurm]\nresources = "time=5 nodes=3"\nsbatch_args = ["--comment=from-toml"]\n')
    H.git(repo, "add", "runbook.toml")
    H.git(repo, "commit", "-qm", "slurm defaults")
    doc = rb_json(repo, slurm_cluster, "next", "--yes")
    assert doc["exit_code"] == 0, doc
    run = doc["result"]["runs"][0]
    assert run["verdict"] == "pass" and run["executor"] == "slurm" and run["metrics"]["loss"] == 0.25
    jobs = [s["job_id"] for s in run["steps"]]
    assert all(jobs) and len(set(jobs)) == 2 and [s["job_state"] for s in run["steps"]] == ["COMPLETED"] * 2
    script = (repo / "state" / "runs" / run["run_id"] / "step-1.sbatch").read_text()
    assert "--time=5 --nodes=1 --comment=from-toml" in script, script  # the phase's own words win
    log = (repo / run["steps"][0]["log_path"]).read_text()
    assert f"job {jobs[0]} step step-1" in log, log
    record = H.committed_runs(repo)[run["run_id"]]
    assert record["steps"][0]["job_id"] == jobs[0] and record["executor"] == "slurm"
    assert H.git(repo, "status", "--porcelain") == ""
    assert not set(jobs) & set(slurm_cluster.squeue())


def test_a_failing_job_gives_error_with_the_jobs_log_tail(slurm_cluster, tmp_path: Path) -> None:
    repo = make(tmp_path, plan("echo boom-line; exit 3", "echo never"))
    doc = rb_json(repo, slurm_cluster, "next", "--yes")
    assert doc["exit_code"] == 4, doc
    run = doc["result"]["runs"][0]
    assert run["verdict"] == "error"
    job = run["steps"][0]["job_id"]
    assert f"Slurm job {job} (step-1) FAILED with exit 3" in run["reason"]
    assert run["steps"][0]["exit_code"] == 3 and run["steps"][0]["job_state"] == "FAILED"
    assert len(run["steps"]) == 1, "the phase stopped at the failed job"
    assert any("boom-line" in line for line in run["failures"]), run["failures"]
    assert rb_json(repo, slurm_cluster, "status")["result"]["next"]["kind"] == "resume"


@pytest.mark.slow
def test_a_job_over_its_time_limit_gives_timeout(slurm_cluster, tmp_path: Path) -> None:
    # Slurm's limits are whole minutes and it checks them every 30 s: this takes 60-90 s
    repo = make(tmp_path, plan("echo started; sleep 600", resources="nodes=1 time=1"))
    t0 = time.monotonic()
    doc = rb_json(repo, slurm_cluster, "next", "--yes", timeout=300)
    took = time.monotonic() - t0
    assert doc["exit_code"] == 4, doc
    run = doc["result"]["runs"][0]
    assert run["verdict"] == "timeout" and run["steps"][0]["job_state"] == "TIMEOUT", run
    assert "hit its Slurm time limit" in run["reason"]
    assert 55 < took < 200, took
    assert run["steps"][0]["job_id"] not in slurm_cluster.squeue()


def test_cancel_scancels_a_detached_slurm_phase_and_leaves_no_job(slurm_cluster, tmp_path: Path) -> None:
    repo = make(tmp_path, plan("echo started; sleep 600"))
    started = rb_json(repo, slurm_cluster, "next", "--yes", "--detach")
    assert started["exit_code"] == 0, started
    run_id = started["result"]["detached"]["run_id"]

    def running_job():
        view = rb_json(repo, slurm_cluster, "status")["result"]["running"]
        return view and view.get("job_id") and "started" in view.get("log_tail", []) and view
    view = wait_for(running_job, timeout=90, every=0.3)  # the caller is gone; the job runs on
    job = view["job_id"]
    assert view["executor"] == "slurm" and view["detached"] is True and job in slurm_cluster.squeue()
    cancelled = rb_json(repo, slurm_cluster, "cancel")
    assert cancelled["exit_code"] == 0, cancelled
    run = cancelled["result"]["run"]
    assert run["run_id"] == run_id and run["verdict"] == "interrupted"
    assert run["steps"][0]["job_id"] == job and run["steps"][0]["job_state"] == "CANCELLED"
    assert cancelled["result"]["jobs"] == [job]
    assert f"cancelled Slurm job {job} (scancel)" in run["reason"]
    assert slurm_cluster.squeue() == [], "no job is left in squeue"
    assert not (repo / "state" / "lock").exists()


def test_kill_9_of_runbook_during_a_slurm_phase_then_next_reattaches_to_the_same_job(
    slurm_cluster, tmp_path: Path
) -> None:
    repo = make(tmp_path, plan("echo start; while [ ! -e go ]; do sleep 0.1; done; echo done; "
                               "echo '{\"loss\": 0.5}' > \"$RUNBOOK_METRICS\"", "echo second",
                               criterion="Pass: `loss < 1`"))
    env = {**FAST, "SLURM_CONF": slurm_cluster.env["SLURM_CONF"]}
    proc = H.popen_runbook(repo, "next", "--yes", env=env, start_new_session=True)
    live = wait_for(lambda: (s := live_state(repo)) and s.get("jobs") and s, timeout=90)
    run_id, job = live["run_id"], live["jobs"][0]["job_id"]
    wait_for(lambda: "start" in (repo / "state" / "runs" / run_id / "step-1.log").read_text(), timeout=60)
    os.kill(proc.pid, signal.SIGKILL)  # the runbook this test started; its Slurm job is not its child
    proc.communicate(timeout=30)
    assert job in slurm_cluster.squeue(), "the job survives runbook"

    status = rb_json(repo, slurm_cluster, "status")["result"]
    assert status["last_run"]["pending"] is True and status["next"]["kind"] == "resume"
    assert f"Slurm job {job}" in status["next"]["why"] and "re-attaches" in status["next"]["why"]

    # the job still waits for `go` while the next runbook takes the stale lock over and re-attaches
    again = H.popen_runbook(repo, "next", "--yes", env=env)
    seen = []
    for line in again.stdout:
        seen.append(line)
        if line.startswith("re-attaching"):
            break
    assert seen and seen[-1] == f"re-attaching to Slurm job {job} (step-1) of run {run_id}\n", seen
    assert job in slurm_cluster.squeue(), "taking the dead run's lock over left its Slurm job alone"
    (repo / "go").touch()
    out, err = again.communicate(timeout=240)
    assert again.returncode == 0, "".join(seen) + out + err
    runs = H.committed_runs(repo)
    assert list(runs) == [run_id], "one run, recorded once, under the id it started with"
    record = runs[run_id]
    assert record["verdict"] == "pass" and record["metrics"]["loss"] == 0.5
    assert record["steps"][0]["job_id"] == job and record["steps"][0]["job_state"] == "COMPLETED"
    assert record["steps"][1]["job_id"] not in (None, job)
    log = (repo / "state" / "runs" / run_id / "step-1.log").read_text()
    assert log.count("start\n") == 1 and log.count("done\n") == 1, log
    subjects = H.git(repo, "log", "--format=%s").splitlines()
    assert subjects == ["runbook: phase-0 pass (loss=0.5)", "ignore go", "init"], subjects
    assert slurm_cluster.squeue() == []
