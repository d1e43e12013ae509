"""The Slurm executor: each step of a phase with `Executor: slurm` is one `sbatch` job.

Why one job per step (not the phase's steps as one job script): a step is runbook's unit of
everything else — its own log, exit code, `$RUNBOOK_METRICS` file, checkbox and resume point — so
one job per step keeps each of those exact (a failed step 3 resumes at step 3 without redoing
steps 1-2 inside a new allocation), and a re-attached run knows which step its job is. The cost
is a queue wait per step: put quick local chores (downloads, checks) in a local phase.

What it assumes about the cluster (docs/next.md says the same):
- the Slurm client commands (`sbatch`, `squeue`, `scontrol`, `scancel`) are on PATH where runbook
  runs, and talk to the cluster (SLURM_CONF, munge) without further options;
- the repository (and so `state/`) is on a filesystem the compute nodes share at the same path:
  the job runs with the repository root as its working directory, writes its output straight
  into the step log `state/runs/<run>/<step>.log` (`--output`, append) and its metrics into
  `$RUNBOOK_METRICS`, and runbook reads both from where it runs;
- the job gets runbook's environment (`--export=ALL`: RUNBOOK_RUN_ID, RUNBOOK_STEP,
  RUNBOOK_METRICS, ..., PATH with runbook's interpreter directory on it), so the compute node
  needs the same virtual environment at the same path;
- accounting may be off: runbook polls `squeue -h -j ID -o %T` while the job is queued or
  running, then reads its final state and exit code from `scontrol show job -o ID`. When the
  controller has already forgotten the job (MinJobAge), the exit code the job script wrote to
  `state/runs/<run>/<step>.exit` decides; `sacct` is never needed.

The job script (`state/runs/<run>/<step>.sbatch`) runs the step's command with `bash -c`, as the
local executor does, and writes its exit code beside the log. The job is named
`runbook-<run-id>-<step-id>`: that name is runbook's proof that a job is this run's before it
cancels one it did not submit in this process (a re-attached run).

States: COMPLETED with exit 0 -> the step succeeded; FAILED, OUT_OF_MEMORY, NODE_FAIL,
BOOT_FAIL -> `error` (with the log's tail); TIMEOUT, DEADLINE -> `timeout`; CANCELLED, PREEMPTED
-> `interrupted`. A phase `Timeout:` (or a signal to runbook, or `runbook cancel`) scancels the
job and waits until squeue no longer lists it.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from runbook.files import NotReadable, open_regular, read_bounded
from runbook.formatting import iso, utc_now
from runbook.model import StepResult
from runbook.redact import redact_credentials
from runbook.run.executor import StepContext, StepsOutcome, StepSpec, stop_cause
from runbook.run.local import MetricsError, _Echo, _rel, read_metrics, step_env
from runbook.store.ledger import run_dir, tail_lines
from runbook.store.live import seconds_from_env

__all__ = ["JobInfo", "SlurmError", "SlurmExecutor", "cancel_job", "find_job", "job_info", "job_name", "verdict_of"]

COMMAND_TIMEOUT_S = 60.0
# squeue's words for a job that is not finished yet
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
          "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
# final state -> verdict of the step (None: it succeeded when its exit code is 0)
VERDICTS: dict[str, str | None] = {
    "COMPLETED": None,
    "FAILED": "error",
    "OUT_OF_MEMORY": "error",
    "NODE_FAIL": "error",
    "BOOT_FAIL": "error",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "CANCELLED": "interrupted",
    "PREEMPTED": "interrupted",
}
_WHY = {
    "FAILED": "failed",
    "OUT_OF_MEMORY": "ran out of memory (OUT_OF_MEMORY)",
    "NODE_FAIL": "lost its node (NODE_FAIL)",
    "BOOT_FAIL": "could not boot its node (BOOT_FAIL)",
    "TIMEOUT": "hit its Slurm time limit (TIMEOUT)",
    "DEADLINE": "hit its deadline (DEADLINE)",
    "CANCELLED": "was cancelled outside runbook (CANCELLED)",
    "PREEMPTED": "was preempted (PREEMPTED)",
}


class SlurmError(Exception):
    """A Slurm command failed; the message names the command and what it said."""


@dataclass
class JobInfo:
    job_id: str
    state: str  # the base state word, e.g. RUNNING, COMPLETED, TIMEOUT
    exit_code: int | None = None
    signal: int | None = None
    name: str | None = None
    reason: str | None = None


def job_name(run_id: str, step_id: str) -> str:
    return f"runbook-{run_id}-{step_id}"


def poll_interval(config_poll_s: float) -> float:
    """$RUNBOOK_SLURM_POLL_S (tests) over runbook.toml's `[slurm] poll_s`."""
    return seconds_from_env("RUNBOOK_SLURM_POLL_S", config_poll_s)


def _run(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0], path=(env or os.environ).get("PATH")) is None:
        raise SlurmError(f"`{argv[0]}` not found on PATH: `Executor: slurm` needs the Slurm client commands "
                         "(sbatch, squeue, scontrol, scancel) where runbook runs")
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=COMMAND_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{shlex.join(argv)}` did not answer within {COMMAND_TIMEOUT_S:g}s") from None
    except OSError as exc:
        raise SlurmError(f"`{shlex.join(argv)}`: {exc.strerror or exc}") from None


def _said(proc: subprocess.CompletedProcess[str]) -> str:
    return " ".join((proc.stderr or proc.stdout or "").split())[:300] or f"exit {proc.returncode}"


def submit(script: Path, args: list[str], env: dict[str, str], cwd: Path) -> str:
    """`sbatch --parsable ARGS SCRIPT`; the job id."""
    argv = ["sbatch", "--parsable", *args, str(script)]
    proc = _run(argv, env=env, cwd=cwd)
    out = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not out or not re.fullmatch(r"[0-9]+(;\S+)?", out[-1].strip()):
        raise SlurmError(f"sbatch refused the job: {_said(proc)}")
    return out[-1].strip().split(";")[0]


def queue_state(job_id: str) -> str | None:
    """The job's state while squeue lists it (PENDING, RUNNING, COMPLETING, ...); None once it does not."""
    proc = _run(["squeue", "-h", "-j", job_id, "-o", "%T"])
    if proc.returncode != 0:
        if "invalid job id" in (proc.stderr or "").lower():
            return None
        raise SlurmError(f"squeue -j {job_id}: {_said(proc)}")
    words = proc.stdout.split()
    return words[0].upper() if words else None


def job_info(job_id: str) -> JobInfo | None:
    """`scontrol show job -o ID` as data; None when the controller no longer knows the job."""
    proc = _run(["scontrol", "show", "job", "-o", job_id])
    if proc.returncode != 0 or not proc.stdout.strip():
        if "invalid job id" in (proc.stderr or proc.stdout or "").lower():
            return None
        raise SlurmError(f"scontrol show job {job_id}: {_said(proc)}")
    return parse_job(job_id, proc.stdout)


def parse_job(job_id: str, text: str) -> JobInfo:
    def field(name: str) -> str | None:
        m = re.search(rf"(?:^|\s){name}=(\S*)", text)
        return m.group(1) if m else None

    state = (field("JobState") or "UNKNOWN").upper()
    exit_code = sig = None
    raw = field("ExitCode")
    if raw and re.fullmatch(r"\d+:\d+", raw):
        code, s = raw.split(":")
        exit_code, sig = int(code), int(s)
    return JobInfo(job_id=job_id, state=state, exit_code=exit_code, signal=sig or None, name=field("JobName"),
                   reason=field("Reason"))


def find_job(name: str) -> str | None:
    """The id of a job squeue lists under `name` (the newest), or None."""
    proc = _run(["squeue", "-h", "-n", name, "-o", "%i"])
    if proc.returncode != 0:
        return None
    ids = [w for w in proc.stdout.split() if w.isdigit()]
    return max(ids, key=int) if ids else None


def cancel_job(job_id: str, name: str) -> str:
    """scancel a job that is provably this run's (its name is `name`); a sentence saying what happened."""
    try:
        info = job_info(job_id)
    except SlurmError as exc:
        return f"could not look at Slurm job {job_id} ({exc}); left it alone"
    if info is None:
        return f"Slurm job {job_id} is already gone"
    if info.name != name:
        return f"left Slurm job {job_id} alone: its name is {info.name!r}, not {name!r}"
    if info.state not in ACTIVE:
        return f"Slurm job {job_id} had already ended ({info.state})"
    proc = _run(["scancel", job_id])
    if proc.returncode != 0:
        return f"scancel {job_id} failed: {_said(proc)}"
    return f"cancelled Slurm job {job_id} (scancel)"


def verdict_of(info: JobInfo | None, exit_marker: int | None) -> tuple[str | None, int | None, str]:
    """(step verdict or None for success, exit code, the job's final state word) of a finished job."""
    if info is None:
        if exit_marker is None:
            return "error", None, "UNKNOWN"
        return (None if exit_marker == 0 else "error"), exit_marker, "COMPLETED" if exit_marker == 0 else "FAILED"
    code = -info.signal if info.signal else info.exit_code
    if info.state == "COMPLETED":
        return (None if (code or 0) == 0 else "error"), code, info.state
    return VERDICTS.get(info.state, "error"), code, info.state


def _read_marker(path: Path) -> int | None:
    try:
        text = read_bounded(path, 64).decode("utf-8").strip()
    except (OSError, ValueError):  # UnicodeDecodeError, NotReadable
        return None
    return int(text) if re.fullmatch(r"-?\d{1,4}", text) else None


def _comment(text: str) -> str:
    """`text` as the rest of a `#` comment line: a newline in it (a path may hold one) continues the
    comment on a line of its own instead of starting a shell line."""
    return text.replace("\r", "\\r").replace("\n", "\n#   ")


def job_script(spec: StepSpec, run_id: str, phase_id: str, exit_path: Path, argv: list[str]) -> str:
    return (
        "#!/bin/bash\n"
        f"# Written by runbook for run {run_id}, {phase_id} {spec.step_id}; submitted as:\n"
        f"#   {_comment(shlex.join(argv))}\n"
        "# Its environment (RUNBOOK_* included) is the one sbatch was called with (--export=ALL).\n"
        "# The step's command (vars resolved) runs as the local executor runs it, with bash -c:\n"
        f"bash -c {shlex.quote(spec.command)}\n"
        "code=$?\n"
        f"echo \"$code\" > {shlex.quote(str(exit_path))}\n"
        "exit \"$code\"\n"
    )


class SlurmExecutor:
    name = "slurm"

    def run_steps(self, steps: list[StepSpec], ctx: StepContext) -> StepsOutcome:
        folder = run_dir(ctx.state_dir, ctx.run_id)
        artifacts = folder / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        out = _Echo(ctx.echo)
        remaining = ctx.timeout_s - ctx.elapsed_s if ctx.timeout_s else None
        deadline = time.monotonic() + remaining if remaining is not None else None
        results: list[StepResult] = []
        env0 = dict(os.environ)
        hooks = ctx.hooks

        for spec in steps:
            if spec.step_id in ctx.prior:
                results.append(ctx.prior[spec.step_id])
                continue
            if spec.skip:
                results.append(StepResult(step_id=spec.step_id, command=redact_credentials(spec.command),
                                          skipped=True, metrics=spec.carried_metrics))
                hooks.on_result(results[-1])
                continue
            interrupts = ctx.interrupts
            if interrupts is not None and interrupts.signum is not None:
                return StepsOutcome(results, "interrupted", f"{interrupts.name} before {spec.step_id} started")
            if deadline is not None and time.monotonic() >= deadline:
                return StepsOutcome(results, "timeout", f"phase timeout ({ctx.timeout_s:g}s) before {spec.step_id}")
            hooks.announce(spec)
            result, stop = self._one(spec, ctx, folder, artifacts, env0, out, deadline)
            results.append(result)
            hooks.on_result(result)
            if stop is not None:
                return StepsOutcome(results, stop[0], stop[1])
        return StepsOutcome(results)

    def _one(self, spec: StepSpec, ctx: StepContext, folder: Path, artifacts: Path, env0: dict[str, str],
             out: _Echo, deadline: float | None) -> tuple[StepResult, tuple[str, str] | None]:
        log_path = folder / f"{spec.step_id}.log"
        metrics_path = folder / f"{spec.step_id}.metrics.json"
        exit_path = folder / f"{spec.step_id}.exit"
        rel_log = _rel(log_path, ctx.repo_root)
        name = job_name(ctx.run_id, spec.step_id)
        started = utc_now()
        t0 = time.monotonic()
        attach = ctx.jobs.get(spec.step_id)
        offset = log_path.stat().st_size if log_path.exists() else 0

        def result(**extra: object) -> StepResult:
            return StepResult(step_id=spec.step_id, command=redact_credentials(spec.command), started=iso(started),
                              finished=iso(utc_now()), duration_s=round(time.monotonic() - t0, 3), log_path=rel_log,
                              log_tail=[redact_credentials(line) for line in tail_lines(log_path)],
                              **extra)

        try:
            if attach is not None:
                job_id = attach[0]
                offset = 0  # show what the job wrote while runbook was away
            else:
                metrics_path.write_text("{}\n", encoding="utf-8")
                exit_path.unlink(missing_ok=True)
                log_path.touch()
                env = step_env(env0, run_id=ctx.run_id, phase_id=ctx.phase_id, step_id=spec.step_id,
                               artifacts=artifacts, metrics=metrics_path, bin_path=ctx.bin_path)
                Path(env["RUNBOOK_SERIES"]).unlink(missing_ok=True)  # a fresh series file for this job
                args = [f"--job-name={name}", f"--output={log_path.resolve()}", "--open-mode=append",
                        f"--chdir={ctx.repo_root.resolve()}", "--export=ALL", *self._resource_args(ctx, deadline),
                        *ctx.sbatch_args]
                script = folder / f"{spec.step_id}.sbatch"
                script.write_text(job_script(spec, ctx.run_id, ctx.phase_id, exit_path.resolve(),
                                             ["sbatch", *args, str(script)]), encoding="utf-8")
                job_id = submit(script, args, env, ctx.repo_root)
                ctx.hooks.on_job(spec.step_id, job_id, name)
        except SlurmError as exc:
            return result(), ("error", f"{spec.step_id}: {exc}")

        cause, stop_note, info = self._wait(job_id, name, ctx, deadline, log_path, offset, out)
        verdict, code, state = verdict_of(info, _read_marker(exit_path))
        step = result(exit_code=code, job_id=job_id, job_state=state)
        try:
            step.metrics = read_metrics(metrics_path, spec.step_id)
        except MetricsError as exc:
            step.metrics_error = str(exc)  # not ticked: a resume runs this step again
            if cause is None and verdict is None:
                return step, ("error", str(exc))
        job = f"Slurm job {job_id}"
        if cause == "interrupted":
            signame = ctx.interrupts.name if ctx.interrupts is not None else "signal"
            return step, ("interrupted", f"{signame} during {spec.step_id}; {stop_note}")
        if cause == "timeout":
            return step, ("timeout", f"phase timeout ({ctx.timeout_s:g}s) during {spec.step_id}; {stop_note}")
        if verdict is None:
            return step, None
        if state == "UNKNOWN":
            why = f"{job} ({spec.step_id}) ended, but Slurm no longer knows how and its script left no exit code"
        elif state in ("FAILED", "COMPLETED"):
            why = f"{job} ({spec.step_id}) {state} with exit {code}"
        else:
            why = f"{job} ({spec.step_id}) {_WHY.get(state, state)}"
        return step, (verdict, f"{why} (log: {rel_log})")

    def _resource_args(self, ctx: StepContext, deadline: float | None) -> list[str]:
        from runbook.plan.resources import sbatch_args

        resources = dict(ctx.resources)
        if "time" not in resources and deadline is not None:
            left = max(deadline - time.monotonic(), 60.0)
            resources["time"] = str(math.ceil(left / 60))
        return sbatch_args(resources)

    def _wait(self, job_id: str, name: str, ctx: StepContext, deadline: float | None, log_path: Path, offset: int,
              out: _Echo) -> tuple[str | None, str, JobInfo | None]:
        """Poll until squeue no longer lists the job; stream its log. (cause, note, final info)."""
        interrupts = ctx.interrupts
        cause: str | None = None
        note = ""
        cancel_sent: float | None = None
        next_poll = 0.0
        failures = 0
        while True:
            offset = _stream(log_path, offset, out)
            now = time.monotonic()
            if cause is None:
                cause = stop_cause(interrupts, deadline, now)
                if cause is not None:
                    note = cancel_job(job_id, name)
                    cancel_sent = now
                    next_poll = 0.0
            if now >= next_poll:
                try:
                    state = queue_state(job_id)
                    failures = 0
                except SlurmError as exc:
                    failures += 1
                    state = "?"
                    if failures == 1:
                        out.write(f"runbook: {exc}; still polling\n".encode())
                if state is None:
                    break
                if cancel_sent is not None and now - cancel_sent > 120 + ctx.grace_s:
                    return cause, note + f"; it was still listed by squeue ({state}) {now - cancel_sent:.0f}s later", None
                next_poll = now + (min(ctx.poll_s, 0.5) if cancel_sent is not None else ctx.poll_s)
            time.sleep(0.1)
        _stream(log_path, offset, out)
        try:
            info = job_info(job_id)
        except SlurmError as exc:
            info = None
            note = f"{note}; {exc}" if note else str(exc)
        return cause, note, info


def _stream(path: Path, offset: int, out: _Echo) -> int:
    """Echo what the job appended to its log since `offset`; the new offset."""
    if out.stream is None:
        return offset
    try:
        with open_regular(path) as handle:
            handle.seek(offset)
            data = handle.read(1 << 20)
    except (OSError, NotReadable):
        return offset
    if data:
        out.write(data)
    return offset + len(data)
