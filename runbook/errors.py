"""The one error type of the runbook application layer.

Every refusal a command makes (no plan, several plans, a plan that does not validate, an unknown
phase, the lock held by another run, git in the middle of a merge, ...) is a `RunbookError`. It
carries a stable machine `code`, the process `exit_code` that code means, a message that says what
was found and what to do, and where (`file`, `line`, `col`) when a file is to blame. cli.py is the
only place that turns it into output: text on stderr, or the error envelope of `--json`
(runbook/contract.py), and the exit status.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runbook.model import Plan, Problem

# code -> exit code. Exit codes: 0 pass / done, 1 fail, 2 usage, plan or refusal, 3 inconclusive,
# 4 error / timeout / interrupted, 5 the run lock is held by another run.
EXIT_CODES: dict[str, int] = {
    "usage": 2,  # a bad option or argument
    "no_plan": 2,  # no plan found, or --plan names no plan file
    "several_plans": 2,  # more than one plan: name one with --plan
    "plan_invalid": 2,  # the plan does not validate (see `problems`)
    "config": 2,  # runbook.toml / [tool.runbook] cannot be used
    "unknown_phase": 2,  # a PHASE argument names no phase of the plan
    "unknown_run": 2,  # a RUN argument names no run of the plan
    "blocked": 2,  # a `Needs:` of the phase is not met
    "confirmation_required": 2,  # `runbook next` without --yes, and no terminal to ask (or --json)
    "not_confirmed": 2,  # the user said no
    "hand_edited": 2,  # a tool-owned block was edited by hand
    "inputs_stale": 2,  # an `Inputs:` file is not what the deciding run of the phase that makes it made
    "git_state": 2,  # a merge / rebase in progress, no git identity, ...
    "notes_invalid": 2,  # the notes document cannot be edited safely
    "io": 2,  # a file could not be read or written (full disk, read-only, ...)
    "internal": 2,  # a bug in runbook: the message says where to report it
    "commit_failed": 1,  # written, but git refused the commit
    "interrupted": 4,  # Ctrl-C / SIGTERM outside a run
    "cancel_timeout": 4,  # `runbook cancel`: the run did not stop in time (it is still stopping)
    "locked": 5,  # another `runbook next` holds the run lock
}


class RunbookError(Exception):
    """A refusal with its exit code. `code` is one of `EXIT_CODES`."""

    def __init__(
        self,
        message: str,
        code: str = "usage",
        *,
        file: str | None = None,
        line: int | None = None,
        col: int | None = None,
        hint: str | None = None,
        problems: list[Problem] | None = None,
        lock: Any = None,
        exit_code: int | None = None,
    ) -> None:
        super().__init__(message)
        if code not in EXIT_CODES:
            raise ValueError(f"unknown error code {code!r}")
        self.message = message
        self.code = code
        self.exit_code = EXIT_CODES[code] if exit_code is None else exit_code
        self.file = file
        self.line = line
        self.col = col
        self.hint = hint
        self.problems = list(problems or [])
        self.lock = lock  # a contract.LockHolder when code == "locked"

    def text(self) -> str:
        """The message as printed on stderr: problems first, then the message and the hint."""
        lines = [str(p) for p in self.problems]
        lines.append(self.message)
        if self.hint:
            lines.append(f"  {self.hint}")
        return "\n".join(lines)


def unknown_phase(plan: Plan, ref: str, where: str) -> RunbookError:
    """The refusal of a PHASE argument (`where`: the plan as the user named it) that names no phase of `plan`."""
    known = ", ".join(f"{p.id} ({p.display_name})" for p in plan.phases)
    return RunbookError(f"{where}: no phase {ref!r}; phases: {known}", "unknown_phase", file=where,
                        hint="name a phase by its label (`1`, `\"Phase 1\"`) or its id (`phase-1`)")


# ---- warnings ----------------------------------------------------------------------------------

_warnings: list[str] = []


def warning(message: str) -> None:
    """Say `warning: MESSAGE` on stderr, and keep it for the `warnings` of this command's --json
    envelope (cli.py takes them: `take_warnings`). The one way runbook warns."""
    _warnings.append(message)
    print(f"warning: {message}", file=sys.stderr, flush=True)


def take_warnings() -> list[str]:
    """The warnings said since the last call (cli.py calls it before and after a verb)."""
    said = list(_warnings)
    _warnings.clear()
    return said
