"""`runbook mcp`: the Model Context Protocol server, a thin adapter over the command line's own code.

An agent host starts `runbook mcp` and talks to it over stdin/stdout (the official `mcp` SDK,
imported only here). Every tool is a `runbook` verb, run by the very code the command line runs,
and answers with that verb's `--json` envelope (runbook/contract.py): its JSON Schema is the tool's
output schema, `ok: false` is an MCP tool error carrying the same code, exit code and
`file:line:col` message the command line prints. Nothing here decides anything about a plan.

- brief, status, show, validate, history, diff, plot, record, forget, reset, logs, cancel and `next`
  without `run` (a dry run) call the verb's click callback in this process, with `--json` semantics, one at a time;
  what the verb says on stderr (warnings, the dry run's preview) comes back as a second text block.
- `next` with `run: true` runs `runbook next --yes --json` (with `detach: true`, `... --detach`: the
  command line's supervisor, which answers once the run started) as a child process in its own
  session, its output going to unlinked temporary files: the run lock, the signals, the judging, the
  write-back and the commit are exactly the command line's. Its stderr (step output, the summary)
  is streamed as progress notifications. A run is never stopped from here: when the client cancels
  the call (its timeout), disconnects, or this server gets SIGTERM, SIGHUP or SIGINT, the child is
  let go and runs to its verdict, write-back and commit (it is not in our process group and writes
  to no pipe of ours); only `cancel` stops a run. `wait` gives its outcome.
- `wait` is `runbook wait`'s loop (runbook/run/wait.py) with the sleeps here and each look in a
  worker thread: it holds no lock, so a long wait blocks no other call.
- The wire is the SDK's stdio transport behind our reader (runbook/mcp_stdio.py): one message a
  line, at most 4 MiB (`RUNBOOK_MCP_MAX_MESSAGE_MB`), and every line the SDK would drop (invalid
  JSON, no JSON-RPC request, a bad id or params, too long) answered with its JSON-RPC error.
- Resources (read-only, read from disk at each request): each plan, each plan's notes document,
  the latest run (`runbook://run/latest`) and any run by id (`runbook://run/{run_id}`), as the
  `RunView` of the contract.

Adding a tool is one `Tool(...)` line in `TOOLS` (and its arguments model). `logs` answers the last
lines of a step's log (no `--follow`: a tool answers once; call it again for more, or use the
progress of `next` with `run`); `cancel` stops the run in progress, whoever started it, and waits
until it is recorded `interrupted` (a `next` call of this server's then ends with that run). The
pinned SDK has no long-running tasks (its 2025-11-25 task types are never dispatched; 2026-07-28
moved tasks to an extension it does not ship): `next` with detach and `wait` stand in for them.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from runbook.cli import COMMANDS, error_info, refusal
from runbook.commands._output import Output
from runbook.contract import envelope_json, output_schema
from runbook.entry import runbook_argv
from runbook.errors import RunbookError
from runbook.mcp_stdio import stdio_transport

__all__ = ["TOOLS", "build_server", "serve"]

logger = logging.getLogger("runbook.mcp")
Context = ServerRequestContext[Any]  # what the SDK hands each handler

INSTRUCTIONS = """\
runbook keeps a Markdown game plan (phases with exact commands and Pass: criteria), runs its
phases, judges them, writes the verdicts back into the plan and commits. Start with `brief`: it
says where the plan stands and the exact next action. `next` shows what would run; call it with
run=true to run the phase (step output arrives as progress); add detach=true when the phase may
outlast your tool call timeout, then call `wait` (timeout below yours) until the run has finished.
A run never stops because a call timed out: `wait` gives its outcome. After a judged phase, `record` the
milestone and lessons into the notes. Every tool answers with the JSON envelope of the matching
`runbook VERB --json` (docs/json.md); refusals are tool errors with a stable `error.code`."""

OUTPUT_TAIL_CHARS = 6000  # of a run's stderr, returned with its result
PROGRESS_CHARS = 8000  # of output in one progress notification
POLL_S = 0.2  # how often a running `runbook next` child's output is read


# ---- tool arguments -------------------------------------------------------------------------------


def _nul_in(value: Any, where: str) -> str | None:
    """The first argument (dotted path) whose text holds a NUL byte, which no command line can carry."""
    if isinstance(value, str):
        return where if "\0" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _nul_in(key, f"{where}.{key!r}") or _nul_in(item, f"{where}.{key}")
            if found:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _nul_in(item, f"{where}[{i}]")
            if found:
                return found
    return None


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _no_nul(self) -> Args:
        for name in type(self).model_fields:
            where = _nul_in(getattr(self, name), name)
            if where:
                raise ValueError(f"{where} holds a NUL byte, which no command line or file name can carry")
        return self

    def cli_kwargs(self) -> dict[str, Any]:
        """The verb's click parameters these arguments stand for (the rest keep their defaults)."""
        return {}

    def paths(self) -> list[tuple[str, str]]:
        """(argument, path) of every argument naming a plan: each must be a plan of the server's workspace."""
        return []

    def writes(self) -> list[tuple[str, str]]:
        """(argument, path) of every argument naming a file to write: each must lie in the server's workspace."""
        return []


class PlanArgs(Args):
    plan: str | None = Field(None, description="The plan file (a path relative to the repository root), needed "
                                               "only when the repository has several plans.")

    def cli_kwargs(self) -> dict[str, Any]:
        return {"plan_opt": self.plan}

    def paths(self) -> list[tuple[str, str]]:
        return [("plan", self.plan)] if self.plan else []


class BriefArgs(PlanArgs):
    max_chars: int | None = Field(None, ge=200, description="Shorten the brief to about this many characters "
                                                            "(default: no limit).")

    def cli_kwargs(self) -> dict[str, Any]:
        return {**super().cli_kwargs(), "max_chars": self.max_chars}


class ShowArgs(PlanArgs):
    phase: str | None = Field(None, description="A phase label (`1`, `Phase 1`) or id (`phase-1`); default: "
                                                "the phase the next action acts on.")

    def cli_kwargs(self) -> dict[str, Any]:
        return {**super().cli_kwargs(), "phase_ref": self.phase}


class ValidateArgs(Args):
    plans: list[str] = Field([], description="Plan files to check; default: every plan of the repository.")

    def cli_kwargs(self) -> dict[str, Any]:
        return {"plans": tuple(self.plans)}

    def paths(self) -> list[tuple[str, str]]:
        return [(f"plans[{i}]", plan) for i, plan in enumerate(self.plans)]


class HistoryArgs(ShowArgs):
    plan: str | None = Field(None, description="Only runs of this plan file (default: every plan's runs; the "
                                               "only plan's when a phase is given).")
    phase: str | None = Field(None, description="Only runs of this phase (label or id).")
    metrics: list[str] = Field([], description="Columns to show: metrics, other phases' metrics (phase-0.acc) "
                                               "or vars; unknown names come back in `warnings`.")
    sort: str | None = Field(None, description="Order the runs by this column, lowest first (`-NAME`: highest "
                                               "first); runs without a value last. Default: by when they started.")
    newest_first: bool = Field(False, description="Newest run first (default: oldest first); with `sort`: highest "
                                                  "first, as `-NAME`.")
    limit: int = Field(50, ge=0, description="List the last N runs (then `sort` orders them; 0: every run); "
                                             "`omitted` counts the earlier.")
    since: str | None = Field(None, description="Only runs started at or after this date (2026-11-29), UTC time "
                                                "(2026-11-29T14:30) or run id.")

    def cli_kwargs(self) -> dict[str, Any]:
        return {**super().cli_kwargs(), "metrics": tuple(self.metrics), "sort": self.sort, "desc": self.newest_first,
                "limit": self.limit, "since_text": self.since}


class DiffArgs(Args):
    run_a: str | None = Field(None, description="The first run: its id, a unique prefix, `last` or `last~N`. "
                                                "Without run_b: compared with the run of its phase before it.")
    run_b: str | None = Field(None, description="The second run (default: see run_a; with neither, the last "
                                                "run against the one before it in its phase).")
    plan: str | None = Field(None, description="Only runs of this plan file (default: every plan's runs).")

    def cli_kwargs(self) -> dict[str, Any]:
        return {"run_a": self.run_a, "run_b": self.run_b, "plan_opt": self.plan, "show_all": False}

    def paths(self) -> list[tuple[str, str]]:
        return [("plan", self.plan)] if self.plan else []


class NextArgs(PlanArgs):
    run: bool = Field(False, description="true: run the phase (take the lock, run its steps, judge, write back, "
                                         "commit). false (default): only show what would run.")
    phase: str | None = Field(None, description="Run this phase (label or id) instead of the current one.")
    restart: bool = Field(False, description="Untick the phase's steps and run it from its first step.")
    until_stop: bool = Field(False, description="Keep following On pass:/On fail: until stop, the end, "
                                                "inconclusive, error, timeout or an interrupt.")
    set: dict[str, str] = Field({}, description="Plan vars to give other values for this run (`runbook next "
                                                "--set NAME=VALUE`); the run record keeps every var it used.")
    no_commit: bool = Field(False, description="Write the results but do not commit them.")
    detach: bool = Field(False, description="With run=true: start the run under a supervisor that outlives this "
                                            "call and this server (`runbook next --detach`) and answer at once with "
                                            "its run id (result.detached.run_id); follow it with `wait`, stop it "
                                            "with `cancel`. Use it for any phase that may outlast your host's tool "
                                            "call timeout.")

    @model_validator(mode="after")
    def _detach_runs(self) -> NextArgs:
        if self.detach and not self.run:
            raise ValueError("detach: true starts a run in the background: give run: true with it")
        return self

    @field_validator("set")
    @classmethod
    def _var_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not name or "=" in name or name != name.strip():
                raise ValueError(f"{name!r} is not a var name: give each var as its own key, e.g. "
                                 '{"lr": "3e-4"} (a name holds no `=` and no surrounding spaces)')
        return value

    def cli_kwargs(self) -> dict[str, Any]:
        return {**super().cli_kwargs(), "phase_ref": self.phase, "restart": self.restart,
                "until_stop": self.until_stop, "no_commit": self.no_commit, "dry_run": not self.run,
                "detach": self.detach,
                "sets": tuple(f"{name}={value}" for name, value in self.set.items())}

    def argv(self) -> list[str]:
        """`runbook next` arguments that run what these arguments ask for."""
        argv = ["next", "--yes", "--json"]
        argv += ["--plan", self.plan] if self.plan else []
        argv += ["--phase", self.phase] if self.phase else []
        argv += [flag for flag, on in (("--restart", self.restart), ("--until-stop", self.until_stop),
                                       ("--no-commit", self.no_commit), ("--detach", self.detach)) if on]
        for name, value in self.set.items():
            argv += ["--set", f"{name}={value}"]
        return argv


class SweepArgs(PlanArgs):
    phase: str | None = Field(None, description="The phase to sweep (label or id); not needed with resume.")
    grid: dict[str, list[str]] = Field({}, description="A grid: each plan var and its values, e.g. "
                                                       '{"lr": ["0.003", "0.01"], "hidden": ["8", "64"]} (6 trials '
                                                       "with three lr values); `runbook sweep --set lr=...`.")
    points: list[dict[str, str]] = Field([], description="Explicit points, each the var values of one trial "
                                                         "(after the grid's).")
    pick: str | None = Field(None, description="Once every point ran, make one trial the phase's verdict: "
                                               "best:METRIC (the direction the phase's Pass: compares it in), "
                                               "max:METRIC or min:METRIC. Without it the phase's verdict is "
                                               "unchanged: call `choose`.")
    jobs: int = Field(1, ge=1, le=256, description="Trials at once (Executor: slurm: jobs submitted together).")
    resume: bool = Field(False, description="Continue the latest unfinished sweep (the same grid again does too).")
    no_commit: bool = Field(False, description="Write the results but do not commit them.")

    @field_validator("grid", "points")
    @classmethod
    def _no_commas(cls, value: Any) -> Any:
        items = value.items() if isinstance(value, dict) else [kv for point in value for kv in point.items()]
        for name, values in items:
            for v in values if isinstance(values, list) else [values]:
                if "," in v or "=" in name or not name:
                    raise ValueError(f"{name}={v!r}: a sweep's var name holds no `=` and its values no comma")
        return value

    def cli_kwargs(self) -> dict[str, Any]:
        return {**super().cli_kwargs(), "phase_ref": self.phase, "pick": self.pick, "jobs": self.jobs,
                "resume": self.resume, "no_commit": self.no_commit, "yes": True,
                "sets": tuple(f"{k}={','.join(v)}" for k, v in self.grid.items()),
                "points": tuple(",".join(f"{k}={v}" for k, v in p.items()) for p in self.points)}

    def argv(self) -> list[str]:
        """`runbook sweep` arguments that run what these arguments ask for."""
        argv = ["sweep", *([self.phase] if self.phase else []), "--yes", "--json"]
        argv += ["--plan", self.plan] if self.plan else []
        for name, values in self.grid.items():
            argv += ["--set", f"{name}={','.join(values)}"]
        for point in self.points:
            argv += ["--point", ",".join(f"{k}={v}" for k, v in point.items())]
        argv += ["--pick", self.pick] if self.pick else []
        argv += ["--jobs", str(self.jobs)] if self.jobs != 1 else []
        argv += [flag for flag, on in (("--resume", self.resume), ("--no-commit", self.no_commit)) if on]
        return argv


class ChooseArgs(PlanArgs):
    run: str = Field(..., description="The run (a sweep's trial) to make its phase's verdict: its id, a unique "
                                      "prefix, `last` or `last~N`.")
    no_commit: bool = Field(False, description="Write the plan and the record, but do not commit.")

    def cli_kwargs(self) -> dict[str, Any]:
        return {**super().cli_kwargs(), "run_ref": self.run, "no_commit": self.no_commit}


class RecordArgs(PlanArgs):
    title: str = Field(..., min_length=1, description="The milestone's title.")
    body: str = Field("", description="The milestone's text (Markdown).")
    metrics: dict[str, float] = Field({}, description="Numbers to record, by name; they win over the run's.")
    lessons: list[str] = Field([], description="Lessons to add to 'Lessons learned' (ones already there are skipped).")
    next_steps: list[str] = Field([], description="Items to add to 'Next steps' (ones already there are "
                                                  "skipped).")
    run: str | None = Field(None, description="Attach a run of the plan: its id, a unique prefix, `last` or `last~N`.")
    plots: list[str] = Field([], description="Metrics to show as charts in the milestone: the run's series of each "
                                             "(a training curve), else its value across the phase's runs.")
    no_commit: bool = Field(False, description="Write the notes but do not commit them.")

    @field_validator("metrics")
    @classmethod
    def _metric_names(cls, value: dict[str, float]) -> dict[str, float]:
        from runbook.commands.record import parse_metric  # the command line's own rule for a name

        for name in value:
            try:
                parse_metric(f"{name}=0")
            except ValueError:
                raise ValueError(f"{name!r} is not a metric name: a letter or _, then letters, digits, "
                                 "_ . - (e.g. {\"accept_len\": 2.41})") from None
        return value

    def cli_kwargs(self) -> dict[str, Any]:
        return {**super().cli_kwargs(), "title": self.title, "body": io.StringIO(self.body),
                "metric_args": tuple(f"{name}={value!r}" for name, value in self.metrics.items()),
                "lessons": tuple(self.lessons), "next_steps": tuple(self.next_steps), "run_ref": self.run,
                "no_commit": self.no_commit, "plot_metrics": tuple(self.plots)}


class ForgetArgs(PlanArgs):
    run: str = Field(..., description="The run to drop: its id, a unique prefix, `last` or `last~N`.")
    no_commit: bool = Field(False, description="Write the plan and remove the ledger file, but do not commit.")

    def cli_kwargs(self) -> dict[str, Any]:
        return {**super().cli_kwargs(), "run_ref": self.run, "no_commit": self.no_commit}


class ResetArgs(PlanArgs):
    phase: str = Field(..., description="The phase whose runs all go (label or id).")
    no_commit: bool = Field(False, description="Write the plan and remove the ledger files, but do not commit.")

    def cli_kwargs(self) -> dict[str, Any]:
        return {**super().cli_kwargs(), "phase_ref": self.phase, "no_commit": self.no_commit}


class LogsArgs(PlanArgs):
    run: str | None = Field(None, description="A run id (or a unique prefix, `last`, `last~N`); default: the run in progress, "
                                              "else the latest.")
    step: str | None = Field(None, description="A step id (`step-2`, or `2`); default: the step running now, "
                                               "else the last one started.")
    lines: int = Field(40, ge=0, description="How many last lines of the log to return.")

    def cli_kwargs(self) -> dict[str, Any]:
        return {**super().cli_kwargs(), "run_ref": self.run, "step": self.step, "lines": self.lines,
                "follow": False}


class PlotArgs(Args):
    metric: str = Field(..., min_length=1, description="The metric: its series ($RUNBOOK_SERIES) when the runs "
                                                       "have one, else its value in each run.")
    phase: str | None = Field(None, description="Only runs of this phase (label or id).")
    runs: list[str] = Field([], description="These runs (ids, unique prefixes, `last`, `last~N`); default: the "
                                            "runs of `phase` (or of every phase), the last 8 with a series of it.")
    out: str | None = Field(None, description="Where the PNG goes, a .png path in the repository (the SVG beside "
                                              "it); default: state/runs/<newest run drawn>/plots/.")
    plan: str | None = Field(None, description="Runs of this plan file (default: the only plan, or every plan).")

    def cli_kwargs(self) -> dict[str, Any]:
        return {"phase_ref": self.phase, "metric": self.metric, "run_refs": tuple(self.runs), "out": self.out,
                "plan_opt": self.plan}

    def paths(self) -> list[tuple[str, str]]:
        return [("plan", self.plan)] if self.plan else []

    def writes(self) -> list[tuple[str, str]]:
        return [("out", self.out)] if self.out is not None else []


class WaitArgs(PlanArgs):
    run: str | None = Field(None, description="A run id (as `next` with detach answers it; or a unique prefix, "
                                              "`last`, `last~N`); default: the run in progress, else the latest.")
    timeout: float = Field(30.0, ge=0, le=600, description="Wait at most this many seconds (0-600; default 30) "
                                                           "for the run to end: give fewer than your host's tool "
                                                           "call timeout, and call again while it runs.")

    def cli_kwargs(self) -> dict[str, Any]:
        return {**super().cli_kwargs(), "run_ref": self.run, "timeout_s": self.timeout}


class CancelArgs(PlanArgs):
    wait: float = Field(180.0, ge=0, description="Seconds to wait for the run to stop and be recorded.")

    def cli_kwargs(self) -> dict[str, Any]:
        return {**super().cli_kwargs(), "wait_s": self.wait}


# ---- the tools ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tool:
    """One MCP tool: the `runbook` verb of the same name, its arguments and how hosts should treat it."""

    name: str
    args: type[Args]
    description: str
    read_only: bool = True
    destructive: bool = False

    def listing(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            description=self.description,
            input_schema=self.args.model_json_schema(),
            output_schema=output_schema(self.name),
            annotations=types.ToolAnnotations(read_only_hint=self.read_only, destructive_hint=self.destructive,
                                              idempotent_hint=self.read_only, open_world_hint=False),
        )


TOOLS: list[Tool] = [
    Tool("brief", BriefArgs, "The handoff for a newcomer: goal, phase table, last run, milestones, lessons, next "
         "steps and THE next action with its resolved commands. Start here."),
    Tool("status", PlanArgs, "Each phase's state (not_run, running, passed, failed, inconclusive, stale, "
         "resumable) and what runs next."),
    Tool("show", ShowArgs, "One phase exactly as written, its commands with vars resolved, its criterion and state."),
    Tool("validate", ValidateArgs, "Check plans; every problem as file:line:col. exit_code 2 when a plan has "
         "errors (the result still lists them)."),
    Tool("history", HistoryArgs, "Past runs from the ledger, oldest first (newest_first: newest first), with "
         "verdicts, metrics and why; and the run in progress."),
    Tool("diff", DiffArgs, "What differs between two runs: vars, commands, metrics with deltas, verdicts and "
         "comparisons, the code commit (and files changed between), environment."),
    Tool("plot", PlotArgs, "Draw a metric as PNG and SVG files (matplotlib): its series by step when the runs "
         "wrote one (a training curve), else its value across runs; answers the paths written.", read_only=False),
    Tool("next", NextArgs, "What `runbook next` runs now. By default a dry run: the selected phase and its "
         "resolved commands, nothing runs. With run=true it runs the phase under the run lock, streams step "
         "output as progress, judges Pass:, writes the verdict into the plan and commits; the result holds the "
         "run with its verdict and metrics. exit_code: 0 pass, 1 fail, 3 inconclusive, 4 error/timeout/"
         "interrupted. With run=true and detach=true it answers at once with the run id (result.detached) while "
         "the run goes on under a supervisor: follow it with `wait`. A run never stops because this call was "
         "cancelled, timed out or its client went away (only `cancel` stops it): `wait` then gives its outcome. "
         "Another run holding the lock is a tool error with code `locked`.",
         read_only=False),
    Tool("sweep", SweepArgs, "Run a phase once per point of a grid (`grid`) or of explicit `points`, each a "
         "trial: recorded, written into the phase's results table and committed, but not the phase's verdict. "
         "With pick (best:METRIC) the best trial becomes the verdict once every point ran; else call `choose`. "
         "A stopped sweep continues with its points not yet run (resume: true, or the same grid again).",
         read_only=False),
    Tool("choose", ChooseArgs, "Make one run (a sweep's trial) its phase's verdict: written back into the plan, "
         "committed; the plan routes from it. status and brief name it as the deciding run.", read_only=False),
    Tool("wait", WaitArgs, "Wait up to `timeout` seconds (default 30, at most 600) for a run to end: by default "
         "the run in progress. Answers its state: running (step n/N, heartbeat, metrics so far, log tail), "
         "finished (verdict, reason, metrics: judged, written back and committed) or died. Never stops the run; "
         "call it again while it runs. exit_code: the verdict's once it ended, 5 while it runs."),
    Tool("record", RecordArgs, "Write a milestone (title, body, metrics, the run it is about), lessons and next "
         "steps into the plan's notes document, and commit it. Works while a phase runs.", read_only=False),
    Tool("forget", ForgetArgs, "Drop one run from the ledger and the plan's results (a mistaken run, one of a "
         "phase since rewritten). Committed, so `git revert` brings it back; refused while a run is in progress.",
         read_only=False, destructive=True),
    Tool("logs", LogsArgs, "The last lines of a step's log: by default the running step of the run in "
         "progress (detached or on Slurm too), else the last step of the latest run."),
    Tool("cancel", CancelArgs, "Stop the run in progress cleanly: its runbook stops the step, records the run "
         "`interrupted`, writes the plan back and commits; `next` resumes at the first unfinished step. A run "
         "whose runbook died is recorded so. exit_code 4 when it did not stop within `wait`.",
         read_only=False, destructive=True),
    Tool("reset", ResetArgs, "Drop every run of a phase so that it is `not run` again (the phase was rewritten "
         "from scratch). Committed, so `git revert` brings them back; refused while a run is in progress.",
         read_only=False, destructive=True),
]
BY_NAME = {tool.name: tool for tool in TOOLS}


# ---- calling the verbs ----------------------------------------------------------------------------


@dataclass
class Outcome:
    """A verb's answer: exactly the JSON document `runbook VERB --json` prints, and what it said."""

    envelope: dict[str, Any]
    error_text: str | None = None  # for a refusal: what the command line prints on stderr
    said: str = ""  # the verb's stderr: warnings, a dry run's preview, a run's output (its tail)

    @classmethod
    def of(cls, command: str, exit_code: int, result: BaseModel | None = None, error: RunbookError | None = None,
           said: str = "") -> Outcome:
        warnings = [line.removeprefix("warning: ") for line in said.splitlines() if line.startswith("warning: ")]
        text = envelope_json(command, exit_code, result, error_info(error) if error is not None else None, warnings)
        return cls(json.loads(text), error.text() if error is not None else None, said)

    @classmethod
    def refused(cls, command: str, error: RunbookError, said: str = "") -> Outcome:
        return cls.of(command, error.exit_code, error=error, said=said)

    def tool_result(self) -> types.CallToolResult:
        command = self.envelope.get("command", "runbook")
        content = [types.TextContent(type="text", text=json.dumps(self.envelope, indent=2, ensure_ascii=False))]
        if self.error_text is not None:
            content.insert(0, types.TextContent(type="text", text=self.error_text))
        if self.said.strip():
            content.append(types.TextContent(type="text", text=f"runbook {command} said:\n{self.said.rstrip()}"))
        return types.CallToolResult(content=content, structured_content=self.envelope,
                                    is_error=not self.envelope.get("ok", False))


def call_verb(name: str, kwargs: dict[str, Any]) -> Outcome:
    """Run verb `name`'s click callback as `runbook NAME --json` would, in this process.

    Its stderr is captured (the MCP wire is on the real stdout's duplicate, never on sys.stderr)."""
    import click

    command = importlib.import_module(COMMANDS[name][0]).command
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), click.Context(command, info_name=name) as ctx:
            out = ctx.invoke(command, as_json=True, **kwargs)
    except (KeyboardInterrupt, Exception) as exc:  # the command line's own mapping (runbook/cli.py)
        error = refusal(exc, name)
        if error.code == "internal":  # a bug: its traceback goes to the host's log of this server
            logger.error("runbook %s raised", name, exc_info=exc)
        return Outcome.refused(name, error, said.getvalue())
    if not isinstance(out, Output):
        error = RunbookError(f"runbook {name}: internal error (the verb returned {type(out).__name__})", "internal")
        return Outcome.refused(name, error, said.getvalue())
    return Outcome.of(name, out.exit_code, out.result, said=said.getvalue())


Report = Callable[[list[str]], Awaitable[None]]


class Children:
    """The `runbook next` processes this server started and still reports on.

    A run is never stopped from here: when the call is cancelled (the host's timeout), the client goes
    away or this server is told to stop, the child is let go (a thread reaps it when it exits) and goes
    on to its verdict, write-back and commit; only `cancel` stops a run. It lives in a session of its
    own and writes to no pipe of ours, so nothing of this server's going away reaches it."""

    def __init__(self) -> None:
        self.procs: set[subprocess.Popen[bytes]] = set()

    def let_go(self, proc: subprocess.Popen[bytes], name: str) -> None:
        """Stop reporting on `proc` and leave it running; reap it when it exits."""
        if proc not in self.procs:  # let go already (our shutdown, then the call's cancellation)
            return
        self.procs.discard(proc)
        if proc.poll() is None:
            logger.warning("runbook %s (pid %d) goes on without its caller: `wait` follows it, `cancel` stops it",
                           name, proc.pid)
            threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()

    async def run(self, name: str, argv: list[str], report: Report) -> Outcome:
        """Run `runbook ARGV` (which ends in --json) to its end; stream its stderr lines to `report`."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            proc = subprocess.Popen([*runbook_argv(), *argv], stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    env=env, start_new_session=True)
            self.procs.add(proc)
            tail = _Tail(err.fileno())
            try:
                while True:
                    finished = proc.poll() is not None
                    lines = tail.read()
                    if lines:
                        with contextlib.suppress(Exception):  # a client gone away cannot stop the run
                            await report(lines)
                    if finished and not lines:
                        break
                    await anyio.sleep(POLL_S)
            except BaseException:  # cancelled (the client cancelled or went away, our own shutdown)
                self.let_go(proc, name)
                raise
            finally:
                self.procs.discard(proc)
            return _child_outcome(name, proc.returncode, os.pread(out.fileno(), 1 << 24, 0), tail.text())


class _Tail:
    """Read what a child appended to a file since the last read, in whole lines."""

    def __init__(self, fd: int) -> None:
        self.fd, self.pos, self.partial = fd, 0, b""
        self.kept = ""

    def read(self) -> list[str]:
        data = b""
        while chunk := os.pread(self.fd, 1 << 16, self.pos):
            self.pos += len(chunk)
            data += chunk
        if not data:
            return []
        data = self.partial + data
        *whole, self.partial = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        lines = [line.decode("utf-8", "replace") for line in whole]
        self.kept = (self.kept + "".join(line + "\n" for line in lines))[-OUTPUT_TAIL_CHARS:]
        return lines

    def text(self) -> str:
        return self.kept + self.partial.decode("utf-8", "replace")


def _child_outcome(name: str, code: int, stdout: bytes, said: str) -> Outcome:
    """The child's --json envelope, as it printed it; a child that printed none is an internal error."""
    try:
        envelope = json.loads(stdout.decode("utf-8"))
        ok = envelope["ok"]
    except (ValueError, KeyError, TypeError):
        error = RunbookError(f"runbook {name}: internal error (exit {code} without a JSON result; what it said "
                             "is below)", "internal", hint="rerun with RUNBOOK_DEBUG=1 for the traceback, and report it")
        return Outcome.refused(name, error, said)
    return Outcome(envelope, None if ok else _error_text(envelope.get("error") or {}), said)


def _error_text(info: dict[str, Any]) -> str:
    """What the command line prints on stderr for the refusal in a child's envelope."""
    from runbook.contract import ErrorInfo
    from runbook.errors import EXIT_CODES
    from runbook.model import Problem

    try:
        error = ErrorInfo.model_validate(info)
    except ValidationError:
        return json.dumps(info)
    problems = [Problem(**p.model_dump()) for p in error.problems]
    code = error.code if error.code in EXIT_CODES else "internal"
    return RunbookError(error.message, code, hint=error.hint, problems=problems).text()


# ---- resources ------------------------------------------------------------------------------------

PLAN_URI, NOTES_URI, RUN_URI = "runbook://plan/", "runbook://notes/", "runbook://run/"


def _documents() -> list[tuple[str, str, Path, str]]:
    """(uri, name, path, description) of every plan of the workspace and of each plan's notes."""
    from runbook.plan.parse import read_plan
    from runbook.store.project import discover_plans
    from runbook.store.workspace import Workspace

    ws = Workspace.at()
    docs: list[tuple[str, str, Path, str]] = []
    for path in discover_plans(ws.root):
        rel = ws.rel(Path(path))
        docs.append((PLAN_URI + rel, rel, Path(path), "The game plan (read-only: runbook writes its marked blocks)."))
        plan, _ = read_plan(str(path))
        if plan is not None and plan.notes:
            notes = Path(os.path.normpath(Path(path).parent / plan.notes))
            if notes.is_file() and notes.resolve().is_relative_to(ws.root):
                docs.append((NOTES_URI + ws.rel(notes), ws.rel(notes), notes,
                             f"The notes of {rel}: milestones, lessons learned, next steps (write with `record`)."))
    return docs


@contextlib.contextmanager
def _as_mcp_error(uri: str | None = None) -> Iterator[None]:
    """A workspace that cannot be read (broken runbook.toml, unreadable file) as an MCP error."""
    from runbook.store.project import ConfigError

    try:
        yield
    except (RunbookError, ConfigError, OSError) as exc:
        message = exc.text() if isinstance(exc, RunbookError) else str(exc)
        raise MCPError(code=types.INVALID_REQUEST if uri is None else types.INVALID_PARAMS, message=message,
                       data={"uri": uri} if uri else None) from None


def list_resources() -> list[types.Resource]:
    with _as_mcp_error():
        documents = _documents()
    resources = [types.Resource(uri=uri, name=name, description=desc, mime_type="text/markdown")
                 for uri, name, _path, desc in documents]
    resources.append(types.Resource(uri=RUN_URI + "latest", name="latest run", mime_type="application/json",
                                    description="The latest run of any plan here, as the RunView of docs/json.md."))
    return resources


def read_resource(uri: str) -> types.ReadResourceResult:
    with _as_mcp_error(uri):
        if uri.startswith(RUN_URI):
            return _read_run(uri, uri[len(RUN_URI):])
        for known, _name, path, _desc in _documents():
            if known == uri:
                return types.ReadResourceResult(contents=[types.TextResourceContents(
                    uri=uri, mime_type="text/markdown", text=path.read_text(encoding="utf-8", errors="replace"))])
    raise MCPError(code=types.INVALID_PARAMS, message=f"no resource {uri}: list the resources for the plans and "
                   "notes there are", data={"uri": uri})


def _read_run(uri: str, ref: str) -> types.ReadResourceResult:
    from runbook.contract import RunView
    from runbook.store.workspace import Workspace

    index = Workspace.at().ledger()
    rows = index.rows()
    if ref == "latest":
        chosen = [max(rows, key=lambda r: (r.started or "", r.run_id))] if rows else []
    else:
        chosen = [next(r for r in rows if r.run_id == ref)] if any(r.run_id == ref for r in rows) else []
    loaded = index.load(chosen)
    found = loaded[0] if loaded else None
    if found is None:
        what = "no runs yet" if not rows else f"no run {ref!r}"
        raise MCPError(code=types.INVALID_PARAMS, message=f"{uri}: {what}", data={"uri": uri})
    return types.ReadResourceResult(contents=[types.TextResourceContents(
        uri=uri, mime_type="application/json", text=RunView.of(found).model_dump_json(indent=2))])


# ---- the server -----------------------------------------------------------------------------------


def outside_root(args: Args, root: Path) -> RunbookError | None:
    """A refusal for the first path argument whose plan lies outside `root` (the repository the server
    serves): a path out of it, `..` or a link leading out, or a plan of another repository nested inside."""
    from runbook.store.project import find_repo_root

    for name, value in args.paths():
        if not value:  # not the root's parent, where os.path.abspath leads it
            return RunbookError(f"{name}: an empty path names no plan file", "usage",
                                hint="name a plan file of this repository (a path relative to its root)")
        path = Path(os.path.abspath(value))
        own = Path(find_repo_root(path.parent)).resolve()  # the plan's workspace, as Workspace.open finds it
        if not path.resolve().is_relative_to(root) or own != root:
            return RunbookError(
                f"{name}: {value} is outside {root}, the repository this server serves: it runs, reads and "
                "writes only that repository's plans and notes", "usage", file=value,
                hint="name a file of this repository (a path relative to its root), or start a server for the "
                     "other repository (`runbook mcp --root PATH`)")
    for name, value in args.writes():
        if not value or not Path(os.path.abspath(value)).resolve().is_relative_to(root):
            return RunbookError(
                f"{name}: {value or 'an empty path'} is outside {root}, the repository this server serves: it writes "
                "only inside it", "usage", file=value or None,
                hint="name a path of this repository (relative to its root), or leave it out for the default")
    return None


class RunbookServer:
    """The MCP handlers; in-process verbs run one at a time in a worker thread."""

    def __init__(self) -> None:
        from runbook.store.project import find_repo_root

        self.children = Children()
        self.verb_lock = anyio.Lock()
        self.root = Path(find_repo_root()).resolve()  # the repository served: every path argument lies in it

    async def shutdown(self) -> None:
        """Let a verb in progress finish; our runs go on (each records itself when it ends)."""
        for proc in list(self.children.procs):
            self.children.let_go(proc, "next")
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(60):
                async with self.verb_lock:
                    pass

    async def list_tools(self, ctx: Context, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool.listing() for tool in TOOLS])

    async def call_tool(self, ctx: Context, params: types.CallToolRequestParams) -> types.CallToolResult:
        """The tool's answer; whatever it raises (a bug, an OS error) is a tool error with the code the
        command line would give, never an exception through the SDK (a JSON-RPC error with code 0)."""
        try:
            return await self._call_tool(ctx, params)
        except Exception as exc:  # cancellation (a BaseException) still goes through
            error = refusal(exc, params.name)
            if error.code == "internal":
                logger.error("tool %s raised", params.name, exc_info=exc)
            return Outcome.refused(params.name, error).tool_result()

    async def _call_tool(self, ctx: Context, params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = BY_NAME.get(params.name)
        if tool is None:
            error = RunbookError(f"no tool {params.name!r}; tools: {', '.join(BY_NAME)}", "usage")
            return Outcome.refused(params.name, error).tool_result()
        try:
            args = tool.args.model_validate(params.arguments or {})
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
            error = RunbookError(f"{tool.name}: bad arguments: {problems}", "usage",
                                 hint=f"see the input schema of the `{tool.name}` tool")
            return Outcome.refused(tool.name, error).tool_result()
        outside = outside_root(args, self.root)
        if outside is not None:
            return Outcome.refused(tool.name, outside).tool_result()
        if isinstance(args, SweepArgs) or (isinstance(args, NextArgs) and args.run):
            seen = 0

            async def report(lines: list[str]) -> None:
                nonlocal seen
                seen += len(lines)
                text = "\n".join(lines)
                if len(text) > PROGRESS_CHARS:
                    text = "[... earlier lines: see the step logs under state/runs/]\n" + text[-PROGRESS_CHARS:]
                await ctx.session.report_progress(seen, None, text)

            outcome = await self.children.run(tool.name, args.argv(), report)
        elif isinstance(args, WaitArgs):
            outcome = await self.wait(args)
        else:
            async with self.verb_lock:
                outcome = await anyio.to_thread.run_sync(call_verb, tool.name, args.cli_kwargs())
        return outcome.tool_result()

    async def wait(self, args: WaitArgs) -> Outcome:
        """`runbook wait`'s own loop (runbook/run/wait.py), each look in a worker thread and the sleeps
        here: it holds no lock and blocks no other call, and a cancelled wait just stops looking."""
        from runbook.contract import WaitResult
        from runbook.run.wait import exit_code, looks, step, workspace

        ws = await anyio.to_thread.run_sync(workspace, args.plan)
        looking = looks(ws, args.run, args.timeout)
        while not isinstance(got := await anyio.to_thread.run_sync(step, looking), WaitResult):
            await anyio.sleep(got)
        return Outcome.of("wait", exit_code(got), got)

    async def list_resources(self, ctx: Context, params: types.PaginatedRequestParams | None
                             ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=await anyio.to_thread.run_sync(list_resources))

    async def list_resource_templates(self, ctx: Context, params: types.PaginatedRequestParams | None
                                      ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
            uri_template=RUN_URI + "{run_id}", name="run", mime_type="application/json",
            description="A run by id (as `history` lists them), as the RunView of docs/json.md.")])

    async def read_resource(self, ctx: Context, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        return await anyio.to_thread.run_sync(read_resource, str(params.uri))


def build_server() -> tuple[Server, RunbookServer]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("runbook-eagle")
    except PackageNotFoundError:
        ours = "0"
    handlers = RunbookServer()
    server = Server(
        "runbook", version=ours, instructions=INSTRUCTIONS,
        on_list_tools=handlers.list_tools, on_call_tool=handlers.call_tool,
        on_list_resources=handlers.list_resources, on_list_resource_templates=handlers.list_resource_templates,
        on_read_resource=handlers.read_resource,
    )
    return server, handlers


async def _serve() -> None:
    server, handlers = build_server()
    async with anyio.create_task_group() as tg:

        async def on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP, signal.SIGINT) as signals:
                async for signum in signals:
                    await handlers.shutdown()
                    os._exit(128 + signum)  # the stdin reader may block forever: leave now

        tg.start_soon(on_signal)
        async with stdio_transport() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
        await handlers.shutdown()
        tg.cancel_scope.cancel()


def serve(root: str | None = None) -> None:
    """Serve MCP over stdio until the client goes away (`runbook mcp`)."""
    if root:
        os.chdir(root)
    if sys.stdin.isatty():
        print(f"runbook mcp: serving {os.getcwd()} to an MCP client on stdin/stdout (JSON-RPC, one message a "
              "line); agent hosts start this themselves (docs/mcp.md). Ctrl-D ends it.", file=sys.stderr)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="runbook mcp: %(levelname)s %(message)s")
    anyio.run(_serve)

