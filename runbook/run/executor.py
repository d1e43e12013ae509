"""Where a phase's steps run: the executor interface (it imports no executor).

An executor takes the steps to run (`StepSpec`, vars resolved) and a `StepContext`, runs
them in order, stops at the first error / timeout / interrupt, and hands back the steps' results
(`StepsOutcome`: exit codes, log paths and tails, metrics). That is all it does: picking the
phase, judging `Pass:`, the ledger, the plan write-back and the commit stay in runbook/run/runner.py,
the same whatever ran the steps. Who waits for the executor is a separate choice: the terminal
(`runbook next`) or a supervisor that outlives it (`runbook next --detach`, runbook/run/supervisor.py).

Executors now:
- `local` (runbook/run/local.py, `LocalExecutor`): `bash -c` in its own process group on this machine;
- `slurm` (runbook/run/slurm.py): one `sbatch` job per step, polled with squeue / scontrol; a run
  whose runbook died re-attaches to its job (`StepContext.prior` and `LiveRun.jobs`).

Adding one (ssh, Kubernetes) means a class with `name` and `run_steps`, a word in `Executor:`
(parse.py `_EXECUTORS`, model.Phase.executor) and a line in runner.executor_for, which picks the
executor a phase names; nothing in the judge changes.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, BinaryIO, Protocol

from runbook.model import Metrics, Phase, StepResult

__all__ = [
    "KILL_GRACE_S", "Executor", "Interrupts", "StepContext", "StepHooks", "StepSpec", "StepsOutcome", "phase_executor",
    "stop_cause",
]

KILL_GRACE_S = 5.0
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class StepSpec:
    """One step to run: its id, its command with vars resolved, and whether it is already done."""

    step_id: str
    command: str
    skip: bool = False  # done in an earlier run of this phase: not run again
    carried_metrics: Metrics = field(default_factory=dict)  # its metrics from that run


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
        self._old: dict[int, Callable[[int, FrameType | None], Any] | int] = {}

    def _handle(self, signum: int, _frame: object) -> None:
        self.count += 1
        if self.signum is None:
            self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def __enter__(self) -> Interrupts:
        for sig in _SIGNALS:
            old = signal.signal(sig, self._handle)
            self._old[sig] = signal.SIG_DFL if old is None else old  # None: a handler not set from Python
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def stop_cause(interrupts: Interrupts | None, deadline: float | None, now: float) -> str | None:
    """Why a running step must stop now: "interrupted" (a signal came), "timeout" (the phase's
    deadline passed), or None (it runs on). The one rule for every executor (local, Slurm)."""
    if interrupts is not None and interrupts.signum is not None:
        return "interrupted"
    if deadline is not None and now >= deadline:
        return "timeout"
    return None


@dataclass
class StepHooks:
    """What an executor tells the runner while it works (each may be a no-op)."""

    announce: Callable[[StepSpec], None] = lambda _spec: None  # a step starts
    on_pgid: Callable[[int | None], None] = lambda _pgid: None  # local: the running step's process group
    on_result: Callable[[StepResult], None] = lambda _result: None  # a step finished (or was skipped)
    on_job: Callable[[str, str, str], None] = lambda _step, _job, _name: None  # a job was submitted: step, id, name


@dataclass
class StepContext:
    run_id: str
    phase_id: str
    repo_root: Path
    state_dir: Path
    timeout_s: float | None = None  # the phase's Timeout
    elapsed_s: float = 0.0  # of that timeout, already spent (a re-attached run)
    echo: BinaryIO | None = None
    interrupts: Interrupts | None = None
    grace_s: float = KILL_GRACE_S
    hooks: StepHooks = field(default_factory=StepHooks)
    prior: dict[str, StepResult] = field(default_factory=dict)  # steps this run already finished (re-attach)
    jobs: dict[str, tuple[str, str]] = field(default_factory=dict)  # step id -> (job id, name) to re-attach to
    resources: dict[str, str] = field(default_factory=dict)  # slurm: the phase's resources, defaults merged
    sbatch_args: list[str] = field(default_factory=list)
    poll_s: float = 10.0
    bin_path: str = "append"  # where runbook's interpreter directory goes on the steps' PATH (runbook.toml)


class Executor(Protocol):
    name: str

    def run_steps(self, steps: list[StepSpec], ctx: StepContext) -> StepsOutcome: ...


def phase_executor(phase: Phase) -> str:
    return phase.executor or "local"
