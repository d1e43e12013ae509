"""Run a phase's steps as subprocesses, and judge the phase from the metrics they wrote.

Each step is `bash -c COMMAND` in its own process group (its own session), with the repository
root as cwd, stdin from /dev/null. The user's PATH is kept in its order; the directory of
runbook's interpreter (where `eagle` is installed beside `runbook`) is added at its end only when
PATH lacks it, so a step finds `eagle` without shadowing the user's virtualenv, and a virtualenv
that holds runbook and comes first on PATH (activated) stays first: its `python` is the step's.
`runbook_bin = "prepend"` in runbook.toml puts it first, `"off"` leaves PATH alone. Output (stdout and stderr together) is
streamed live to `echo` and to `state/runs/<run>/<step-id>.log`. Environment:

- RUNBOOK_RUN_ID, RUNBOOK_PHASE, RUNBOOK_STEP;
- RUNBOOK_ARTIFACTS: `state/runs/<run>/artifacts/`, a directory for the run's files;
- RUNBOOK_METRICS: `state/runs/<run>/<step-id>.metrics.json`, a fresh file holding `{}`; the step
  may replace it with a JSON object (`read_metrics` says what it may hold);
- RUNBOOK_SERIES: `state/runs/<run>/<step-id>.series.jsonl`, not there when the step starts; the
  step may append JSON lines `{"step": N, "name": value, ...}` (metric series, runbook/store/series.py).

A step whose shell exits non-zero stops the phase (`error`); so does a step whose metrics file is
rejected (that step is recorded with `metrics_error` and is not ticked, so a resume re-runs it).
The phase's Timeout, and SIGINT, SIGTERM or SIGHUP to runbook, terminate the whole process group
of the running step (SIGTERM, then SIGKILL after a grace period) and stop the phase as `timeout` /
`interrupted`. When a step's shell exits, anything it left running is terminated too: its process
group, and processes that left the group (`setsid`, daemons) but provably belong to the step
(their environment carries the step's own RUNBOOK_METRICS path; runbook/store/procs.py).

Verdicts: a stopped phase keeps its stop verdict. Otherwise the steps' metrics are merged in step
order (a later step's value wins; each value is also kept as `<step-id>.<name>`) and the `Pass:`
criterion decides pass / fail, or `inconclusive` when it names a metric no step wrote (the reason
lists what was written, with a "did you mean", and notices JSON printed to stdout instead of the
metrics file). A phase without `Pass:` passes when all its steps exit 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from runbook.files import NotReadable, half_character, read_bounded
from runbook.formatting import iso, utc_now
from runbook.model import Expr, Metrics, StepResult
from runbook.redact import redact_credentials
from runbook.run.executor import KILL_GRACE_S, Interrupts, StepContext, StepsOutcome, StepSpec, stop_cause
from runbook.store import procs
from runbook.store.ledger import run_dir, tail_lines


class MetricsError(Exception):
    """A step's metrics file cannot be used; the message names the step, the file and the fix."""


METRICS_MAX_BYTES = 1 << 20  # a metrics file is a small JSON object
METRICS_MAX_COUNT = 1000
METRIC_STRING_MAX = 1000
_DIGITS_MAX = 300  # an integer longer than this is not a measurement


class _NotANumber(ValueError):
    pass


def _parse_int(text: str) -> float:
    if len(text.lstrip("-")) > _DIGITS_MAX:
        raise _NotANumber(f"an integer of {len(text.lstrip('-'))} digits")
    return float(text)


def read_metrics(path: Path, step_id: str) -> Metrics:
    """The metrics a step wrote; raises MetricsError naming the step, the file and the fix.

    The file holds one JSON object. Numbers are metrics (NaN and infinities too: they fail every
    comparison); `true` / `false` count as 1 / 0; a string is kept as a string (short values such
    as `"adamw"`, usable with `==`); a nested object flattens to dotted names (`{"cfg": {"lr": 1}}`
    gives `cfg.lr`). Lists, nulls, integers of hundreds of digits, more than 1,000 metrics, names or
    strings holding half of a character (a lone `\\udXXX` escape), and a file that is not a regular
    file of at most 1 MiB (a FIFO, `/dev/zero`) are refused.
    """
    where = f"{step_id} wrote bad metrics to {path}"
    try:
        data = read_bounded(path, METRICS_MAX_BYTES)
    except FileNotFoundError:
        return {}  # the step removed the file: it reports nothing
    except NotReadable as exc:
        raise MetricsError(f"{where}: {exc}; write a JSON object into the file") from None
    except OSError as exc:
        raise MetricsError(f"{where}: {exc.strerror or exc}") from None
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MetricsError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    if not raw.strip():
        return {}
    try:
        parsed = json.loads(raw, parse_int=_parse_int)
    except _NotANumber as exc:
        raise MetricsError(f"{where}: {exc} is not a number a metric can hold") from None
    except ValueError as exc:  # JSONDecodeError
        raise MetricsError(f"{where}: not JSON ({exc}); write an object like {{\"loss\": 1.5}}") from None
    except RecursionError:
        raise MetricsError(f"{where}: nested too deeply; write an object like {{\"loss\": 1.5}}") from None
    if not isinstance(parsed, dict):
        raise MetricsError(f"{where}: expected a JSON object of metrics, got {_json_type(parsed)}")
    metrics: Metrics = {}
    _flatten("", parsed, metrics, where, 0)
    return metrics


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _flatten(prefix: str, data: dict[str, Any], out: Metrics, where: str, depth: int) -> None:
    if depth > 16:
        raise MetricsError(f"{where}: objects nested more than 16 deep at {prefix!r}")
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            _flatten(name, value, out, where, depth + 1)
            continue
        if len(out) >= METRICS_MAX_COUNT:
            raise MetricsError(f"{where}: more than {METRICS_MAX_COUNT} metrics; keep the summary numbers there")
        if len(name) > 200:
            raise MetricsError(f"{where}: a metric name of {len(name)} characters ({name[:40]!r}...)")
        _whole_characters(name, name, where)
        if isinstance(value, bool):
            out[name] = 1.0 if value else 0.0
        elif isinstance(value, (int, float)):
            out[name] = float(value)
        elif isinstance(value, str):
            if len(value) > METRIC_STRING_MAX:
                raise MetricsError(
                    f"{where}: {name!r} is a string of {len(value)} characters; a metric string holds at "
                    f"most {METRIC_STRING_MAX} (put long text in $RUNBOOK_ARTIFACTS)"
                )
            _whole_characters(value, name, where)
            out[name] = value
        elif isinstance(value, list):
            raise MetricsError(
                f"{where}: {name!r} is a list; metrics are numbers or strings: write {name}_0, {name}_1, ... "
                "or an object"
            )
        else:
            raise MetricsError(f"{where}: {name!r} is null; leave it out, or write a number or a string")


def _whole_characters(text: str, name: str, where: str) -> None:
    """Refuse a lone surrogate: the run record that keeps the metric could not be written."""
    half = half_character(text)
    if half is not None:
        raise MetricsError(
            f"{where}: {name!r} holds {half!r}, half of a character (a \\u escape without its pair); "
            "write whole characters, e.g. json.dumps's own output"
        )


def step_env(
    base: dict[str, str],
    *,
    run_id: str,
    phase_id: str,
    step_id: str,
    artifacts: Path,
    metrics: Path,
    bin_path: str = "append",
) -> dict[str, str]:
    """The step's environment. `bin_path`: where runbook's interpreter directory goes on PATH
    ("append": at the end when PATH lacks it, the user's order untouched; "prepend": first; "off":
    not added)."""
    env = dict(base)
    bindir = str(Path(sys.executable).parent)
    path = env.get("PATH", os.defpath)
    entries = path.split(os.pathsep)
    if bin_path == "prepend":
        rest = [p for p in entries if p and not _same_dir(p, bindir)]
        env["PATH"] = os.pathsep.join([bindir, *rest])
    elif bin_path == "append" and not any(p and _same_dir(p, bindir) for p in entries):
        env["PATH"] = os.pathsep.join([*(p for p in entries if p), bindir])
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(
        RUNBOOK_RUN_ID=run_id,
        RUNBOOK_PHASE=phase_id,
        RUNBOOK_STEP=step_id,
        RUNBOOK_ARTIFACTS=str(artifacts),
        RUNBOOK_METRICS=str(metrics),
        RUNBOOK_SERIES=str(metrics.with_name(f"{step_id}.series.jsonl")),
    )
    return env


def _same_dir(entry: str, bindir: str) -> bool:
    """A PATH entry names `bindir` (as written, with a trailing slash, or through a link)."""
    if os.path.normpath(entry) == os.path.normpath(bindir):
        return True
    try:
        return os.path.realpath(entry) == os.path.realpath(bindir)
    except (OSError, ValueError):
        return False


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
    wall0 = time.time()
    proof = [f"RUNBOOK_METRICS={env['RUNBOOK_METRICS']}"]  # unique to this step of this run here

    def stop(sig: int) -> None:
        """Signal the step's group, and what left the group but provably is the step's (setsid)."""
        _signal_group(pgid, sig)
        procs.signal_proven(procs.proven_run_processes(env.get("RUNBOOK_RUN_ID"), env=proof, since=wall0), sig)

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
                    cause = stop_cause(interrupts, deadline, now)
                    if cause is not None:
                        killed_at = now
                        stop(signal.SIGTERM)
                if killed_at is not None and not hard_sent:
                    if now - killed_at >= grace_s or (interrupts is not None and interrupts.count > 1):
                        stop(signal.SIGKILL)
                        hard_sent = True
                if exited_at is None and proc.poll() is not None:
                    exited_at = now
                    # the shell is done: whatever it left behind goes too
                    stop(signal.SIGTERM)
                elif exited_at is not None and now - exited_at > grace_s and not hard_sent:
                    stop(signal.SIGKILL)
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
            stop(signal.SIGKILL)  # nothing of this step survives it
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
    bin_path: str | None = None,
    on_result: Callable[[StepResult], None] | None = None,
) -> StepsOutcome:
    """Run the steps in order; stop at the first error, timeout, interrupt or rejected metrics.

    `bin_path`: where runbook's interpreter directory goes on the steps' PATH (see `step_env`);
    None reads `runbook_bin` from the repository's config. `on_result` is told each step's result
    as soon as it is known (runbook/store/live.py keeps it)."""
    if bin_path is None:
        bin_path = _configured_bin_path(repo_root)
    told = on_result or (lambda _result: None)
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
                StepResult(step_id=spec.step_id, command=redact_credentials(spec.command), skipped=True,
                           metrics=spec.carried_metrics)
            )
            told(results[-1])
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
            env0, run_id=run_id, phase_id=phase_id, step_id=spec.step_id, artifacts=artifacts, metrics=metrics_path,
            bin_path=bin_path,
        )
        Path(env["RUNBOOK_SERIES"]).unlink(missing_ok=True)  # a fresh series file for this step
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
            command=redact_credentials(spec.command),  # the record is committed: no URL passwords
            exit_code=code,
            started=iso(started),
            finished=iso(utc_now()),
            duration_s=round(time.monotonic() - t0, 3),
            log_path=_rel(log_path, repo_root),
            log_tail=[redact_credentials(line) for line in tail_lines(log_path)],
        )
        results.append(result)
        try:
            result.metrics = read_metrics(metrics_path, spec.step_id)
        except MetricsError as exc:
            result.metrics_error = str(exc)  # not ticked: a resume runs this step again
            if cause is None and code == 0:
                told(result)
                return StepsOutcome(results, "error", str(exc))
        told(result)
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


def _configured_bin_path(root: Path) -> str:
    from runbook.store.project import ConfigError, load_config

    try:
        return load_config(root).runbook_bin
    except ConfigError:
        return "append"


def judge(
    criterion_expr: Expr | None, metrics: Metrics, results: list[StepResult] | None = None,
    ref_missing: dict[str, str] | None = None,
) -> tuple[str, str]:
    """Verdict and one-line reason for a phase whose steps all exited 0.

    When the criterion names a metric no step wrote (`inconclusive`), the reason says what the
    steps did write, with a "did you mean", and, given `results`, notices a step that printed a
    JSON object to its output instead of writing it to $RUNBOOK_METRICS. `ref_missing`: why a
    reference to another phase's metric (runbook/plan/crossref.py) has no value."""
    if criterion_expr is None:
        return "pass", "all steps exited 0 (no Pass: criterion)"
    from runbook.plan.criteria import evaluate

    judgement = evaluate(criterion_expr, metrics)
    verdict = judgement.verdict
    reason = judgement.explanation
    if verdict == "inconclusive" and getattr(judgement, "missing", None):
        refs = ref_missing or {}
        own = [name for name in judgement.missing if name not in refs]
        parts = [f"no step wrote {', '.join(own)}"] if own else []
        parts += [refs[name] for name in judgement.missing if name in refs]
        reason = "; ".join(parts) + (f" ({reason})" if reason else "")
        if own:
            reason += missing_metrics_hint(own, metrics, results or [])
    return verdict, reason


def missing_metrics_hint(missing: list[str], metrics: Metrics, results: list[StepResult]) -> str:
    """"; did you mean ...? the steps wrote ..." and a stdout-instead-of-metrics-file notice."""
    import difflib

    written = [name for name in metrics if not any(name.startswith(f"{r.step_id}.") for r in results)] or [
        name for name in metrics if "." not in name
    ]
    parts: list[str] = []
    guesses = []
    for name in missing:
        close = difflib.get_close_matches(name, written, n=1, cutoff=0.6)
        if close:
            guesses.append(f"{close[0]} for {name}")
    if guesses:
        parts.append("did you mean " + ", ".join(guesses) + "?")
    for name in missing:  # `a-b` is one name: subtraction needs spaces
        pieces = name.split("-")
        if len(pieces) > 1 and all(piece in metrics for piece in pieces):
            parts.append(f"`{name}` is one name; to subtract, write `{' - '.join(pieces)}`")
    if written:
        shown = ", ".join(written[:12]) + (f" and {len(written) - 12} more" if len(written) > 12 else "")
        parts.append(f"the steps wrote {shown}")
    else:
        parts.append("the steps wrote no metrics")
    for result in results:
        if result.metrics or result.skipped:
            continue
        printed = _printed_json(result.log_tail)
        if printed:
            parts.append(
                f"{result.step_id} printed {printed} to its output but wrote nothing to $RUNBOOK_METRICS; "
                "write it there: ... > \"$RUNBOOK_METRICS\""
            )
            break
    return "; " + "; ".join(parts)


def _printed_json(lines: list[str]) -> str | None:
    """A JSON object of metrics printed on one of `lines` (the last one), shortened; else None."""
    for line in reversed(lines):
        text = line.strip()
        if not (text.startswith("{") and text.endswith("}")):
            continue
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            continue
        if isinstance(data, dict) and data:
            return text if len(text) <= 80 else text[:77] + "..."
    return None


class LocalExecutor:
    """Each step a `bash -c` subprocess in its own process group, here (`run_steps`)."""

    name = "local"

    def run_steps(self, steps: list[StepSpec], ctx: StepContext) -> StepsOutcome:
        return run_steps(
            steps, run_id=ctx.run_id, phase_id=ctx.phase_id, repo_root=ctx.repo_root, state_dir=ctx.state_dir,
            timeout_s=ctx.timeout_s, echo=ctx.echo, announce=ctx.hooks.announce, on_pgid=ctx.hooks.on_pgid,
            on_result=ctx.hooks.on_result, interrupts=ctx.interrupts, grace_s=ctx.grace_s, bin_path=ctx.bin_path,
        )
