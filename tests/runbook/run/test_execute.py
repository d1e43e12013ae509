"""Steps as real subprocesses: env, logs, metrics files, process groups, timeouts, metrics merge."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path

import helpers as H
import pytest

from runbook.model import StepResult, merge_metrics
from runbook.run.executor import Interrupts, StepSpec
from runbook.run.local import MetricsError, read_metrics, run_steps
from runbook.store.lock import group_alive, pid_alive


def _run(tmp_path, steps, **kw):
    echo = io.BytesIO()
    out = run_steps(
        steps, run_id="r1", phase_id="phase-0", repo_root=tmp_path, state_dir=tmp_path / "state", echo=echo, **kw
    )
    return out, echo.getvalue().decode()


def test_env_cwd_path_log_and_metrics(tmp_path):
    cmd = (
        'echo "id=$RUNBOOK_RUN_ID phase=$RUNBOOK_PHASE step=$RUNBOOK_STEP cwd=$(pwd)"; '
        'test -d "$RUNBOOK_ARTIFACTS" && echo artifacts-ok; cat "$RUNBOOK_METRICS"; '
        'echo "path0=${PATH%%:*}"; echo err >&2; '
        'echo \'{"loss": 1.5, "n": 3}\' > "$RUNBOOK_METRICS"'
    )
    out, echoed = _run(tmp_path, [StepSpec("step-1", cmd), StepSpec("step-2", 'echo \'{"loss": 0.5}\' > $RUNBOOK_METRICS')])
    assert out.stopped is None
    first = out.results[0]
    assert first.exit_code == 0 and first.metrics == {"loss": 1.5, "n": 3.0}
    assert f"id=r1 phase=phase-0 step=step-1 cwd={tmp_path}" in echoed
    assert "artifacts-ok" in echoed and "{}" in echoed and "err" in echoed
    # runbook's interpreter directory is appended: the user's own PATH entries (their venv) come first
    assert f"path0={Path(sys.executable).parent}" not in echoed or os.environ["PATH"].startswith(str(Path(sys.executable).parent))
    log = tmp_path / first.log_path
    assert log.read_text() .count("artifacts-ok") == 1 and first.log_path == "state/runs/r1/step-1.log"
    assert "err" in first.log_tail
    merged = merge_metrics(out.results)
    assert merged["loss"] == 0.5 and merged["step-1.loss"] == 1.5 and merged["step-2.loss"] == 0.5 and merged["n"] == 3


def test_nonzero_exit_stops_phase(tmp_path):
    out, _ = _run(tmp_path, [StepSpec("step-1", "exit 3"), StepSpec("step-2", "touch never")])
    assert out.stopped == "error" and "step-1 exited 3" in out.reason
    assert [r.exit_code for r in out.results] == [3]
    assert not (tmp_path / "never").exists()


def test_skipped_steps_carry_metrics(tmp_path):
    out, _ = _run(tmp_path, [StepSpec("step-1", "touch a", skip=True, carried_metrics={"x": 1.0}), StepSpec("step-2", "true")])
    assert out.results[0].skipped and out.results[0].metrics == {"x": 1.0}
    assert not (tmp_path / "a").exists()


def test_timeout_kills_whole_group(tmp_path):
    # the step starts a grandchild that would outlive a plain kill of the shell
    pidfile = tmp_path / "grandchild.pid"
    t0 = time.monotonic()
    out, _ = _run(
        tmp_path, [StepSpec("step-1", f"sleep 30 & echo $! > {pidfile}; wait")], timeout_s=2.0, grace_s=1.0
    )
    assert time.monotonic() - t0 < 8
    assert out.stopped == "timeout" and "timeout" in out.reason
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 3
    while pid_alive(grandchild) and time.monotonic() < deadline:  # a zombie until init reaps it
        time.sleep(0.05)
    assert not pid_alive(grandchild)


def test_term_ignoring_step_is_killed_after_grace(tmp_path):
    out, _ = _run(tmp_path, [StepSpec("step-1", "trap '' TERM; sleep 20")], timeout_s=2.0, grace_s=0.5)
    assert out.stopped == "timeout" and out.results[0].exit_code == -9


def test_leftover_background_process_is_reaped(tmp_path):
    pgids = []
    t0 = time.monotonic()
    out, _ = _run(tmp_path, [StepSpec("step-1", "sleep 30 & echo started")], on_pgid=pgids.append, grace_s=1)
    assert time.monotonic() - t0 < 4
    assert out.stopped is None and pgids[0] and pgids[-1] is None
    deadline = time.monotonic() + 3
    while group_alive(pgids[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group_alive(pgids[0])


def test_interrupt_flag_stops_step(tmp_path):
    intr = Interrupts()
    intr.signum = 2  # as if SIGINT arrived
    out, _ = _run(tmp_path, [StepSpec("step-1", "sleep 5")], interrupts=intr)
    assert out.stopped == "interrupted" and out.results == []


@pytest.mark.parametrize(
    "content, message",
    [
        ("[1, 2]", "got a list"),
        ('{"a": [1, 2]}', "'a' is a list"),
        ('{"a": null}', "'a' is null"),
        ('{"a": "' + "x" * 1001 + '"}', "string of 1001 characters"),
        ('{"a": ' + "9" * 400 + "}", "an integer of 400 digits"),
        ('{"a": ' + "9" * 5000 + "}", "an integer of 5000 digits"),
        ("{oops", "not JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested"),
        ('{"a":' * 100_000 + "1" + "}" * 100_000, "nested"),
        ("{" + ", ".join(f'"m{i}": {i}' for i in range(1001)) + "}", "more than 1000 metrics"),
        # a lone surrogate (half of a \u escape pair; the fuzz test found `{"": "\ud81111..."}`): no run
        # record could hold it, so writing the ledger failed with a traceback
        ('{"a": "\\ud811 and \\udc00"}', "'a' holds '\\ud811', half of a character"),
        ('{"\\udc00x": 1}', "holds '\\udc00', half of a character"),
        ('{"cfg": {"\\ud83d": 1}}', "'cfg.\\ud83d' holds '\\ud83d'"),
    ],
)
def test_bad_metrics_files(tmp_path, content, message):
    path = tmp_path / "m.json"
    path.write_text(content)
    with pytest.raises(MetricsError) as exc:
        read_metrics(path, "step-2")
    assert "step-2" in str(exc.value) and str(path) in str(exc.value) and message in str(exc.value)


def test_bad_metrics_is_an_error_verdict_and_the_step_is_not_done(tmp_path):
    out, _ = _run(tmp_path, [StepSpec("step-1", 'echo \'{"a": [1]}\' > $RUNBOOK_METRICS')])
    assert out.stopped == "error" and "step-1 wrote bad metrics" in out.reason
    assert out.results[0].exit_code == 0 and out.results[0].metrics_error and not out.results[0].completed


def test_metrics_values_bools_strings_nested_and_non_finite(tmp_path):
    path = tmp_path / "m.json"
    path.write_text('{"ok": true, "bad": false, "optimizer": "adamw", "cfg": {"lr": 0.001, "sched": {"warmup": 10}},'
                    ' "loss": NaN, "up": Infinity, "down": -Infinity, "big": 123456789012345678901234567890}')
    got = read_metrics(path, "step-1")
    assert got["ok"] == 1.0 and got["bad"] == 0.0 and got["optimizer"] == "adamw"
    assert got["cfg.lr"] == 0.001 and got["cfg.sched.warmup"] == 10.0 and got["big"] == 1.2345678901234568e29
    assert got["loss"] != got["loss"] and got["up"] == float("inf") and got["down"] == float("-inf")
    # recorded in a run record as valid JSON, and read back the same
    record = StepResult(step_id="step-1", command="", metrics=got)
    text = record.model_dump_json()
    assert "NaN" in text and json.loads(text)["metrics"]["loss"] == "NaN"
    back = StepResult.model_validate_json(text).metrics
    assert back["loss"] != back["loss"] and back["up"] == float("inf") and back["optimizer"] == "adamw"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_metrics_file_that_is_not_a_file_is_refused_at_once(tmp_path, kind):
    path = H.special_file(tmp_path / "m.json", kind)
    t0 = time.monotonic()
    with pytest.raises(MetricsError, match="not a regular file"):
        read_metrics(path, "step-1")
    assert time.monotonic() - t0 < 2


def test_merge_later_wins():
    results = [StepResult(step_id="step-1", command="", metrics={"a": 1}), StepResult(step_id="step-2", command="", metrics={"a": 2, "b": 3})]
    assert merge_metrics(results) == {"a": 2, "b": 3, "step-1.a": 1, "step-2.a": 2, "step-2.b": 3}
    assert json.dumps(merge_metrics([]))  == "{}"
