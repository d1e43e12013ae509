"""`runbook next`: run the current phase, judge it, write the results back, commit.

Thin: options, confirmation, printing and exit codes. The work is in `runbook/runner.py`
(-> select.py, execute.py, ledger.py, writeback.py, gitops.py, lock.py).
"""

from __future__ import annotations

import json
import sys

import click

from runbook.model import EXIT_CODES, JUDGED

HELP_EPILOG = """\b
Which phase runs:
  The first phase, then wherever the ledger's verdicts lead: after `pass`/`fail` the phase's
  `On pass:` (default: the next phase) / `On fail:` (default: stop). A phase left `error`,
  `timeout` or `interrupted` resumes at its first unticked step, or reruns from its first step
  when its text changed since (the change is shown). `inconclusive` reruns from the top.
  Every phase in `Needs:` must have passed.

\b
Steps run as `bash -c` in their own process group, cwd = repository root, with
RUNBOOK_RUN_ID, RUNBOOK_PHASE, RUNBOOK_STEP, RUNBOOK_ARTIFACTS and RUNBOOK_METRICS (a JSON
file holding {}; write a flat object of numbers into it). Logs: state/runs/<run>/<step>.log.

\b
Exit codes:
  0  pass (also: nothing left to run)      3  inconclusive
  1  fail                                  4  error / timeout / interrupted
  2  usage or plan errors, refusals        5  the run lock is held by another run
  With --until-stop: the code of the last run's verdict.

\b
Examples:
  runbook next --dry-run            # what would run, nothing runs
  runbook next --yes                # run the current phase without asking
  runbook next --until-stop --yes   # keep going until stop, error or the end
  runbook next --phase 1 --restart  # run Phase 1 again from its first step
"""

MAX_RUNS_PER_PHASE = 2  # --until-stop: a phase reached a third time in one invocation is a loop


@click.command("next", epilog=HELP_EPILOG)
@click.option("--plan", "plan_path", metavar="PATH", type=click.Path(dir_okay=False),
              help="The plan file, when the repository has several.")
@click.option("--phase", "phase_ref", metavar="PHASE",
              help="Run this phase (label `1`, `\"Phase 1\"`, id `phase-1`) instead of the current one.")
@click.option("--restart", is_flag=True, help="Untick the phase's steps and run it from its first step.")
@click.option("--until-stop", is_flag=True,
              help="Keep following transitions until stop, the end, inconclusive, error, timeout or interrupt.")
@click.option("--dry-run", is_flag=True, help="Show the phase and the resolved commands; run nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (needed without a terminal).")
@click.option("--no-commit", is_flag=True, help="Write the results but do not commit them.")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"runs": [run records], "exit_code": N, "message": ...} on stdout; the rest goes to stderr.')
def command(
    plan_path: str | None,
    phase_ref: str | None,
    restart: bool,
    until_stop: bool,
    dry_run: bool,
    yes: bool,
    no_commit: bool,
    as_json: bool,
) -> None:
    """Run the current phase of the plan, judge it, write the verdict back, commit.

    Re-reads the plan, validates it, prints the phase as written and the commands that will run
    (marking commands changed since the phase's last run), asks for confirmation, takes the run
    lock, runs the steps, checks `Pass:` against the metrics they wrote, records the run in
    state/runs/<run-id>.json, updates the phase's status block, checkboxes and results table in
    the plan, and commits exactly those two files.
    """
    code = _main(plan_path, phase_ref, restart, until_stop, dry_run, yes, no_commit, as_json)
    raise click.exceptions.Exit(code)


def _main(plan_path, phase_ref, restart, until_stop, dry_run, yes, no_commit, as_json) -> int:
    from runbook import runner
    from runbook.commands._common import pick_plan_path
    from runbook.lock import LockError, LockHeld, run_lock

    def say(msg: str) -> None:
        click.echo(msg, err=as_json)

    def warn(msg: str) -> None:
        click.echo(f"warning: {msg}", err=True)

    runs: list = []
    message = ""

    def finish(code: int, msg: str = "") -> int:
        if msg:
            if code in (EXIT_CODES["usage"], EXIT_CODES["locked"]):
                click.echo(msg, err=True)
            else:
                say(msg)
        if as_json:
            click.echo(json.dumps(
                {"runs": [r.model_dump(mode="json") for r in runs], "exit_code": code, "message": msg or message},
                indent=2,
            ))
        return code

    try:
        ws = runner.workspace(pick_plan_path(plan_path))
        if dry_run:
            plan, warnings = runner.load_valid(ws)
            for w in warnings:
                click.echo(str(w), err=True)
            sel = runner.select(ws, plan, phase_ref=phase_ref, restart=restart)
            if sel.phase is None:
                return finish(2 if sel.blocked else 0, sel.message)
            say(runner.render_preview(ws, plan, sel))
            return finish(0, "dry run: nothing ran")
        interactive = sys.stdin.isatty() and sys.stdout.isatty()
        if not yes and not interactive:
            plan, _ = runner.load_valid(ws)
            sel = runner.select(ws, plan, phase_ref=phase_ref, restart=restart)
            if sel.phase is None:
                return finish(2 if sel.blocked else 0, sel.message)
            say(runner.render_preview(ws, plan, sel))
            return finish(2, "refusing to run without confirmation: no terminal to ask. "
                             "Pass --yes to run it, or --dry-run to only look.")
        commit = not no_commit
        if commit and not ws.git:
            warn(f"{ws.root} is not a git repository: results are written but not committed")
            commit = False
        if commit:
            from runbook.gitops import GitStateError, check_can_commit

            try:
                check_can_commit(ws.root)
            except GitStateError as exc:
                return finish(2, f"refusing to run: {exc}")
        with run_lock(ws.state, git_dir=ws.git_dir, warn=warn) as lock:
            return _loop(ws, lock, runner, runs, phase_ref, restart, until_stop, yes, commit, as_json, say, warn, finish)
    except LockHeld as exc:
        return finish(EXIT_CODES["locked"], str(exc))
    except LockError as exc:
        return finish(2, str(exc))
    except runner.NextError as exc:
        return finish(exc.code, str(exc))
    except OSError as exc:  # a full disk or a read-only file system under the plan, ledger or lock
        where = f"{exc.filename}: " if exc.filename else ""
        return finish(2, f"runbook next: {where}{exc.strerror or exc}; stopped, files already written are complete")


def _loop(ws, lock, runner, runs, phase_ref, restart, until_stop, yes, commit, as_json, say, warn, finish) -> int:
    from runbook.execute import Interrupts

    interrupts: Interrupts | None = None
    counts: dict[str, int] = {}
    code = 0
    try:
        while True:
            plan, warnings = runner.load_valid(ws)
            for w in warnings:
                click.echo(str(w), err=True)
            sel = runner.select(ws, plan, phase_ref=phase_ref if not runs else None, restart=restart and not runs)
            if sel.phase is None:
                if not runs:
                    return finish(2 if sel.blocked else 0, sel.message)
                say(sel.message)
                return finish(code)
            if counts.get(sel.phase.id, 0) >= MAX_RUNS_PER_PHASE:
                return finish(code, f"stopping: {sel.phase.display_name} already ran {counts[sel.phase.id]} times "
                                    "in this invocation (the transitions loop); run `runbook next` again to go on")
            from runbook.writeback import HandEdited, check_blocks

            try:
                check_blocks(plan.text, sel.phase, ws.plan_rel)
            except HandEdited as exc:
                return finish(2, f"refusing to run: {exc}")
            say(runner.render_preview(ws, plan, sel))
            if not runs and not yes:
                if not click.confirm(f"\nRun {sel.phase.display_name}{' and what follows' if until_stop else ''}?",
                                     default=True, err=as_json):
                    return finish(2, "not confirmed: nothing ran")
            if interrupts is None:
                interrupts = Interrupts().__enter__()
            opts = runner.RunOptions(
                commit=commit,
                echo=(sys.stderr if as_json else sys.stdout).buffer,
                say=say,
                warn=warn,
                interrupts=interrupts,
            )
            result = runner.run_selected(ws, plan, sel, lock, opts)
            record = result.record
            runs.append(record)
            counts[record.phase] = counts.get(record.phase, 0) + 1
            code = EXIT_CODES[record.verdict]
            _summary(ws, plan, sel.phase, record, result, say, runner)
            if result.problems and not result.plan_written:
                code = max(code, 2) if code in (0, 1) else code
            if not until_stop or record.verdict not in JUDGED or interrupts.signum is not None:
                return finish(code)
    finally:
        if interrupts is not None:
            interrupts.__exit__(None, None, None)


def _summary(ws, plan, phase, record, result, say, runner) -> None:
    took = f"{record.duration_s:.1f}s" if record.duration_s is not None else "?"
    say("")
    say(f"{phase.display_name} ({phase.title}): {record.verdict} · {record.reason}")
    committed = f", commit {record.commit[:7]}" if record.commit else ""
    say(f"  run {record.run_id}, took {took}, ledger {ws.rel(ledger_path(ws, record))}{committed}")
    if record.verdict in JUDGED:
        from runbook.select import transition

        target = transition(plan, phase, record.verdict)
        field = "On pass" if record.verdict == "pass" else "On fail"
        where = {"stop": "stop", "end": "end of the plan"}.get(target) if isinstance(target, str) else target.display_name
        say(f"  {field}: {where}")
        several = len(_plans(ws)) > 1
        say("Record what was learned:\n  " + runner.record_command(ws, phase, record, ws.plan_rel if several else None))
    elif record.verdict == "inconclusive":
        say("  a metric the criterion needs was not written; fix the step or the Pass: line, then `runbook next`")
    else:
        say("  `runbook next` resumes this phase at its first unfinished step")


def ledger_path(ws, record):
    from runbook.ledger import run_path

    return run_path(ws.state, record.run_id)


def _plans(ws) -> list:
    from runbook.project import ConfigError, discover_plans

    try:
        return discover_plans(ws.root)
    except ConfigError:
        return []
