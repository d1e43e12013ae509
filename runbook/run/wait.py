"""`runbook wait`: a run's state once it has ended, or after at most TIMEOUT seconds. Reads only: it
never stops, signals or records a run, so a caller that gives up (a timeout, a closed terminal, an MCP
client gone away) costs the run nothing.

Which run, chosen once: RUN (an id or a unique prefix of a run in progress; otherwise any run
reference of the ledger: id, prefix, `last`, `last~N`), else the run in progress (the run lock's
holder, else a live run of the plan), else a run whose runbook died unrecorded, else the latest run. Then each look reads the run's live state
(runbook/store/live.py), the lock and its ledger record:

- `running`: its runbook lives (also while it writes the plan and commits: the live state goes only
  after the commit). `running` is the `LockHolder` every reader shows (step n/N, heartbeat, metrics
  so far, the step's last log lines).
- `finished`: the ledger has its record and no runbook works on it any more: judged, written back
  and committed. `run` is its `RunView`; `running` the run in progress now, if another one started
  (`--until-stop` goes on to the next phase under a new run id).
- `died`: its runbook died before recording it; `run` shows it as the `interrupted` run the next
  `runbook next` (or `runbook cancel`) records (`pending: true`).

`looks(ws, ref, timeout_s)` is the one loop, a generator that yields how long to sleep before the
next look and returns the result; the command line drives it with `time.sleep` (`wait`), the MCP
server with `anyio.sleep`, each look in a worker thread, so a long wait blocks none of its other calls.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import TYPE_CHECKING

from runbook.contract import LockHolder, RunView, WaitResult
from runbook.errors import RunbookError
from runbook.model import EXIT_CODES

if TYPE_CHECKING:
    from runbook.model import Plan
    from runbook.store.live import LiveRun
    from runbook.store.workspace import Workspace

__all__ = ["DEFAULT_WAIT_S", "MAX_WAIT_S", "POLL_S", "exit_code", "looks", "step", "wait", "workspace"]

DEFAULT_WAIT_S = 30.0
MAX_WAIT_S = 600.0  # one call waits at most this long: call again to wait more
POLL_S = 0.5  # between two looks
STILL_RUNNING = 5  # the exit code while the run goes on: another run's lock is held, as for `runbook next`

Looks = Generator[float, None, WaitResult]


def workspace(plan_opt: str | None) -> Workspace:
    """Where to look: the plan's workspace with --plan, else the repository's (every plan's runs)."""
    from runbook.store.workspace import Workspace

    return Workspace.open(plan_opt) if plan_opt else Workspace.at()


def wait(ws: Workspace, run_ref: str | None, timeout_s: float) -> WaitResult:
    """Look at the run until it has ended or `timeout_s` passed (the command line's loop)."""
    looking = looks(ws, run_ref, timeout_s)
    while not isinstance(got := step(looking), WaitResult):
        time.sleep(got)
    return got


def step(looking: Looks) -> float | WaitResult:
    """The next look: how long to sleep before the one after it, or the result."""
    try:
        return next(looking)
    except StopIteration as done:
        result: WaitResult = done.value
        return result


def looks(ws: Workspace, run_ref: str | None, timeout_s: float) -> Looks:
    """Choose the run, then look at it every POLL_S until it is no longer running or `timeout_s` passed."""
    timeout_s = max(0.0, min(timeout_s, MAX_WAIT_S))
    start = time.monotonic()
    run_id = _target(ws, run_ref)
    labels = _labels(ws)
    while True:
        waited = time.monotonic() - start
        result = _look(ws, run_id, round(waited, 1), labels)
        left = timeout_s - waited
        if result.state != "running" or left <= 0:
            return result
        yield min(POLL_S, left)


def exit_code(result: WaitResult) -> int:
    """The verdict's exit code once the run ended (a died run will be `interrupted`); 5 while it runs."""
    if result.state == "running" or result.run is None:
        return STILL_RUNNING
    return EXIT_CODES[result.run.verdict]


def _labels(ws: Workspace) -> Plan | None:
    """The plan, for phase labels: --plan's, else the repository's only one; None when broken or several."""
    from runbook.store.workspace import Workspace

    try:
        return ws.plan if ws.plan_path is not None else Workspace.open(None).load_plan()
    except RunbookError:
        return None


def _plan_rel(ws: Workspace) -> str | None:
    return ws.plan_rel if ws.plan_path is not None else None


def _target(ws: Workspace, run_ref: str | None) -> str:
    from runbook.store.live import is_alive, live_runs
    from runbook.store.lock import holds

    lives = live_runs(ws.state, _plan_rel(ws))
    if run_ref:
        from runbook.store.index import LAST_REF

        if not LAST_REF.fullmatch(run_ref):
            live = [x for x in lives if x.run_id == run_ref or x.run_id.startswith(run_ref)]
            if len(live) == 1:
                return live[0].run_id
        return ws.find_row(run_ref).run_id
    info = ws.lock_info()
    if info is not None and info.run_id and holds(info, ws.state) is not False and (
            _plan_rel(ws) in (None, info.plan)):
        return info.run_id
    alive = [x for x in lives if is_alive(x) is not False]
    if alive:
        return alive[-1].run_id
    from runbook.store.ledger import run_path

    unrecorded = [x for x in lives if not run_path(ws.state, x.run_id).is_file()]  # its runbook died
    if unrecorded:
        return unrecorded[-1].run_id
    last = ws.ledger().last(_plan_rel(ws))
    if last is None:
        whose = _plan_rel(ws) or "this workspace"
        raise RunbookError(f"no runs of {whose} yet: nothing to wait for", "unknown_run",
                           hint="start one with `runbook next --detach` (or the MCP tool `next` with detach)")
    return last.run_id


def _look(ws: Workspace, run_id: str, waited: float, labels: Plan | None) -> WaitResult:
    from runbook.store.index import find_run
    from runbook.store.ledger import run_path
    from runbook.store.live import death_reason, interrupted_record, is_alive

    live = ws.live_of(run_id)
    working = live is not None and is_alive(live) is not False
    record = find_run(ws.state, run_id) if not working and run_path(ws.state, run_id).is_file() else None
    if record is not None:
        return WaitResult(run_id=run_id, state="finished", waited_s=waited, run=RunView.of(record, recorded_in=record.commit),
                          running=_in_progress(ws, labels, finished=run_id))
    if live is not None and not working:
        dead = live.record or interrupted_record(live, ws.root, death_reason(live))
        return WaitResult(run_id=run_id, state="died", waited_s=waited, run=RunView.of(dead, pending=True))
    holder = _holder(ws, run_id, live, labels)
    if holder is None:
        raise RunbookError(f"run {run_id} is neither in progress nor in the ledger of {ws.rel(ws.state)}/runs "
                           "(forgotten, or its files removed)", "unknown_run", hint="`runbook history` lists the runs")
    return WaitResult(run_id=run_id, state="running", waited_s=waited, running=holder)


def _holder(ws: Workspace, run_id: str, live: LiveRun | None, labels: Plan | None) -> LockHolder | None:
    """The run in progress `run_id` as every reader shows it: from the lock when it names the run,
    else from its live state alone (the moment before the lock names it)."""
    from runbook.run.planstate import holder_view
    from runbook.store.lock import LockInfo, holds

    info = ws.lock_info()
    if info is not None and info.run_id == run_id and holds(info, ws.state) is not False:
        return holder_view(info, labels, ws.rel(ws.state), live=live,
                           root=ws.root, state_dir=ws.state)
    if live is None:
        return None
    info = LockInfo(pid=live.pid, host=live.host, started=live.started, run_id=live.run_id, pid_start=live.pid_start,
                    plan=live.plan, phase=live.phase, step=live.step)
    return holder_view(info, labels, ws.rel(ws.state), live=live, root=ws.root)


def _in_progress(ws: Workspace, labels: Plan | None, finished: str) -> LockHolder | None:
    """The run holding the lock now, when one does and it is not the `finished` one (after a run ends:
    the next one of `--until-stop`; the finished run's own runbook may hold the lock a moment longer,
    between its commit and its exit)."""
    from runbook.run.planstate import holder_view
    from runbook.store.lock import holds

    info = ws.lock_info()
    if info is None or not info.run_id or info.run_id == finished or holds(info, ws.state) is False:
        return None
    return holder_view(info, labels, ws.rel(ws.state),
                       live=ws.live_of(info.run_id), root=ws.root, state_dir=ws.state)
