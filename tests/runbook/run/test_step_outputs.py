"""What steps leave behind, through the real `runbook next` in real repositories.

- Metrics: a bool counts as 1/0, a nested object flattens to dotted names, a string is recorded and
  usable with `==`, NaN is recorded and fails its comparison; the run record stays valid JSON.
- A criterion naming a metric no step wrote: the reason lists what was written, with a "did you
  mean", and notices JSON printed to stdout instead of the metrics file.
- Rejected metrics (a list, a 400-digit integer, a FIFO, /dev/zero): the run is recorded and
  committed as `error` at once, the step is not ticked, and the next run re-runs it.
- A log without newlines puts at most a few KiB into the run record.
- A step's `python` inside the user's virtualenv is the user's; `eagle` is still found.
- A daemon a step starts with `setsid` does not outlive the step; a process of the test's own,
  outside the run, is left alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import helpers as H
import pytest


def plan(steps: list[str], criterion: str | None = None, extra: str = "") -> str:
    body = "".join(f"- [ ] s{i}: `` {cmd} ``\n" for i, cmd in enumerate(steps, 1))
    crit = f"\nPass: `{criterion}`\n" if criterion else ""
    return f"---\nrunbook: 1\ntitle: Outputs\nnotes: notes.md\n---\n\n## Phase 0: Probe\n\nSteps:\n{body}{crit}{extra}"


def only_run(repo: Path) -> dict:
    runs = sorted((repo / "state" / "runs").glob("*.json"))
    return json.loads(runs[-1].read_text(), parse_constant=_no_constants)


def _no_constants(name: str) -> None:
    raise AssertionError(f"the run record holds the non-JSON constant {name}")


def test_bools_nested_objects_strings_and_nan(tmp_path: Path, counts) -> None:
    metrics = '{"ok": true, "optimizer": "adamw", "cfg": {"lr": 0.01}, "loss": NaN}'
    repo = H.make_repo(tmp_path / "repo", plan(
        [f"echo '{metrics}' > \"$RUNBOOK_METRICS\""],
        'ok == 1 and optimizer == "adamw" and cfg.lr < 0.1',
    ), notes="# Notes\n")
    result = H.runbook(repo, "next", "--yes")
    H.assert_no_traceback(result)
    assert result.returncode == 0, result.stdout + result.stderr
    record = only_run(repo)
    assert record["metrics"]["ok"] == 1.0 and record["metrics"]["optimizer"] == "adamw"
    assert record["metrics"]["cfg.lr"] == 0.01 and record["metrics"]["loss"] == "NaN"
    assert 'optimizer "adamw" == "adamw"' in record["reason"]
    # NaN fails its comparison (a verdict, not an error)
    repo2 = H.make_repo(tmp_path / "repo2", plan([f"echo '{metrics}' > \"$RUNBOOK_METRICS\""], "loss < 4"))
    result = H.runbook(repo2, "next", "--yes")
    assert result.returncode == 1, result.stdout + result.stderr
    assert only_run(repo2)["verdict"] == "fail" and "✗ loss nan < 4" in only_run(repo2)["reason"]
    # every reader copes with string and NaN metrics
    for args in (["status"], ["history"], ["brief"], ["brief", "--json"], ["record", "After", "--run", "last", "--no-commit"]):
        out = H.runbook(repo, *args)
        H.assert_no_traceback(out, " ".join(args))
        assert out.returncode == 0, (args, out.stdout, out.stderr)
    counts.add("metrics_values_checked", 6)


def test_missing_metric_lists_what_was_written_with_did_you_mean(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", plan(
        ["echo '{\"accept_length\": 2.1, \"loss\": 1}' > \"$RUNBOOK_METRICS\""], "accept_len >= 1.5"
    ))
    result = H.runbook_inproc(repo, "next", "--yes")
    assert result.returncode == 3, result.stdout + result.stderr
    reason = only_run(repo)["reason"]
    assert "no step wrote accept_len" in reason
    assert "did you mean accept_length for accept_len?" in reason and "the steps wrote accept_length, loss" in reason


def test_json_printed_to_stdout_gets_a_hint(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", plan(["echo '{\"accept_len\": 2.1}'"], "accept_len >= 1.5"))
    result = H.runbook_inproc(repo, "next", "--yes")
    assert result.returncode == 3, result.stdout + result.stderr
    reason = only_run(repo)["reason"]
    assert 'step-1 printed {"accept_len": 2.1} to its output but wrote nothing to $RUNBOOK_METRICS' in reason
    assert "the steps wrote no metrics" in reason


@pytest.mark.parametrize(
    "bad, words",
    [
        ("echo '{\"acc\": [0.8, 0.6]}' > \"$RUNBOOK_METRICS\"", "is a list"),
        ("printf '{\"n\": %s}' " + "9" * 400 + " > \"$RUNBOOK_METRICS\"", "400 digits"),
        ("printf '{\"n\": %s}' " + "9" * 5000 + " > \"$RUNBOOK_METRICS\"", "5000 digits"),
        ("rm \"$RUNBOOK_METRICS\" && mkfifo \"$RUNBOOK_METRICS\"", "FIFO"),
        ("ln -sf /dev/zero \"$RUNBOOK_METRICS\"", "not a regular file"),
    ],
    ids=["list", "int-400-digits", "int-5000-digits", "fifo", "dev-zero"],
)
def test_rejected_metrics_record_an_error_and_the_step_runs_again(tmp_path: Path, bad: str, words: str, counts) -> None:
    repo = H.make_repo(tmp_path / "repo", plan(
        ["echo one >> runs.txt", f"echo two >> runs.txt; test -e fixed || {{ {bad}; }}"], None
    ))
    (repo / ".gitignore").write_text((repo / ".gitignore").read_text() + "runs.txt\nfixed\n")
    H.git(repo, "commit", "-qam", "ignore")
    t0 = time.monotonic()
    result = H.runbook(repo, "next", "--yes", timeout=120)
    assert time.monotonic() - t0 < 60, "runbook hung on the metrics file"
    H.assert_no_traceback(result)
    assert result.returncode == 4, result.stdout + result.stderr
    record = only_run(repo)
    assert record["verdict"] == "error" and words in record["reason"], record["reason"]
    assert record["steps"][1]["metrics_error"] and record["steps"][1]["exit_code"] == 0
    assert record["run_id"] in H.committed_runs(repo)
    text = (repo / "plans" / "plan.md").read_text()
    assert "- [x] s1" in text and "- [ ] s2" in text  # the step whose metrics were rejected is not done
    (repo / "fixed").write_text("")
    again = H.runbook_inproc(repo, "next", "--yes")
    assert again.returncode == 0, again.stdout + again.stderr
    assert (repo / "runs.txt").read_text() == "one\ntwo\ntwo\n"  # s2 ran again, s1 did not
    counts.add("metrics_values_checked")


def test_log_without_newlines_is_bounded_in_the_record(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", plan(["head -c 5000000 /dev/zero | tr '\\0' x; printf '\\r50%%\\r100%%'"]))
    result = H.runbook_inproc(repo, "next", "--yes")
    assert result.returncode == 0, result.stdout[-500:] + result.stderr
    path = sorted((repo / "state" / "runs").glob("*.json"))[-1]
    assert path.stat().st_size < 16_000
    tail = json.loads(path.read_text())["steps"][0]["log_tail"]
    assert tail[-1] == "100%" and tail[0].startswith("…") and sum(len(x) for x in tail) < 9000


def _venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, capture_output=True)
    return where


@pytest.mark.parametrize("mode", ["default", "prepend"])
def test_steps_python_in_a_user_venv_is_the_users(tmp_path: Path, mode: str) -> None:
    venv = _venv(tmp_path / "uservenv")
    repo = H.make_repo(tmp_path / "repo", plan([
        "python -c 'import sys; print(sys.prefix)' > prefix.txt; command -v eagle > eagle.txt; command -v runbook >> eagle.txt"
    ]))
    config = {"runbook.toml": 'runbook_bin = "prepend"\n'} if mode == "prepend" else {}
    H.commit_files(repo, {**config, ".gitignore": (repo / ".gitignore").read_text() + "*.txt\n"}, "config")
    env = {"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
    result = H.runbook_inproc(repo, "next", "--yes", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    prefix = Path((repo / "prefix.txt").read_text().strip()).resolve()
    found = (repo / "eagle.txt").read_text().split()
    bindir = Path(sys.executable).parent
    assert found == [str(bindir / "eagle"), str(bindir / "runbook")]  # found beside runbook either way
    if mode == "default":
        assert prefix == venv.resolve()  # the user's interpreter, not runbook's
    else:
        assert prefix == Path(sys.prefix).resolve()


def test_setsid_daemon_of_a_step_does_not_survive_it(tmp_path: Path) -> None:
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)  # ours, outside the run
    try:
        repo = H.make_repo(tmp_path / "repo", plan([
            "setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo $! > daemon.pid; "
            "setsid bash -c 'sleep 300' > /dev/null 2>&1 & echo $! >> daemon.pid"
        ]))
        (repo / ".gitignore").write_text((repo / ".gitignore").read_text() + "daemon.pid\n")
        H.git(repo, "commit", "-qam", "ignore")
        t0 = time.monotonic()
        result = H.runbook(repo, "next", "--yes")
        assert result.returncode == 0, result.stdout + result.stderr
        assert time.monotonic() - t0 < 60
        pids = [int(x) for x in (repo / "daemon.pid").read_text().split()]
        deadline = time.monotonic() + 10
        from runbook.store.procs import pid_alive

        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(pid_alive(p) for p in pids), "a setsid daemon outlived its step"
        assert bystander.poll() is None, "a process outside the run was signalled"
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()
