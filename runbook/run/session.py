"""The `runbook next` session: the service behind the verb, the MCP server and the supervisor alike.

`Session(request, talk).main(dry_run)` is one `runbook next`: validate the plan, show the phase
and its resolved commands, ask (`Talk.confirm`), check git, take the run lock, then run the phase
(and, with `until_stop`, what follows) through runbook/run/runner.py, or hand the run to a
supervisor (`detach`: runbook/run/detach.py). The supervisor (runbook/run/supervisor.py) runs the same
`Session.loop` under the lock it adopted. It takes plain typed arguments and talks only through
`Talk` (lines for people, warnings, a yes/no question, where step output goes): no click here;
commands/next.py is the click face over it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

from runbook.errors import RunbookError, warning
from runbook.model import EXIT_CODES, JUDGED, Phase, Plan, RunRecord
from runbook.run.holding import refuse_hand_edits

if TYPE_CHECKING:
    from runbook.contract import DetachedView, NextResult, Selected
    from runbook.run.executor import Interrupts
    from runbook.run.planstate import PlanState
    from runbook.run.runner import RunOptions
    from runbook.run.select import Selection
    from runbook.store.live import LiveRun
    from runbook.store.lock import RunLock
    from runbook.store.sweeps import SweepSpec
    from runbook.store.workspace import Workspace

__all__ = ["MAX_RUNS_PER_PHASE", "Finished", "NextRequest", "Session", "Talk"]

MAX_RUNS_PER_PHASE = 2  # --until-stop: a phase reached a third time in one invocation is a loop


@dataclass(frozen=True)
class NextRequest:
    """What `runbook next` was asked (its options)."""

    plan_opt: str | None = None
    phase_ref: str | None = None
    restart: bool = False
    until_stop: bool = False
    yes: bool = False  # do not ask
    no_commit: bool = False
    as_json: bool = False  # the caller prints one JSON document: never ask, people's lines go to stderr
    sets: tuple[str, ...] = ()  # `--set NAME=VALUE` items
    detach: bool = False  # start a supervisor and return once its run started


def _write(stream: Any, text: str) -> None:
    stream.write(text + "\n")
    stream.flush()


@dataclass
class Talk:
    """How a session talks to whoever runs it; the defaults write to this process's stdout / stderr
    and never ask (a session that must ask without `confirm` is not confirmed)."""

    say: Callable[[str], None] = field(default=lambda msg: _write(sys.stdout, msg))  # lines for people
    warn: Callable[[str], None] = field(default=warning)
    note: Callable[[str], None] = field(default=lambda msg: _write(sys.stderr, msg))  # the plan's problems, as they are
    confirm: Callable[[str], bool] = field(default=lambda _question: False)
    interactive: Callable[[], bool] = field(default=lambda: False)  # there is a terminal to ask on
    echo: Callable[[], BinaryIO | None] = field(default=lambda: sys.stdout.buffer)  # where step output goes live


@dataclass
class Finished:
    """What a session hands back: the `next` result and the exit code."""

    result: NextResult
    exit_code: int


class Session:
    """One `runbook next`: what it was asked (`NextRequest`), how it talks (`Talk`), the runs it made."""

    def __init__(self, request: NextRequest, talk: Talk | None = None) -> None:
        self.request, self.talk = request, talk or Talk()
        self.plan_opt, self.phase_ref, self.restart, self.until_stop = (
            request.plan_opt, request.phase_ref, request.restart, request.until_stop)
        self.yes, self.no_commit, self.as_json = request.yes, request.no_commit, request.as_json
        self.sets = tuple(request.sets)
        self.overrides: dict[str, str] | None = None  # parsed --set; None: not given
        self.runs: list[RunRecord] = []
        self.settled: list[RunRecord] = []  # runs a dead runbook left, recorded by this one
        self.selected: Selected | None = None
        self.detach = request.detach  # this process starts a supervisor and returns (runbook/run/detach.py)
        self.detached: DetachedView | None = None  # once it has
        self.supervisor: dict[str, Any] | None = None  # this process IS the supervisor: run_id, supervisor_log, on_started

    def supervised(self, *, run_id: str, supervisor_log: str, on_started: Callable[[LiveRun], None]) -> None:
        """Run as the supervisor of a detached run (runbook/run/supervisor.py): step output only into the
        logs, the first fresh run under the id the caller chose."""
        self.supervisor = {"run_id": run_id, "supervisor_log": supervisor_log, "on_started": on_started}

    def choose(self, ws: Workspace, plan: Plan, sel: Selection) -> tuple[Selection, Plan, dict[str, str]]:
        """The selection with --set applied: (selection, the plan as it runs, overrides)."""
        from runbook.plan.overrides import check, effective, parse_sets
        from runbook.run import runner

        if self.sets and self.overrides is None:  # the supervisor of a detached run starts here
            self.overrides = parse_sets(self.sets, plan, ws.plan_rel)
        sel, overrides, note = runner.with_overrides(sel, self.overrides)
        if sel.phase is not None and sel.phase.sweep:
            from runbook.run.sweep import refuse_swept_sets

            refuse_swept_sets(plan, sel.phase, self.overrides, ws.plan_rel)
            overrides = dict(self.overrides or {})  # each trial runs from the top with its point: no resumed values
        if note and not (sel.phase is not None and sel.phase.sweep):
            self.say(note)
        if sel.phase is not None:
            for warning in check(plan, sel.phase, overrides):
                self.warn(warning)
        return sel, effective(plan, overrides), overrides

    def say(self, msg: str) -> None:
        self.talk.say(msg)

    def warn(self, msg: str) -> None:
        self.talk.warn(msg)

    def result(self, ws: Workspace, code: int, *, dry_run: bool = False, state: PlanState | None = None) -> Finished:
        from runbook.contract import NextResult, RunView
        from runbook.run.planstate import for_workspace

        state = state or for_workspace(ws, holding_lock=bool(self.runs))
        result = NextResult(
            plan=ws.plan_rel, dry_run=dry_run, selected=self.selected,
            runs=[RunView.of(r, recorded_in=r.commit) for r in self.runs], next=state.next,
            settled=[RunView.of(r, recorded_in=r.commit) for r in self.settled], detached=self.detached,
        )
        return Finished(result, code)

    def load(self) -> tuple[Workspace, Plan]:
        from runbook.store.workspace import Workspace

        ws = Workspace.open(self.plan_opt)
        plan = ws.load_plan()
        for w in ws.warnings:
            self.talk.note(str(w))
        if self.sets:
            from runbook.plan.overrides import parse_sets

            self.overrides = parse_sets(self.sets, plan, ws.plan_rel)
        if self.phase_ref is not None and plan.find_phase(self.phase_ref) is None:
            from runbook.errors import unknown_phase

            raise unknown_phase(plan, self.phase_ref, ws.plan_display)
        return ws, plan

    def nothing(self, ws: Workspace, sel: Selection, state: PlanState) -> Finished:
        """No phase selected: blocked is a refusal; otherwise say why, from PlanState."""
        from runbook.run.planstate import nothing_text

        if sel.blocked:
            raise RunbookError(sel.message, "blocked", hint="run the phases it needs first")
        self.say(nothing_text(state.next))
        return self.result(ws, 0, state=state)

    def main(self, dry_run: bool) -> Finished:
        from runbook.run import runner
        from runbook.run.planstate import for_workspace

        ws, plan = self.load()
        if dry_run or (not self.yes and not self._interactive()):
            state = for_workspace(ws)
            sel = runner.select(ws, plan, phase_ref=self.phase_ref, restart=self.restart, overrides=self.overrides)
            if self.phase_ref is None and not self.restart and state.next.kind == "running":
                self.say(f"not now: {state.next.why}")
                if dry_run:
                    return self.result(ws, 0, dry_run=True, state=state)
            elif sel.phase is None:
                out = self.nothing(ws, sel, state)
                out.result.dry_run = dry_run
                return out
            else:
                sel, running, _ = self.choose(ws, plan, sel)
                self.selected = runner.selected_view(running, sel)
                self.say(runner.render_preview(ws, running, sel))
                if sel.phase is not None and sel.phase.sweep:
                    self.say(self.sweep_preview(ws, sel.phase, self.sweep_spec(ws, plan, sel, quiet=True)))
                if dry_run:
                    self.say("dry run: nothing ran")
                    return self.result(ws, 0, dry_run=True, state=state)
            raise RunbookError(
                "refusing to run without confirmation: " + ("--json never asks" if self.as_json else "no terminal to ask"),
                "confirmation_required",
                hint="pass --yes to run it, or --dry-run to only look",
            )
        from runbook.run.holding import holding_run_lock, may_commit

        commit = may_commit(ws, self.no_commit, self.warn)

        try:
            with holding_run_lock(ws, self.warn, plan, refusal="") as lock:
                if self.detach:
                    return self.start_detached(ws, lock, commit)
                return self.loop(ws, lock, commit)
        except OSError as exc:  # a full disk or a read-only file system under the plan, ledger or lock
            where = f"{exc.filename}: " if exc.filename else ""
            raise RunbookError(
                f"runbook next: {where}{exc.strerror or exc}; stopped, files already written are complete", "io",
                file=str(exc.filename) if exc.filename else None,
            ) from None

    def options(self, commit: bool, interrupts: Interrupts | None, overrides: dict[str, str] | None = None) -> RunOptions:
        from runbook.run import runner

        opts = runner.RunOptions(
            commit=commit,
            echo=None if self.supervisor else self.talk.echo(),
            say=self.say,
            warn=self.warn,
            interrupts=interrupts,
            overrides=dict(overrides or {}),
        )
        if self.supervisor:
            opts.detached = True
            opts.run_id = self.supervisor.pop("run_id", None)  # the first fresh run only
            opts.supervisor_log = self.supervisor["supervisor_log"]
            opts.on_started = self.supervisor["on_started"]
        return opts

    def _has_orphans(self, ws: Workspace) -> bool:
        from runbook.store.live import live_runs, orphans

        if not live_runs(ws.state, ws.plan_rel):
            return False
        ws.ledger_changed()
        return bool(orphans(ws.state, ws.plan_rel, ws.ledger().run_ids()))

    def start_detached(self, ws: Workspace, lock: RunLock, commit: bool) -> Finished:
        """Show what will run, start the supervisor with the lock, return once its run started."""
        from runbook.contract import DetachedView
        from runbook.run import detach, runner
        from runbook.run.planstate import for_workspace
        from runbook.store.ledger import new_run_id
        from runbook.store.live import orphans

        plan = ws.load_plan()
        ws.ledger_changed()  # under the run lock now: look at state/runs/ afresh
        pending = orphans(ws.state, ws.plan_rel, ws.ledger().run_ids())
        sel = runner.select(ws, plan, phase_ref=self.phase_ref, restart=self.restart, overrides=self.overrides)
        if sel.phase is None and not pending:
            return self.nothing(ws, sel, for_workspace(ws, holding_lock=True))
        for live in pending:
            what = ("re-attaches to its Slurm job" if live.executor == "slurm" and live.step
                    else "records it as interrupted")
            self.say(f"run {live.run_id} ({live.phase}) was not recorded: its runbook died; the supervisor {what} first")
        refuse_hand_edits(ws, plan)
        if sel.phase is not None and sel.phase.sweep and not pending:
            raise RunbookError(f"{sel.phase.display_name} runs as a sweep (its `Sweep:` line), which does not run "
                               "detached", "usage", hint="run it in the foreground: runbook next --yes (a sweep "
                               "stopped at any point goes on with the points it had not run)")
        if sel.phase is not None and not pending:
            sel, running, _ = self.choose(ws, plan, sel)
            self.say(runner.render_preview(ws, running, sel))
            self.selected = runner.selected_view(running, sel)
        if not self.yes and not self.talk.confirm("\nRun it in the background?"):
            raise RunbookError("not confirmed: nothing ran", "not_confirmed")
        started = detach.start(ws, lock, plan_opt=self.plan_opt, phase_ref=self.phase_ref, restart=self.restart,
                               until_stop=self.until_stop, no_commit=not commit, run_id=new_run_id(),
                               sets=list(self.sets))
        lines = [
            "",
            f"{'re-attached' if started.reattached else 'started'} run {started.run_id} ({started.phase}) in the "
            f"background: supervisor pid {started.pid}, its log {started.supervisor_log}",
            "  follow it:  runbook logs -f" + (f" --plan {ws.plan_arg}" if ws.plan_arg else ""),
            "  where:      runbook status",
            "  stop it:    runbook cancel",
        ]
        self.say("\n".join(lines))
        self.detached = DetachedView(run_id=started.run_id, phase=started.phase, pid=started.pid,
                                     supervisor_log=started.supervisor_log, reattached=started.reattached)
        return self.result(ws, 0, state=for_workspace(ws))

    def _interactive(self) -> bool:
        return not self.as_json and self.talk.interactive()

    def loop(self, ws: Workspace, lock: RunLock, commit: bool) -> Finished:
        from runbook.run import runner
        from runbook.run.executor import Interrupts
        from runbook.run.planstate import for_workspace

        interrupts: Interrupts | None = None
        counts: dict[str, int] = {}
        code = 0
        try:
            if self._has_orphans(ws):
                refuse_hand_edits(ws, ws.load_plan())  # before the dead run is recorded and committed
                interrupts = Interrupts().__enter__()
                continued, recorded = runner.settle_orphans(ws, lock, self.options(commit, interrupts))
                self.settled += [r.record for r in recorded]
                for result in continued:
                    record = result.record
                    self.runs.append(record)
                    counts[record.phase] = counts.get(record.phase, 0) + 1
                    code = EXIT_CODES[record.verdict]
                    plan = ws.load_plan()
                    phase = plan.find_phase(record.phase)
                    if phase is not None:
                        self.summary(ws, plan, phase, record)
                    if not self.until_stop or record.verdict not in JUDGED or interrupts.signum is not None:
                        return self.result(ws, code)
            while True:
                plan = ws.load_plan()
                for w in ws.warnings:
                    self.talk.note(str(w))
                refuse_hand_edits(ws, plan)  # before a run, and before runs left uncommitted are committed
                first = not self.runs
                if self.sets and self.overrides is None:  # the supervisor of a detached run starts here
                    from runbook.plan.overrides import parse_sets

                    self.overrides = parse_sets(self.sets, plan, ws.plan_rel)
                sel = runner.select(ws, plan, phase_ref=self.phase_ref if first else None,
                                    restart=self.restart and first, overrides=self.overrides)
                if sel.phase is None:
                    if first:
                        runner.commit_unrecorded(ws, self.options(commit, interrupts))
                    state = for_workspace(ws, holding_lock=True)
                    if first:
                        return self.nothing(ws, sel, state)
                    from runbook.run.planstate import nothing_text

                    self.say(nothing_text(state.next))
                    return self.result(ws, code, state=state)
                phase = sel.phase  # the same after choose(), which may change only where it starts
                if counts.get(phase.id, 0) >= MAX_RUNS_PER_PHASE:
                    self.say(f"stopping: {phase.display_name} already ran {counts[phase.id]} times "
                             "in this invocation (the transitions loop); run `runbook next` again to go on")
                    return self.result(ws, code)
                if phase.sweep and self.supervisor:
                    self.say(f"stopping: {phase.display_name} runs as a sweep (its `Sweep:` line), which does not "
                             "run detached; run `runbook next --yes` in the foreground to go on")
                    return self.result(ws, code)
                sel, running, overrides = self.choose(ws, plan, sel)
                self.say(runner.render_preview(ws, running, sel))
                spec = self.sweep_spec(ws, plan, sel) if phase.sweep else None
                if spec is not None:
                    self.say(self.sweep_preview(ws, phase, spec))
                if first and not self.yes:
                    if not self.talk.confirm(
                            f"\nRun {phase.display_name}{' and what follows' if self.until_stop else ''}?"):
                        raise RunbookError("not confirmed: nothing ran", "not_confirmed")
                if first:
                    self.selected = runner.selected_view(running, sel)
                if interrupts is None:
                    interrupts = Interrupts().__enter__()
                if spec is not None:
                    swept = self.run_sweep(ws, phase, spec, lock, commit, interrupts)
                    if swept is None:
                        return self.result(ws, 4)
                    record = swept
                    self.runs.append(record)
                    counts[record.phase] = counts.get(record.phase, 0) + 1
                    code = EXIT_CODES[record.verdict]
                    self.summary(ws, plan, phase, record)
                    if not self.until_stop or interrupts.signum is not None:
                        return self.result(ws, code)
                    continue
                result = runner.run_selected(ws, plan, sel, lock, self.options(commit, interrupts, overrides))
                record = result.record
                self.runs.append(record)
                counts[record.phase] = counts.get(record.phase, 0) + 1
                code = EXIT_CODES[record.verdict]
                self.summary(ws, plan, phase, record)
                if result.problems and (not result.plan_written or result.commit_failed):
                    code = max(code, 2) if code in (0, 1) else code
                if not self.until_stop or record.verdict not in JUDGED or interrupts.signum is not None:
                    return self.result(ws, code)
        finally:
            if interrupts is not None:
                interrupts.__exit__(None, None, None)

    def sweep_spec(self, ws: Workspace, plan: Plan, sel: Selection, quiet: bool = False) -> SweepSpec:
        """The sweep the selected phase's `Sweep:` runs now (new, or the same one continued)."""
        from runbook.run.sweep import spec_for_phase

        assert sel.phase is not None
        spec, _ = spec_for_phase(ws, plan, sel.phase, self.overrides or {}, (lambda _m: None) if quiet else self.say,
                                 restart=sel.mode == "restart")
        return spec

    @staticmethod
    def sweep_preview(ws: Workspace, phase: Phase, spec: SweepSpec) -> str:
        """What a phase with `Sweep:` runs: its points, which are done, and its `Pick:`."""
        from runbook.run.sweep import points_text, trials_of

        return (f"\n{phase.display_name} runs as a sweep (`Sweep: {'; '.join(phase.sweep)}`): each point is a "
                f"trial from its first step; `Pick: {phase.pick}` decides the phase\n"
                + points_text(spec, trials_of(ws, spec), phase.pick))

    def run_sweep(self, ws: Workspace, phase: Phase, spec: SweepSpec, lock: RunLock, commit: bool,
                  interrupts: Interrupts) -> RunRecord | None:
        """Run the selected phase's `Sweep:` as `runbook sweep PHASE --set ... --pick ... --yes` does
        (continuing the same sweep when it was stopped): the record of the pick, or None when the
        sweep stopped before every point ran (its trials are in self.runs)."""
        from runbook.run.sweep import run_locked

        done = run_locked(ws, spec, lock, talk=self.talk, interrupts=interrupts, commit=commit, pick=phase.pick,
                          plan_opt=self.plan_opt)
        self.runs += done.ran
        if done.chosen is None:
            self.say(f"\nsweep {spec.sweep_id} of {phase.display_name} stopped with {len(done.pending)} point(s) "
                     "still to run: `runbook next` goes on with them")
            return None
        return done.chosen

    def summary(self, ws: Workspace, plan: Plan, phase: Phase, record: RunRecord) -> None:
        from runbook.formatting import format_took
        from runbook.run import runner
        from runbook.store.ledger import run_path

        say = self.say
        say("")
        say(f"{phase.display_name} ({phase.title}): {record.verdict} · {record.reason}")
        committed = f", commit {record.commit[:7]}" if record.commit else ""
        say(f"  run {record.run_id}, took {format_took(record.duration_s)}, "
            f"ledger {ws.rel(run_path(ws.state, record.run_id))}{committed}")
        if record.verdict in JUDGED:
            from runbook.run.select import transition

            target = transition(plan, phase, record.verdict)
            field = "On pass" if record.verdict == "pass" else "On fail"
            where = {"stop": "stop", "end": "end of the plan"}.get(target) if isinstance(target, str) else target.display_name
            say(f"  {field}: {where}")
            say("Record what was learned:\n  " + runner.record_command(ws, phase, record, ws.plan_arg))
        elif record.verdict == "inconclusive":
            say("  a metric the criterion needs was not written; fix the step or the Pass: line, then `runbook next`")
        else:
            say("  `runbook next` resumes this phase at its first unfinished step")
