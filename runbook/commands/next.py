"""`runbook next`: run the current phase, judge it, write the results back, commit.

Thin: options, the terminal (confirmation, printing). The session is runbook/run/session.py's (->
runner.py -> select.py, local.py, ledger.py, writeback.py, gitops.py, lock.py); what comes next is
runbook/run/planstate.py's.
"""

from __future__ import annotations

import click

from runbook.commands._options import json_option, plan_option
from runbook.commands._output import Output

HELP_EPILOG = """\b
Which phase runs:
  The first phase, then wherever the ledger's verdicts lead: after `pass`/`fail` the phase's
  `On pass:` (default: the next phase) / `On fail:` (default: stop). A phase whose run ended
  `error`, `timeout` or `interrupted` resumes at its first unticked step (or reruns from step 1
  when its text changed); `inconclusive` reruns from the top. A verdict judged under commands or
  a `Pass:` the phase no longer has is stale: the phase runs again. A phase run out of order with
  --phase does not move the plan: an unfinished one is resumed on its own only when the flow has
  nothing else left. The same error, timeout or inconclusive twice in a row with nothing changed
  is not run a third time (--phase ID runs it anyway). Every phase in `Needs:` must have passed.
  `runbook status` and `runbook brief` show the same next action. A phase with `Sweep:` runs
  as that sweep (`runbook sweep PHASE --set ... --pick ... --yes`: one trial per point, then its
  `Pick:` decides the phase; a stopped sweep goes on with the points it had not run).

\b
Steps run as `bash -c` in their own process group, cwd = repository root, with
RUNBOOK_RUN_ID, RUNBOOK_PHASE, RUNBOOK_STEP, RUNBOOK_ARTIFACTS and RUNBOOK_METRICS (a JSON
file holding {}; write a flat object of numbers into it). Logs: state/runs/<run>/<step>.log.

\b
Exit codes:
  0  pass (also: nothing left to run)      3  inconclusive
  1  fail                                  4  error / timeout / interrupted
  2  usage or plan errors, refusals        5  the run lock is held by another run
  With --until-stop: the code of the last run's verdict. Nothing to run exits 0 whether the plan
  finished, stopped after a fail or holds back a repeated failure; --json tells them apart
  (next.outcome: finished, failed, repeated).

\b
Examples:
  runbook next --dry-run            # what would run, nothing runs
  runbook next --yes                # run the current phase without asking
  runbook next --until-stop --yes   # keep going until stop, error or the end
  runbook next --phase 1 --restart  # run Phase 1 again from its first step
  runbook next --detach --yes       # run it in the background; `runbook logs -f`, `runbook cancel`
  runbook next --phase 2 --restart --set lr=3e-4 --yes   # an experiment: one var changed
"""

@click.command("next", epilog=HELP_EPILOG)
@plan_option
@click.option("--phase", "phase_ref", metavar="PHASE",
              help="Run this phase (label `1`, `\"Phase 1\"`, id `phase-1`) instead of the current one.")
@click.option("--restart", is_flag=True, help="Untick the phase's steps and run it from its first step.")
@click.option("--until-stop", is_flag=True,
              help="Keep following transitions until stop, the end, inconclusive, error, timeout or interrupt.")
@click.option("--dry-run", is_flag=True, help="Show the phase and the resolved commands; run nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (needed without a terminal, and with --json).")
@click.option("--no-commit", is_flag=True, help="Write the results but do not commit them.")
@click.option("--detach", is_flag=True,
              help="Run under a supervisor that outlives this command (own session); follow it with "
                   "`runbook status`, `runbook logs -f`, stop it with `runbook cancel`.")
@click.option("--set", "sets", metavar="NAME=VALUE", multiple=True,
              help="Use this value for the plan var NAME in this run (repeatable); the plan is not changed, the "
                   "run record keeps every var value it used.")
@json_option
def command(
    plan_opt: str | None,
    phase_ref: str | None,
    restart: bool,
    until_stop: bool,
    dry_run: bool,
    yes: bool,
    no_commit: bool,
    detach: bool,
    as_json: bool,
    sets: tuple[str, ...] = (),
) -> Output:
    """Run the current phase of the plan, judge it, write the verdict back, commit.

    Re-reads the plan, validates it, prints the phase as written and the commands that will run
    (marking commands changed since the phase's last run), asks for confirmation, takes the run
    lock, runs the steps, checks `Pass:` against the metrics they wrote, records the run in
    state/runs/<run-id>.json, updates the phase's status block, checkboxes and results table in
    the plan, and commits exactly those two files. Step output goes to stderr under --json.
    """
    from runbook.commands._talk import cli_talk
    from runbook.run.session import NextRequest, Session

    request = NextRequest(plan_opt=plan_opt, phase_ref=phase_ref, restart=restart, until_stop=until_stop, yes=yes,
                          no_commit=no_commit, as_json=as_json, sets=tuple(sets), detach=detach)
    talk = cli_talk(as_json)
    finished = Session(request, talk).main(dry_run)
    return Output(finished.result, finished.exit_code, None)
