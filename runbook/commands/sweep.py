"""`runbook sweep PHASE --set k=v1,v2 ...`: the phase run once per point, as trials; `--pick` chooses one.

Thin: options and the terminal. The work is runbook/run/sweep.py's (-> runner.py, the same run,
record and commit as `runbook next --phase P --restart --set ... --yes`).
"""

from __future__ import annotations

import click

from runbook.commands._options import json_option, plan_option
from runbook.commands._output import Output

HELP_EPILOG = """\b
Each point is one run of the phase with those `--set` values (a trial): recorded in state/runs/,
written into the phase's results table, committed, shown by history, diff and plot, but it does
NOT become the phase's verdict. The phase keeps the verdict it had until one trial is chosen:
`--pick best:METRIC` once every point ran (best: the direction the phase's Pass: compares METRIC
in; max:METRIC / min:METRIC say it), or `runbook choose RUN` later. The choice is recorded as a
run of its own that names the trial; status and brief say which run decides each phase and why.

\b
Resumable: the sweep's points are kept in state/sweeps/<sweep-id>.json; which are done is read
from the ledger. A sweep stopped at any moment (Ctrl-C, kill -9) goes on with the points not yet
run when the same command runs again, or with `runbook sweep --resume`.

\b
Exit codes: 0 every point ran (and the picked trial passed), 1 the picked trial failed,
3 it was inconclusive, 4 a trial ended error / timeout / interrupted or the sweep was stopped,
2 usage or refusals, 5 the run lock is held.

\b
Examples:
  runbook sweep 1 --set lr=0.003,0.01,0.03 --set hidden=8,64 --yes      # a 3x2 grid: 6 trials
  runbook sweep 1 --point 'lr=0.01,hidden=8' --point 'lr=0.1,hidden=64' --yes
  runbook sweep 1 --set lr=0.003,0.01,0.03 --pick best:val_acc --yes  # and decide the phase
  runbook sweep --resume --yes                                        # go on after a kill
  runbook sweep --resume --pick best:val_acc --yes                    # pick in the latest sweep, after the fact
  runbook sweep 1 --set lr=0.003,0.01 --jobs 4 --yes                  # Executor: slurm: 4 jobs at once
  runbook choose 20261204-081500-ab12                                 # this trial decides
"""


@click.command("sweep", epilog=HELP_EPILOG)
@click.argument("phase_ref", metavar="[PHASE]", required=False)
@plan_option
@click.option("--set", "sets", metavar="NAME=V1,V2,...", multiple=True,
              help="A grid axis: the plan var NAME takes each value (repeatable: the grid is the product).")
@click.option("--point", "points", metavar="NAME=V,NAME2=V2", multiple=True,
              help="One explicit point (repeatable); runs after the grid's points.")
@click.option("--pick", metavar="best:METRIC", help="Once every point ran, make the best trial the phase's verdict "
              "(best:, max: or min:METRIC).")
@click.option("--jobs", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Trials at once (Executor: slurm submits this many jobs together; locally one after another "
                   "unless more are allowed here).")
@click.option("--resume", is_flag=True, help="Continue an unfinished sweep (the latest, or the one --sweep names).")
@click.option("--sweep", "sweep_id", metavar="SWEEP_ID", help="With --resume: the sweep to continue.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (needed without a terminal, and with --json).")
@click.option("--no-commit", is_flag=True, help="Write the results but do not commit them.")
@json_option
def command(phase_ref: str | None, plan_opt: str | None, sets: tuple[str, ...], points: tuple[str, ...],
            pick: str | None, jobs: int, resume: bool, sweep_id: str | None, yes: bool, no_commit: bool,
            as_json: bool) -> Output:
    """Run PHASE once per point of a grid (or of explicit points), each run a trial of the phase."""
    from runbook.commands._talk import cli_talk
    from runbook.contract import RunView, SweepPoint, SweepResult
    from runbook.run.planstate import for_workspace
    from runbook.run.sweep import SweepRequest, exit_code, run_sweep
    from runbook.store.sweeps import sweep_path
    from runbook.store.workspace import Workspace

    request = SweepRequest(plan_opt=plan_opt, phase_ref=phase_ref, sets=sets, points=points, pick=pick, jobs=jobs,
                           resume=resume, sweep_id=sweep_id, yes=yes, no_commit=no_commit, as_json=as_json)
    talk = cli_talk(as_json)
    done = run_sweep(request, talk)
    ws = Workspace.open(plan_opt)
    state = for_workspace(ws)
    by_index = {t.trial.index: t for t in done.trials if t.trial is not None}
    spec = done.spec
    result = SweepResult(
        sweep_id=spec.sweep_id, plan=spec.plan, phase=spec.phase, spec=ws.rel(sweep_path(ws.state, spec.sweep_id)),
        resumed=done.resumed, interrupted=done.interrupted,
        points=[SweepPoint(index=i, point=p, run=RunView.of(by_index[i]) if i in by_index else None)
                for i, p in enumerate(spec.points, 1)],
        ran=[r.run_id for r in done.ran], pending=len(done.pending), pick=spec.pick,
        chosen=RunView.of(done.chosen, recorded_in=done.chosen.commit) if done.chosen else None, next=state.next,
    )
    tail = [f"\nsweep {spec.sweep_id}: {len(done.trials)}/{len(spec.points)} point(s) ran"
            + (f", {len(done.pending)} still to run (runbook sweep --resume)" if done.pending else "")]
    if done.chosen is None and not done.pending:
        tail.append(f"  no trial decides {spec.phase} yet: runbook choose RUN, or --pick best:METRIC")
    tail.append(f"next ({state.next.kind}): {state.next.command or state.next.why}")
    talk.say("\n".join(tail))
    return Output(result, exit_code(done), None)
