"""Where a phase's steps run: the executor interface, and how a phase picks its executor.

An executor takes the steps to run (`execute.StepSpec`, vars resolved) and a `StepContext`, runs
them in order, stops at the first error / timeout / interrupt, and hands back the steps' results
(`execute.StepsOutcome`: exit codes, log paths and tails, metrics). That is all it does: picking the
phase, judging `Pass:`, the ledger, the plan write-back and the commit stay in runbook/run/runner.py,
the same whatever ran the steps. Who waits for the executor is a separate choice: the terminal
(`runbook next`) or a supervisor that outlives it (`runbook next --detach`, runbook/run/supervisor.py).

Executors now:
- `local` (runbook/run/local.py): `bash -c` in its own process group on this machine;
- `slurm` (runbook/run/slurm.py): one `sbatch` job per step, polled with squeue / scontrol; a run
  whose runbook died re-attaches to its job (`StepContext.prior` and `LiveRun.jobs`).

Adding one (ssh, Kubernetes) means a class with `name` and `run_steps`, and a word in
`Executor:` (parse.py `_EXECUTORS`, model.Phase.executor); nothing in the judge changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from runbook.model import Phase, StepResult
from runbook.run.local import KILL_GRACE_S, Interrupts, StepsOutcome, StepSpec

__all__ = ["Executor", "LocalExecutor", "StepContext", "StepHooks", "executor_for"]


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


class LocalExecutor:
    """Today's behaviour: each step a `bash -c` subprocess in its own process group, here."""

    name = "local"

    def run_steps(self, steps: list[StepSpec], ctx: StepContext) -> StepsOutcome:
        from runbook.run.local import run_steps

        return run_steps(
            steps, run_id=ctx.run_id, phase_id=ctx.phase_id, repo_root=ctx.repo_root, state_dir=ctx.state_dir,
            timeout_s=ctx.timeout_s, echo=ctx.echo, announce=ctx.hooks.announce, on_pgid=ctx.hooks.on_pgid,
            on_result=ctx.hooks.on_result, interrupts=ctx.interrupts, grace_s=ctx.grace_s, bin_path=ctx.bin_path,
        )


def executor_for(name: str | None) -> Executor:
    """The executor a phase's `Executor:` names (None: local)."""
    if name == "slurm":
        from runbook.run.slurm import SlurmExecutor

        return SlurmExecutor()
    return LocalExecutor()


def phase_executor(phase: Phase) -> str:
    return phase.executor or "local"
