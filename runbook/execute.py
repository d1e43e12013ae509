"""Run a phase's steps as subprocesses, and judge the phase from the metrics they wrote.

Each step is `bash -c COMMAND` in its own process group (its own session), with the repository
root as cwd, stdin from /dev/null, and the directory of runbook's interpreter first on PATH (so
`eagle` in a step is the one installed beside `runbook`). Its output (stdout and stderr together)
is streamed live to `echo` and to `state/runs/<run>/<step-id>.log`. Environment:

- RUNBOOK_RUN_ID, RUNBOOK_PHASE, RUNBOOK_STEP;
- RUNBOOK_ARTIFACTS: `state/runs/<run>/artifacts/`, a directory for the run's files;
- RUNBOOK_METRICS: `state/runs/<run>/<step-id>.metrics.json`, a fresh file holding `{}`; the step
  may replace it with a flat JSON object of numbers.

A step whose shell exits non-zero stops the phase (`error`). The phase's Timeout, and SIGINT,
SIGTERM or SIGHUP to runbook, terminate the whole process group of the running step (SIGTERM, then
SIGKILL after a grace period) and stop the phase as `timeout` / `interrupted`. When a step's shell
exits, anything it left running in its process group is terminated too: steps do not leave
daemons behind.

Verdicts: a stopped phase keeps its stop verdict. Otherwise the steps' metrics are merged in step
order (a later step's value wins; each value is also kept as `<step-id>.<name>`) and the `Pass:`
criterion decides pass / fail, or `inconclusive` when it names a metric no step wrote. A phase
without `Pass:` passes when all its steps exit 0.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from runbook.ledger import iso, run_dir, tail_lines, utc_now
from runbook.model import StepResult

KILL_GRACE_S = 5.0
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class MetricsError(Exception):
    """A step's metrics file is not a flat JSON object of numbers."""


@dataclass
class StepSpec:
    """One step to run: its id, its command with vars resolved, and whether it is already done."""

    step_id: str
    command: str
    skip: bool = False  # done in an earlier run of this phase: not run again
    carried_metrics: dict[str, float] = field(default_factory=dict)  # its metrics from that run


@dataclass
class StepsOutcome:
    results: list[StepResult]
    stopped: str | None = None  # "error" | "timeout" | "interrupted" when the phase stopped early
    reason: str = ""


class Interrupts:
    """Turn SIGINT / SIGTERM / SIGHUP into a flag while the block runs (main thread only).

    The running step's process group is then terminated by `run_steps`, and the run is still
    judged, recorded and committed before runbook exits. A second signal makes the kill immediate.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0
        self._old: dict[int, object] = {}

    def _handle(self, signum: int, _frame: object) -> None:
        self.count += 1
        if self.signum is None:
            self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def __enter__(self) -> Interrupts:
        for sig in _SIGNALS:
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]


def read_metrics(path: Path, step_id: str) -> dict[str, float]:
    """The metrics a step wrote; raises MetricsError naming the step and the file."""
    where = f"{step_id} wrote bad metrics to {path}"
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}  # the step removed the file: it reports nothing
    except (OSError, UnicodeDecodeError) as exc:
        raise MetricsError(f"{where}: {exc}") from exc
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise MetricsError(f"{where}: not JSON ({exc}); write a flat object like {{\"loss\": 1.5}}") from exc
    if not isinstance(data, dict):
        raise MetricsError(f"{where}: expected a JSON object of numbers, got {type(data).__name__}")
    metrics: dict[str, float] = {}
    for name, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MetricsError(f"{where}: {name!r} is {json.dumps(value)[:60]}, not a number")
        if not math.isfinite(value):
            raise MetricsError(f"{where}: {name!r} is {value}, not a finite number")
        metrics[str(name)] = float(value)
    return metrics


def step_env(
    base: dict[str, str], *, run_id: str, phase_id: str, step_id: str, artifacts: Path, metrics: Path
) -> dict[str, str]:
    env = dict(base)
    bindir = str(Path(sys.executable).parent)
    rest = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and p != bindir]
    env["PATH"] = os.pathsep.join([bindir, *rest])
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(
        RUNBOOK_RUN_ID=run_id,
        RUNBOOK_PHASE=phase_id,
        RUNBOOK_STEP=step_id,
        RUNBOOK_ARTIFACTS=str(artifacts),
        RUNBOOK_METRICS=str(metrics),
    )
    return env


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class _Echo:
    """Write to the terminal unless it went away (SIGHUP, closed pipe)."""

    def __init__(self, stream: BinaryIO | None) -> None:
        self.stream = stream

    def write(self, data: bytes) -> None:
        if self.stream is None:
            return
        try:
            self.stream.write(data)
            self.stream.flush()
        except (OSError, ValueError):
            self.stream = None


def _run_one(
    spec: StepSpec,
    *,
    env: dict[str, str],
    cwd: Path,
    log_path: Path,
    echo: _Echo,
    deadline: float | None,
    interrupts: Interrupts | None,
    on_pgid: Callable[[int | None], None],
    grace_s: float,
) -> tuple[int | None, str | None]:
    """Run one step; returns (exit code, stop cause or None)."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            ["bash", "-c", spec.command],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        pgid = proc.pid
        on_pgid(pgid)
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        cause: str | None = None
        killed_at: float | None = None
        hard_sent = False
        exited_at: float | None = None
        eof = False
        try:
            while True:
                now = time.monotonic()
                if cause is None:
                    if interrupts is not None and interrupts.signum is not None:
                        cause = "interrupted"
                    elif deadline is not None and now >= deadline:
                        cause = "timeout"
                    if cause is not None:
                        killed_at = now
                        _signal_group(pgid, signal.SIGTERM)
                if killed_at is not None and not hard_sent:
                    if now - killed_at >= grace_s or (interrupts is not None and interrupts.count > 1):
                        _signal_group(pgid, signal.SIGKILL)
                        hard_sent = True
                if exited_at is None and proc.poll() is not None:
                    exited_at = now
                    # the shell is done: whatever it left in its group goes too
                    _signal_group(pgid, signal.SIGTERM)
                elif exited_at is not None and now - exited_at > grace_s and not hard_sent:
                    _signal_group(pgid, signal.SIGKILL)
                    hard_sent = True
                if eof:
                    if exited_at is not None:
                        break
                    time.sleep(0.05)
                    continue
                try:
                    ready, _, _ = select.select([fd], [], [], 0.1)
                except InterruptedError:
                    continue
                if ready:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        eof = True
                    else:
                        log.write(chunk)
                        log.flush()
                        echo.write(chunk)
                elif exited_at is not None and now - exited_at > grace_s + 1.0:
                    break  # something outside the group holds the pipe open: stop reading
        finally:
            if proc.poll() is None:
                _signal_group(pgid, signal.SIGKILL)  # leaving early (an exception): take it down
            proc.stdout.close()
            code = proc.wait()
            _signal_group(pgid, signal.SIGKILL)  # nothing of this step survives it
            on_pgid(None)
    return code, cause


def run_steps(
    steps: list[StepSpec],
    *,
    run_id: str,
    phase_id: str,
    repo_root: Path,
    state_dir: Path,
    timeout_s: float | None = None,
    echo: BinaryIO | None = None,
    announce: Callable[[StepSpec], None] | None = None,
    on_pgid: Callable[[int | None], None] | None = None,
    interrupts: Interrupts | None = None,
    grace_s: float = KILL_GRACE_S,
    base_env: dict[str, str] | None = None,
) -> StepsOutcome:
    """Run the steps in order; stop at the first error, timeout or interrupt."""
    folder = run_dir(state_dir, run_id)
    artifacts = folder / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    out = _Echo(echo)
    deadline = time.monotonic() + timeout_s if timeout_s else None
    results: list[StepResult] = []
    env0 = dict(os.environ if base_env is None else base_env)

    for spec in steps:
        if spec.skip:
            results.append(
                StepResult(step_id=spec.step_id, command=spec.command, skipped=True, metrics=spec.carried_metrics)
            )
            continue
        if interrupts is not None and interrupts.signum is not None:
            return StepsOutcome(results, "interrupted", f"{interrupts.name} before {spec.step_id} started")
        if deadline is not None and time.monotonic() >= deadline:
            return StepsOutcome(results, "timeout", f"phase timeout ({timeout_s:g}s) before {spec.step_id}")
        if announce is not None:
            announce(spec)
        log_path = folder / f"{spec.step_id}.log"
        metrics_path = folder / f"{spec.step_id}.metrics.json"
        metrics_path.write_text("{}\n", encoding="utf-8")
        env = step_env(
            env0, run_id=run_id, phase_id=phase_id, step_id=spec.step_id, artifacts=artifacts, metrics=metrics_path
        )
        started = utc_now()
        t0 = time.monotonic()
        code, cause = _run_one(
            spec,
            env=env,
            cwd=repo_root,
            log_path=log_path,
            echo=out,
            deadline=deadline,
            interrupts=interrupts,
            on_pgid=on_pgid or (lambda _pgid: None),
            grace_s=grace_s,
        )
        result = StepResult(
            step_id=spec.step_id,
            command=spec.command,
            exit_code=code,
            started=iso(started),
            finished=iso(utc_now()),
            duration_s=round(time.monotonic() - t0, 3),
            log_path=_rel(log_path, repo_root),
            log_tail=tail_lines(log_path),
        )
        results.append(result)
        try:
            result.metrics = read_metrics(metrics_path, spec.step_id)
        except MetricsError as exc:
            if cause is None and code == 0:
                return StepsOutcome(results, "error", str(exc))
        if cause == "interrupted":
            name = interrupts.name if interrupts is not None else "signal"
            return StepsOutcome(results, cause, f"{name} during {spec.step_id}; its process group was killed")
        if cause == "timeout":
            return StepsOutcome(
                results, cause, f"phase timeout ({timeout_s:g}s) during {spec.step_id}; its process group was killed"
            )
        if code != 0:
            how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited {code}"
            return StepsOutcome(results, "error", f"{spec.step_id} {how} (log: {result.log_path})")
    return StepsOutcome(results)


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def merge_metrics(results: list[StepResult]) -> dict[str, float]:
    """Merge in step order: a later step's value wins; each is also kept as `<step-id>.<name>`."""
    merged: dict[str, float] = {}
    qualified: dict[str, float] = {}
    for result in results:
        for name, value in result.metrics.items():
            merged[name] = value
            qualified[f"{result.step_id}.{name}"] = value
    merged.update(qualified)
    return merged


def judge(criterion_expr: object | None, metrics: dict[str, float]) -> tuple[str, str]:
    """Verdict and one-line reason for a phase whose steps all exited 0."""
    if criterion_expr is None:
        return "pass", "all steps exited 0 (no Pass: criterion)"
    from runbook.criteria import evaluate

    judgement = evaluate(criterion_expr, metrics)
    verdict = judgement.verdict
    reason = judgement.explanation
    if verdict == "inconclusive" and getattr(judgement, "missing", None):
        missing = ", ".join(judgement.missing)
        reason = f"no step wrote {missing}" + (f" ({reason})" if reason else "")
    return verdict, reason
