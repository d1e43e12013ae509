"""The handoff for a new agent or engineer, made from the plan, the notes and the ledger alone.

`build_brief` gathers a `contract.Brief` (the schema of `runbook brief --json`, docs/brief.md):
where the plan stands and THE next action come from runbook/run/planstate.py, the rest from the plan's
preamble and the notes. `render_brief` turns it into Markdown with the jinja2 templates in
templates/, in a fixed order, cut to a size limit by dropping older milestones first and never the
next action. Every line of the brief stands on its own: nothing says "see above", so a cut section
leaves no dangling reference.

`status_block` renders the notes' status block for `runbook record` from the same PlanState.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from runbook.contract import Brief, MilestoneText, NoteStep, top_metrics
from runbook.formatting import format_took, format_value, iso_utc, parse_utc_precise
from runbook.model import Expr, Metrics, Plan, RunRecord
from runbook.plan.mdtext import to_lf
from runbook.report.notes import read_framing, read_lessons, read_milestones, read_next_steps, read_status
from runbook.report.templates import render
from runbook.run.planstate import PlanState

if TYPE_CHECKING:
    from runbook.store.index import LedgerIndex
    from runbook.store.workspace import Workspace

__all__ = ["DEFAULT_MAX_CHARS", "build_brief", "fit_brief", "headline", "ran_since", "render_brief", "status_block",
           "top_metrics"]

DEFAULT_MAX_CHARS = 6000

_WHEN = re.compile(r"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(?::\d{2})?(?:\s*UTC|Z)?)")
# the moment `runbook record` wrote the status block, to the microsecond (a comment in the block, hidden
# where Markdown renders): runs that ended before it, even in the same minute, are not "since"
_WRITTEN = re.compile(r"<!-- written (\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?Z) -->")


def judge_leaves(expr: Expr, metrics: Metrics) -> list[tuple[str, str]]:
    """Each comparison of `expr` against `metrics`: (pass | fail | inconclusive, its text)."""
    from runbook.plan.criteria import FAILED_MARK, evaluate

    out = []
    for c in evaluate(expr, metrics).comparisons:
        word = "inconclusive" if c.held is None else "pass" if c.held else "fail"
        out.append((word, (FAILED_MARK if c.held is False else "") + c.text))
    return out


def headline(plan: Plan, plan_rel: str, ledger: LedgerIndex, state: PlanState) -> list[str]:
    """Headline metrics against the goal: the next (or last) phase's criterion, against each
    metric's value in the latest run of the plan that wrote it (a `step-N.` metric: the phase's own
    latest run's), and the other phases' metrics it names; `ledger`: the workspace's `ledger_index.LedgerIndex` (nothing else is read)."""
    view = state.view
    phase = plan.find_phase(view.next.phase) if view.next.phase else None
    if phase is None and view.last_run is not None:
        phase = plan.find_phase(view.last_run.phase)
    if phase is None or phase.criterion is None:
        return []
    latest = ledger.latest_metrics(plan_rel)
    own = ledger.load(ledger.rows(plan_rel, phase.id)[-1:])  # `step-2.loss` is the phase's own step's
    latest.update({k: v for k, v in own[0].metrics.items() if k.startswith("step-")} if own else {})
    from runbook.plan.criteria import metric_names

    if any("." in name for name in metric_names(phase.criterion.expr)):  # `phase-0.acc` references
        from runbook.plan.crossref import COUNTED, resolve

        counted = ledger.latest_runs(plan_rel, verdicts=COUNTED)  # all `resolve` reads
        latest.update(resolve(plan, phase, phase.criterion.expr, counted).values)
    leaves = judge_leaves(phase.criterion.expr, latest)
    goal = phase.criterion.display
    return [f"Goal of {phase.display_name} (`{goal}`): " + " · ".join(t for _v, t in leaves)]


def status_block(plan: Plan, plan_rel: str, ledger: LedgerIndex, updated: str, state: PlanState,
                 written: str | None = None) -> str:
    """The inner Markdown of the notes' status block (templates/notes-status.md.j2); `ledger` as
    for `headline`; `written`: the moment it is written (ISO with microseconds), kept in a comment for
    `notes_updated`."""
    nxt = state.view.next
    if nxt.phase and nxt.kind != "nothing":
        current = f"{nxt.label} (`{nxt.phase}`), {nxt.title} — {nxt.kind}"
    else:
        current = state.view.summary
    verdicts = [f"{row.label} {row.verdict or 'not run'}" + (" (stale)" if row.state == "stale" else "")
                for row in state.view.phases]
    return render(
        "notes-status.md.j2",
        updated=updated,
        written=written,
        current=current,
        verdicts=verdicts,
        headline=headline(plan, plan_rel, ledger, state),
    )


# ---- building and rendering -----------------------------------------------------------------------


def plan_preamble(plan: Plan) -> tuple[str | None, str]:
    """(H1 title, prose) between the front matter and the first phase heading."""
    text = plan.text
    start = plan.front_matter_span.end
    end = plan.phases[0].span.start if plan.phases else len(text)
    prose = to_lf(text[start:end]).strip("\n")
    title = None
    lines = prose.split("\n")
    if lines and re.match(r"^ {0,3}# ", lines[0]):
        title = lines[0].lstrip(" #").strip()
        lines = lines[1:]
    return title, "\n".join(lines).strip()


def notes_updated(notes_text: str) -> str | None:
    """When `runbook record` last wrote the notes: its status block's time (to the microsecond where
    the block keeps it, else as shown), or the newest milestone's when later (ISO 8601 UTC); None
    when neither names a time."""
    times = []
    status = read_status(notes_text)
    written = _WRITTEN.search(status)
    if written:
        times.append(written.group(1))
    match = _WHEN.search(status)
    if match:
        times.append(iso_utc(match.group(1)))
    for entry in read_milestones(notes_text):
        found = _WHEN.match(entry.heading)
        if found:
            times.append(iso_utc(found.group(1)))
    parsed = [(parse_utc_precise(t), t) for t in times if t]
    parsed = [(moment, t) for moment, t in parsed if moment is not None]
    return max(parsed)[1] if parsed else None


def _mentions(text: str, plan: Plan) -> list[str]:
    """Phase ids a next-step line names ("Phase 1", "phase-1", an explicit id in backticks)."""
    found = []
    for phase in plan.phases:
        names = [re.escape(phase.display_name), re.escape(phase.id)]
        if re.search(r"(?<![\w-])(?:" + "|".join(names) + r")(?![\w-])", text, flags=re.I):
            found.append(phase.id)
    return found


def mark_next_steps(steps: list[str], plan: Plan, later: Callable[[str], RunRecord | None]) -> list[NoteStep]:
    """Next steps with a note on those a later run may have done: a step naming a phase that ran
    after the notes were last written by `runbook record` (`later(phase_id)`: the phase's latest
    such run, or None)."""
    out = []
    for text in steps:
        stale = None
        for pid in _mentions(text, plan):
            run = later(pid)
            if run is not None:
                phase = plan.find_phase(pid)
                stale = f"{phase.display_name if phase else pid} ran since these notes were written: {run.verdict} in run {run.run_id}"
                break
        out.append(NoteStep(text=text, stale=stale))
    return out


def ran_since(ws: Workspace, updated: str | None) -> Callable[[str], RunRecord | None]:
    """For `mark_next_steps`: a phase's latest run of the workspace's plan that ended (or, unended,
    started) after `updated`, from the ledger's index."""
    since = parse_utc_precise(updated)
    found: dict[str, RunRecord | None] = {}

    def later(phase_id: str) -> RunRecord | None:
        if since is None:
            return None
        if phase_id not in found:
            found[phase_id] = ws.ledger().last_since(ws.plan_rel, phase_id, since.timestamp())
        return found[phase_id]

    return later


def build_brief(ws: Workspace, state: PlanState, notes_text: str | None = None) -> Brief:
    """Everything the brief says, uncut, for a `workspace.Workspace` and its PlanState."""
    plan = ws.plan
    heading_title, goal = plan_preamble(plan)
    notes_text = notes_text or ""
    updated = notes_updated(notes_text) if notes_text else None
    view = state.view
    return Brief(
        plan=ws.plan_rel,
        notes=ws.notes_rel,
        title=plan.title or heading_title,
        goal=goal,
        framing=read_framing(notes_text) if notes_text else "",
        status=view.summary,
        phases=view.phases,
        running=view.running,
        last_run=view.last_run,
        milestones=[MilestoneText(heading=m.heading, text=m.text) for m in read_milestones(notes_text)],
        lessons=read_lessons(notes_text),
        next_steps=mark_next_steps(read_next_steps(notes_text), plan, ran_since(ws, updated)),
        notes_updated=updated,
        next=view.next,
    )


def _metrics_text(metrics: Mapping[str, object], sep: str) -> str:
    return sep.join(f"{name} {format_value(value) if isinstance(value, (int, float)) else value}"
                    for name, value in metrics.items())


def _render_parts(brief: Brief) -> tuple[str, str]:
    context = {"b": brief, "num": format_value, "metrics": _metrics_text, "took": format_took}
    head = render("brief-head.md.j2", **context)
    tail = render("brief-next.md.j2", **context)
    return head.rstrip("\n") + "\n", tail.rstrip("\n") + "\n"


def _shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit("\n", 1)[0] if "\n" in text[:limit] else text[:limit]
    return cut.rstrip() + " …"


def fit_brief(brief: Brief, max_chars: int = DEFAULT_MAX_CHARS) -> tuple[Brief, str]:
    """Cut `brief` to `max_chars` of Markdown: oldest milestones first, then long prose, then the
    notes' next steps, then oldest lessons, then whole sections from the end of the head; the next
    action and the continue command are never cut. Every cut is counted or flagged in the Brief."""
    brief = brief.model_copy(deep=True)

    def text() -> str:
        head, tail = _render_parts(brief)
        return head + "\n" + tail

    if len(text()) <= max_chars:
        return brief, text()
    brief.max_chars = max_chars
    while brief.milestones and len(text()) > max_chars:
        brief.milestones.pop(0)
        brief.milestones_omitted += 1
    for name, limit in (("framing", 600), ("goal", 600), ("framing", 0), ("goal", 200)):
        if len(text()) > max_chars and len(getattr(brief, name)) > limit:
            setattr(brief, name, _shorten(getattr(brief, name), limit) if limit else "")
            brief.truncated = True
    while brief.next_steps and len(text()) > max_chars:
        brief.next_steps.pop()
        brief.next_steps_omitted += 1
    while brief.lessons and len(text()) > max_chars:
        brief.lessons.pop(0)
        brief.lessons_omitted += 1
    head, tail = _render_parts(brief)
    if len(head) + 1 + len(tail) > max_chars:
        brief.truncated = True
        marker = f"\n… (cut to fit --max-chars {max_chars})\n"
        room = max(0, max_chars - len(tail) - len(marker) - 1)
        sections = re.split(r"(?m)^(?=## )", head)
        while len(sections) > 1 and len("".join(sections)) > room:
            sections.pop()  # whole sections from the end: no half section, no dangling line
        kept = "".join(sections)
        head = (_shorten(kept, room) if len(kept) > room else kept.rstrip("\n") + "\n") + marker
    return brief, head + "\n" + tail


def render_brief(brief: Brief, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    return fit_brief(brief, max_chars)[1]


def render_short(brief: Brief, width: int = 100) -> str:
    """`runbook brief --short`: a primer of a few lines for an agent host's session-start hook: the
    goal, where the plan stands, the last run, and the exact command to continue (or why nothing runs).
    `runbook brief` has the rest."""
    def one_line(text: str) -> str:
        flat = " ".join(text.split())
        return flat if len(flat) <= width else flat[: width - 2].rstrip() + " …"

    lines = [f"runbook: {brief.title or brief.plan} ({brief.plan})"]
    goal = next((part for part in brief.goal.split("\n\n") if part.strip() and not part.lstrip().startswith("#")), "")
    if goal.strip():
        lines.append(f"Goal: {one_line(goal)}")
    if brief.status:
        lines.append(f"Now: {one_line(brief.status)}")
    if brief.running is not None:
        held = brief.running
        lines.append(f"Running: {held.label or held.phase or 'a phase'}, run {held.run_id or '?'} "
                     "(follow it with `runbook logs -f`)")
    elif brief.last_run is not None:
        run = brief.last_run
        lines.append(f"Last run: {run.run_id} {run.label} {run.verdict}")
    step = brief.next
    if step.command:
        lines.append(f"Next: {step.command}")
        lines.append(f"  why: {one_line(step.why)}")
    else:
        lines.append(f"Next: nothing to run ({one_line(step.why)})")
    lines.append("More: `runbook brief` (the whole handoff), `runbook status`.")
    return "\n".join(lines) + "\n"
