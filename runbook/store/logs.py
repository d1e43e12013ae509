"""`runbook logs`: a step's output, from its log `state/runs/<run>/<step>.log`.

Which run: `--run RUN` (an id, a prefix, or `last`), else the run in progress (its live state,
runbook/store/live.py), else the plan's latest run in the ledger. Which step: `--step`, else the step
running now, else the last step that started. With `--follow` the log is followed as it grows;
when the run moves on to its next step the next step's log is followed (under a `── step-N ──`
line), and following ends when the run does (it was recorded, or its runbook died), with the
verdict when the ledger has it. Slurm steps write their job's output straight into the same log.
Logs are gitignored: where a recorded run's log is not on this machine (a fresh clone), the last
lines its run record keeps (`log_tail`) are shown instead, and `runbook logs` says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runbook.errors import RunbookError

if TYPE_CHECKING:
    from runbook.model import RunRecord
    from runbook.store.workspace import Workspace

__all__ = ["Located", "follow", "locate"]

FOLLOW_POLL_S = 0.2


@dataclass
class Located:
    run_id: str
    phase: str
    step: str
    log: Path  # absolute
    running: bool
    job_id: str | None = None
    kept: list[str] | None = None  # the log's last lines its run record keeps (a recorded run's step)

    def fallback(self) -> list[str] | None:
        """The lines the run record keeps when the log itself is not here (logs are gitignored: a
        fresh clone, another machine, removed logs) and the run has ended; None otherwise."""
        if self.running or self.kept is None or self.log.exists():
            return None
        return self.kept


def _step_of_record(record: RunRecord) -> str | None:
    started = [s for s in record.steps if not s.skipped and (s.started or s.log_path)]
    return started[-1].step_id if started else None


def locate(ws: Workspace, run_ref: str | None, step: str | None) -> Located:
    from runbook.store.ledger import run_dir
    from runbook.store.live import is_alive, live_runs

    lives = live_runs(ws.state, ws.plan_rel)
    live = None
    record = None
    if run_ref:
        from runbook.store.index import LAST_REF

        # a run in progress by its id or prefix; `last` / `last~N` count the recorded runs, as every verb's do
        live = None if LAST_REF.fullmatch(run_ref) else next(
            (x for x in lives if x.run_id == run_ref or x.run_id.startswith(run_ref)), None)
        if live is None:
            record = ws.find_run(run_ref)
    else:
        alive = [x for x in lives if is_alive(x) is not False]
        live = alive[-1] if alive else (lives[-1] if lives else None)
        if live is None:
            record = ws.ledger().last(ws.plan_rel)
            if record is None:
                raise RunbookError(f"no runs of {ws.plan_rel} yet: no log to show", "unknown_run",
                                   hint="start one with `runbook next`")
    if live is not None:
        run_id, phase = live.run_id, live.phase
        ids = [p.step_id for p in live.planned]
        current = live.step or (live.results[-1].step_id if live.results else None)
        running = is_alive(live) is not False
    else:
        assert record is not None
        run_id, phase = record.run_id, record.phase
        ids = [s.step_id for s in record.steps]
        current = _step_of_record(record)
        running = False
    chosen = step or current
    if chosen is not None and not chosen.startswith("step-") and chosen.isdigit():
        chosen = f"step-{chosen}"
    if chosen is None:
        raise RunbookError(f"run {run_id} has not started a step yet: no log to show", "unknown_run")
    if step is not None and ids and chosen not in ids:
        raise RunbookError(f"run {run_id} has no step {step!r}; its steps: {', '.join(ids)}", "usage")
    job = live.job_for(chosen) if live is not None else None
    if job is None and record is not None:
        job_id = next((s.job_id for s in record.steps if s.step_id == chosen), None)
    else:
        job_id = job.job_id if job else None
    kept = None
    if record is not None:
        kept = next((list(s.log_tail) for s in record.steps if s.step_id == chosen), [])
    return Located(run_id=run_id, phase=phase, step=chosen, log=run_dir(ws.state, run_id) / f"{chosen}.log",
                   running=running, job_id=job_id, kept=kept)


def follow(ws: Workspace, where: Located, write: Callable[[bytes], None], *, lines: int, pinned: bool) -> str | None:
    """Print the last `lines` lines, then what is appended, until the run ends; the closing line.
    `pinned`: a step was named, so do not move on to the next step."""
    from runbook.store.index import find_run
    from runbook.store.ledger import run_dir, tail_lines
    from runbook.store.live import is_alive, live_path, read_live

    folder = run_dir(ws.state, where.run_id)
    for line in tail_lines(where.log, lines):
        write((line + "\n").encode())
    offset = where.log.stat().st_size if where.log.exists() else 0
    step = where.step
    live = read_live(live_path(ws.state, where.run_id))
    order = [p.step_id for p in live.planned] if live is not None else [step]

    def move_to(new: str | None) -> None:
        """Finish the current step's log, print whole the logs of steps run in between, start `new`'s."""
        nonlocal step, offset
        _copy(folder / f"{step}.log", offset, write)
        later = order[order.index(step) + 1:] if step in order else []
        for between in later[: later.index(new)] if new in later else later:
            if (folder / f"{between}.log").exists():
                write(f"── {between} ──\n".encode())
                _copy(folder / f"{between}.log", 0, write)
        if new is not None:
            write(f"── {new} ──\n".encode())
            step, offset = new, 0

    while True:
        offset = _copy(folder / f"{step}.log", offset, write)
        live = read_live(live_path(ws.state, where.run_id))
        if live is None or is_alive(live) is False:
            break
        if not pinned and live.step and live.step != step:
            move_to(live.step)
        time.sleep(FOLLOW_POLL_S)
    record = find_run(ws.state, where.run_id)
    if pinned:
        _copy(folder / f"{step}.log", offset, write)
    else:
        if record is not None:
            order = [s.step_id for s in record.steps]
        move_to(None)  # the steps that ran after the last one seen
    if record is not None:
        return f"run {record.run_id} ({record.phase}) ended: {record.verdict} · {record.reason}"
    if live is not None:
        return f"run {where.run_id}: its runbook (pid {live.pid}) died; `runbook next` records it and resumes"
    return f"run {where.run_id} ended"


def _copy(path: Path, offset: int, write: Callable[[bytes], None]) -> int:
    from runbook.files import NotReadable, open_regular

    try:
        with open_regular(path) as handle:
            handle.seek(offset)
            while True:
                data = handle.read(1 << 16)
                if not data:
                    return offset
                write(data)
                offset += len(data)
    except (OSError, NotReadable):  # gone, or swapped for a FIFO: nothing to show, never a hang
        return offset
