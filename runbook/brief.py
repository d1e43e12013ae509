"""The handoff for a new agent or engineer, made from the plan, the notes and the ledger alone.

`build_brief` gathers a `Brief` (the documented schema of `runbook brief --json`, see
docs/brief.md); `render_brief` turns it into Markdown with the jinja2 templates in templates/,
in a fixed order, cut to a size limit by dropping older milestones first and never the next action.
`plan_state` (where the plan stands, what runs next) is shared with `runbook record`'s status block.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict

from runbook.model import Compare, Expr, Phase, Plan, RunRecord
from runbook.notes import (
    MilestoneEntry,
    read_framing,
    read_lessons,
    read_milestones,
    read_next_steps,
)
from runbook.templates import format_number, render

BRIEF_SCHEMA_VERSION = 1
DEFAULT_MAX_CHARS = 6000
PENDING = "pending"


# ---- the schema of `runbook brief --json` ---------------------------------------------------------


class PhaseRow(BaseModel):
    """One row of the phase table."""

    model_config = ConfigDict(extra="forbid")

    label: str  # "Phase 1"
    id: str  # "phase-1"
    title: str
    estimate: str | None = None
    verdict: str  # a verdict word, or "pending" when the phase never ran
    run_id: str | None = None  # its latest run
    finished: str | None = None
    key_metrics: dict[str, float] = {}  # the metrics its criterion names, from its latest run
    reason: str = ""


class LastRun(BaseModel):
    """The most recent run of this plan and what went wrong in it."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    phase: str
    label: str
    verdict: str
    started: str
    finished: str | None = None
    duration_s: float | None = None
    commit: str | None = None
    criterion: str | None = None
    reason: str = ""
    metrics: dict[str, float] = {}  # merged metrics without the "<step-id>.<name>" copies
    failures: list[str] = []  # "accept_len 1.31 >= 1.5 is false", "step-2 exited 3: `cmd`"


class StepLine(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    text: str
    command: str  # vars resolved, exactly what will run
    done: bool


class NextAction(BaseModel):
    """What to do next. Always present; `command` is None when the plan is complete ("done") or a
    `Needs:` is unmet ("blocked"; `why` says what to run first)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["run", "resume", "retry", "blocked", "done"]
    why: str
    phase: str | None = None  # phase id
    label: str | None = None  # "Phase 1"
    title: str | None = None
    estimate: str | None = None
    goal: str = ""
    steps: list[StepLine] = []
    criterion: str | None = None
    command: str | None = None  # the exact shell command to continue


class Brief(BaseModel):
    """`runbook brief --json`. Fields appear in the text brief in this order."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = BRIEF_SCHEMA_VERSION
    plan: str  # repo-relative path of the plan
    notes: str | None = None  # repo-relative path of the notes document
    title: str | None = None
    goal: str = ""  # the plan's preamble prose
    framing: str = ""  # the notes' prose before their owned sections
    status: str = ""  # one line: where the plan stands
    phases: list[PhaseRow] = []
    last_run: LastRun | None = None
    milestones: list[MilestoneEntry] = []  # newest last
    milestones_omitted: int = 0  # older milestones dropped to fit max_chars
    lessons: list[str] = []
    lessons_omitted: int = 0
    next_steps: list[str] = []  # the notes' "Next steps"
    next: NextAction
    max_chars: int | None = None
    truncated: bool = False  # something besides whole milestones/lessons had to be cut


class PlanState(BaseModel):
    """Where a plan stands: its phase table, its last run and what runs next."""

    phases: list[PhaseRow]
    last_run: LastRun | None
    next: NextAction
    status: str


# ---- criteria and runs ----------------------------------------------------------------------------


def _compares(expr: Expr) -> list[Compare]:
    if isinstance(expr, Compare):
        return [expr]
    if expr.kind == "not":
        return _compares(expr.item)  # type: ignore[union-attr]
    out: list[Compare] = []
    for item in expr.items:  # type: ignore[union-attr]
        out.extend(_compares(item))
    return out


def _criterion_expr(text: str | None, phase: Phase | None) -> Expr | None:
    """The criterion a run was judged by: its own text when it parses, else the plan's."""
    if text:
        from runbook.criteria import CriterionError, parse_criterion

        try:
            return parse_criterion(text)
        except CriterionError:
            pass
    if phase is not None and phase.criterion is not None:
        return phase.criterion.expr
    return None


def judge_leaves(expr: Expr, metrics: dict[str, float]) -> list[tuple[str, str]]:
    """Each comparison of `expr` against `metrics`: (verdict, "accept_len 1.31 >= 1.5 is false")."""
    from runbook.criteria import evaluate

    out: list[tuple[str, str]] = []
    for leaf in _compares(expr):
        judgement = evaluate(leaf, metrics)
        word = {"pass": "true", "fail": "false"}.get(judgement.verdict, "unknown (metric missing)")
        out.append((judgement.verdict, f"{judgement.explanation} is {word}"))
    return out


def _metric_names(expr: Expr | None) -> list[str]:
    if expr is None:
        return []
    from runbook.criteria import metric_names

    return metric_names(expr)


def top_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Merged metrics without the per-step "<step-id>.<name>" copies."""
    return {k: v for k, v in metrics.items() if not re.match(r"^step-[^.]+\.", k)}


def _failures(record: RunRecord, expr: Expr | None) -> list[str]:
    failures: list[str] = []
    if record.verdict in ("fail", "inconclusive") and expr is not None:
        leaves = judge_leaves(expr, record.metrics)
        wanted = "fail" if record.verdict == "fail" else "inconclusive"
        failures = [text for verdict, text in leaves if verdict == wanted] or [text for _v, text in leaves]
    for step in record.steps:
        if step.skipped:
            continue
        if step.exit_code not in (0, None):
            failures.append(f"{step.step_id} exited {step.exit_code}: `{step.command}`")
            failures.extend(f"    {line}" for line in step.log_tail[-3:] if line.strip())
        elif step.started and step.exit_code is None and record.verdict in ("timeout", "interrupted"):
            failures.append(f"{step.step_id} was running when the run ended ({record.verdict}): `{step.command}`")
    if not failures and record.verdict not in ("pass",) and record.reason:
        failures.append(record.reason)
    return failures


def _label(phase: Phase) -> str:
    return f"Phase {phase.label}"


def _continue(plan_arg: str | None, *extra: str) -> str:
    parts = ["runbook", "next"]
    if plan_arg:
        parts += ["--plan", plan_arg]
    parts += list(extra)
    parts.append("--yes")
    return " ".join(parts)


def _resolved_steps(plan: Plan, phase: Phase) -> list[StepLine]:
    from runbook.resolve import resolve_command

    lines = []
    for step in phase.steps:
        try:
            command = resolve_command(step.command, plan.vars)
        except Exception:  # a bad placeholder is `runbook validate`'s to report; show it as written
            command = step.command
        lines.append(StepLine(id=step.id, text=step.text, command=command, done=step.done))
    return lines


def _next_action(plan: Plan, runs: list[RunRecord], plan_arg: str | None) -> NextAction:
    """What `runbook next` would do (runbook/select.py decides), as the brief's next action."""
    from runbook.select import select_phase
    from runbook.writeback import phase_text_hash

    selection = select_phase(plan, runs, current_hash=lambda phase: phase_text_hash(plan.text, phase))
    target = selection.phase
    last = selection.last
    if target is not None:
        kind = "resume" if selection.mode == "resume" else "run"
        command = _continue(plan_arg)
        done_before = selection.start
    elif selection.blocked:
        return NextAction(kind="blocked", why=selection.message)
    elif last is not None and last.verdict == "fail" and plan.find_phase(last.phase) is not None:
        target = plan.find_phase(last.phase)
        assert target is not None
        kind = "retry"
        command = _continue(plan_arg, "--phase", target.id, "--restart")
        done_before = 0
        selection.message = (
            f"{_label(target)} failed (run {last.run_id}) and the plan stops there: fix the cause "
            "(see the failures and lessons above), then run the phase again from its first step."
        )
    else:
        return NextAction(kind="done", why=selection.message or "nothing to run")
    steps = _resolved_steps(plan, target)
    for index, step in enumerate(steps):
        step.done = index < done_before
    return NextAction(
        kind=kind,  # type: ignore[arg-type]
        why=selection.message,
        phase=target.id,
        label=_label(target),
        title=target.title,
        estimate=target.estimate,
        goal=target.goal.strip(),
        steps=steps,
        criterion=_criterion_text(target.criterion.text) if target.criterion else None,
        command=command,
    )


def plan_state(plan: Plan, plan_rel: str, runs: list[RunRecord], plan_arg: str | None = None) -> PlanState:
    """The phase table, the last run and the next action. `runs`: the ledger, oldest first."""
    by_id = {p.id: p for p in plan.phases}
    mine = [r for r in runs if r.plan == plan_rel and r.phase in by_id]
    latest: dict[str, RunRecord] = {}
    for record in mine:
        latest[record.phase] = record
    rows: list[PhaseRow] = []
    for phase in plan.phases:
        record = latest.get(phase.id)
        names = _metric_names(phase.criterion.expr if phase.criterion else None)
        if record is not None:
            shown = {n: record.metrics[n] for n in names if n in record.metrics}
            if not names:
                shown = dict(list(top_metrics(record.metrics).items())[:4])
            rows.append(
                PhaseRow(
                    label=_label(phase),
                    id=phase.id,
                    title=phase.title,
                    estimate=phase.estimate,
                    verdict=record.verdict,
                    run_id=record.run_id,
                    finished=record.finished,
                    key_metrics=shown,
                    reason=record.reason,
                )
            )
        else:
            status = phase.status
            rows.append(
                PhaseRow(
                    label=_label(phase),
                    id=phase.id,
                    title=phase.title,
                    estimate=phase.estimate,
                    verdict=status.verdict if status else PENDING,
                    run_id=status.run_id if status else None,
                    reason=(status.summary or "") if status else "",
                )
            )
    last = mine[-1] if mine else None
    last_run = None
    if last is not None:
        phase = by_id[last.phase]
        expr = _criterion_expr(last.criterion, phase)
        last_run = LastRun(
            run_id=last.run_id,
            phase=last.phase,
            label=_label(phase),
            verdict=last.verdict,
            started=last.started,
            finished=last.finished,
            duration_s=last.duration_s,
            commit=last.commit or last.commit_before,
            criterion=_criterion_text(last.criterion or (phase.criterion.text if phase.criterion else None)),
            reason=last.reason,
            metrics=top_metrics(last.metrics),
            failures=_failures(last, expr),
        )
    action = _next_action(plan, mine, plan_arg)
    if action.kind in ("done", "blocked"):
        status = action.why.split(":")[0]
    elif last_run is None:
        status = f"not started; next: {action.label} ({action.phase})"
    else:
        status = f"last run {last_run.label} {last_run.verdict}; next: {action.label} ({action.phase}), {action.kind}"
    return PlanState(phases=rows, last_run=last_run, next=action, status=status)


def headline(plan: Plan, plan_rel: str, runs: list[RunRecord], state: PlanState) -> list[str]:
    """Headline metrics against the goal: the next (or last) phase's criterion, latest values."""
    phase = plan.find_phase(state.next.phase) if state.next.phase else None
    if phase is None and state.last_run is not None:
        phase = plan.find_phase(state.last_run.phase)
    if phase is None or phase.criterion is None:
        return []
    latest: dict[str, float] = {}
    for record in runs:
        if record.plan == plan_rel:
            latest.update(top_metrics(record.metrics))
    leaves = judge_leaves(phase.criterion.expr, latest)
    goal = _criterion_text(phase.criterion.text)
    return [f"Goal of {_label(phase)} (`{goal}`): " + " · ".join(t for _v, t in leaves)]


def status_block(plan: Plan, plan_rel: str, runs: list[RunRecord], updated: str) -> str:
    """The inner Markdown of the notes' status block (templates/notes-status.md.j2)."""
    state = plan_state(plan, plan_rel, runs)
    nxt = state.next
    current = f"{nxt.label} (`{nxt.phase}`), {nxt.title} — {nxt.kind}" if nxt.phase else nxt.why
    verdicts = [f"{row.label} {row.verdict}" for row in state.phases]
    return render(
        "notes-status.md.j2",
        updated=updated,
        current=current,
        verdicts=verdicts,
        headline=headline(plan, plan_rel, runs, state),
    )


# ---- building and rendering -----------------------------------------------------------------------


def plan_preamble(plan: Plan) -> tuple[str | None, str]:
    """(H1 title, prose) between the front matter and the first phase heading."""
    text = plan.text
    start = plan.front_matter_span.end
    end = plan.phases[0].span.start if plan.phases else len(text)
    prose = text[start:end].replace("\r\n", "\n").strip("\n")
    title = None
    lines = prose.split("\n")
    if lines and re.match(r"^ {0,3}# ", lines[0]):
        title = lines[0].lstrip(" #").strip()
        lines = lines[1:]
    return title, "\n".join(lines).strip()


def build_brief(
    plan: Plan,
    plan_rel: str,
    runs: list[RunRecord],
    notes_text: str | None = None,
    notes_rel: str | None = None,
    plan_arg: str | None = None,
) -> Brief:
    """Everything the brief says, uncut. `plan_arg`: pass to `--plan` in the continue command."""
    state = plan_state(plan, plan_rel, runs, plan_arg)
    heading_title, goal = plan_preamble(plan)
    notes_text = notes_text or ""
    return Brief(
        plan=plan_rel,
        notes=notes_rel,
        title=plan.title or heading_title,
        goal=goal,
        framing=read_framing(notes_text) if notes_text else "",
        status=state.status,
        phases=state.phases,
        last_run=state.last_run,
        milestones=read_milestones(notes_text),
        lessons=read_lessons(notes_text),
        next_steps=read_next_steps(notes_text),
        next=state.next,
    )


def _metrics_text(metrics: dict[str, float], sep: str) -> str:
    return sep.join(f"{name} {format_number(value)}" for name, value in metrics.items())


def _criterion_text(text: str | None) -> str | None:
    return text.strip().strip("`").strip() if text else text


def _render_parts(brief: Brief) -> tuple[str, str]:
    context = {"b": brief, "num": format_number, "metrics": _metrics_text}
    head = render("brief-head.md.j2", **context)
    tail = render("brief-next.md.j2", **context)
    return head.rstrip("\n") + "\n", tail.rstrip("\n") + "\n"


def _shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit("\n", 1)[0] if "\n" in text[:limit] else text[:limit]
    return cut.rstrip() + " …"


def fit_brief(brief: Brief, max_chars: int = DEFAULT_MAX_CHARS) -> tuple[Brief, str]:
    """Cut `brief` to `max_chars` of Markdown: oldest milestones first, then long prose, then
    oldest lessons; the next action and the continue command are never cut."""
    brief = brief.model_copy(deep=True)
    brief.max_chars = max_chars

    def text() -> str:
        head, tail = _render_parts(brief)
        return head + "\n" + tail

    while brief.milestones and len(text()) > max_chars:
        brief.milestones.pop(0)
        brief.milestones_omitted += 1
    for field, limit in (("framing", 600), ("goal", 600), ("framing", 0), ("goal", 200)):
        if len(text()) > max_chars and len(getattr(brief, field)) > limit:
            setattr(brief, field, _shorten(getattr(brief, field), limit) if limit else "")
            brief.truncated = True
    while brief.next_steps and len(text()) > max_chars:
        brief.next_steps.pop()
        brief.truncated = True
    while brief.lessons and len(text()) > max_chars:
        brief.lessons.pop(0)
        brief.lessons_omitted += 1
    head, tail = _render_parts(brief)
    if len(head) + 1 + len(tail) > max_chars:
        brief.truncated = True
        marker = f"\n… (cut to fit --max-chars {max_chars})\n"
        room = max(0, max_chars - len(tail) - len(marker) - 1)
        head = _shorten(head, room) + marker
    return brief, head + "\n" + tail


def render_brief(brief: Brief, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    return fit_brief(brief, max_chars)[1]
