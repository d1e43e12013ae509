"""Before a phase runs: is every file its `Inputs:` names what the deciding run of the phase that
makes it (`Outputs:`) left there? A sweep's trials, or any later run, overwrite outputs; a phase
that reads them must not silently measure another run's model.

The rule: a phase reads another phase's output only when it names the path in `Inputs:` (runbook
does not guess from commands). The file's identity now (runbook/store/outputs.py: size, mtime, xxh128)
must equal the one recorded by the phase's latest deciding run (a chosen trial: the record of the
choice carries the trial's outputs). Otherwise the run is refused before it starts, naming the
run that did make what is there (matched by hash among the phase's runs, trials included) and
the run that decides, with the fix.
"""

from __future__ import annotations

from runbook.errors import RunbookError
from runbook.model import Phase, Plan, RunRecord
from runbook.store.workspace import Workspace

__all__ = ["refuse_stale_inputs", "stale_inputs"]


def _made_by(runs: list[RunRecord], path: str, digest: str | None) -> RunRecord | None:
    for run in reversed(runs):
        if run.decision is None and any(o.path == path and o.hash == digest for o in run.outputs):
            return run
    return None


def _who(run: RunRecord) -> str:
    if run.trial is not None:
        return f"run {run.run_id} (trial {run.trial.index}/{run.trial.of} of sweep {run.trial.sweep})"
    return f"run {run.run_id}"


def stale_inputs(ws: Workspace, plan: Plan, phase: Phase, quick: bool = False) -> tuple[list[str], list[str]]:
    """(one line per input that is not the deciding run's output, the fixes). `quick` (status, brief):
    an input whose kind, size, mtime and file count are the recorded ones counts as the deciding
    run's without reading its bytes; any difference is settled by the hash, as `runbook next` does."""
    from runbook.plan.outputs import output_paths
    from runbook.store.outputs import identity

    wanted = output_paths(phase.inputs, plan.vars)
    if not wanted:
        return [], []
    makers = {path: p for p in plan.phases for path in output_paths(p.outputs, plan.vars)}
    latest = {r.phase: r for r in ws.latest_runs()}
    problems: list[str] = []
    fixes: list[str] = []
    plan_arg = f" --plan {ws.plan_arg}" if ws.plan_arg else ""
    for path in wanted:
        maker = makers.get(path)
        if maker is None:
            continue  # validate refuses such a plan
        deciding = latest.get(maker.id)
        if deciding is None:
            problems.append(f"{path}: {maker.display_name}, which makes it, has no run yet")
            fixes.append(f"runbook next --phase {maker.id}{plan_arg} --yes")
            continue
        by, how = deciding.deciding()
        want = next((o for o in deciding.outputs if o.path == path), None)
        if want is None or want.kind == "missing":
            problems.append(f"{path}: run {by}, which decides {maker.display_name} ({how}), recorded no such output "
                            "(it ran before `Outputs:` named it, or left nothing there)")
            fixes.append(f"runbook next --phase {maker.id} --restart{plan_arg} --yes")
            continue
        if quick:
            seen = identity(ws.root, path, with_hash=False)
            if (seen.kind, seen.size, seen.mtime, seen.files) == (want.kind, want.size, want.mtime, want.files):
                continue
        now = identity(ws.root, path)
        if now.kind == want.kind and now.hash == want.hash:
            continue
        runs, _ = ws.ledger().runs(ws.plan_rel, maker.id)
        other = _made_by(runs, path, now.hash) if now.kind != "missing" else None
        there = ("is missing" if now.kind == "missing" else
                 f"was made by {_who(other)}" if other is not None else
                 f"({now.hash}) matches no recorded run of {maker.display_name}")
        problems.append(f"{path} {there}, not by run {by}, which decides {maker.display_name} ({how}; "
                        f"recorded {want.hash})")
        kept = want.kept is not None
        if other is not None and other.verdict in ("pass", "fail", "inconclusive"):
            fixes.append(f"runbook choose {other.run_id}{plan_arg}   # that run decides {maker.display_name} "
                         "(what is in place is its)")
        if kept:
            fixes.append(f"runbook choose {by}{plan_arg}   # puts run {by}'s kept outputs back")
        fixes.append(f"runbook next --phase {maker.id} --restart{plan_arg} --yes   # make them again")
    return problems, list(dict.fromkeys(fixes))


def refuse_stale_inputs(ws: Workspace, plan: Plan, phase: Phase) -> None:
    """RunbookError(inputs_stale) naming each input that is not its deciding run's, and the fixes."""
    problems, fixes = stale_inputs(ws, plan, phase)
    if problems:
        raise RunbookError(
            f"refusing to run {phase.display_name}: its `Inputs:` are not what the deciding runs made:\n  "
            + "\n  ".join(problems), "inputs_stale", file=ws.plan_rel,
            hint="one of:\n  " + "\n  ".join(fixes))
