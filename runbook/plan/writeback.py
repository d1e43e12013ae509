"""Write a run's outcome back into the plan: pure text -> text.

Three things change, nothing else:

- the phase's status block, `<!-- runbook:status sha=... -->`, inserted right after the heading
  line on first use;
- the `[ ]` / `[x]` character of each step (ticked when the step finished with exit 0 in this run
  or was already done in an earlier run of the phase);
- the phase's results table, `<!-- runbook:results sha=... -->`, one row per run of the phase
  (newest last; columns run, finished, commit, each var whose value differs between the listed
  runs or from the front matter's, each metric named in `Pass:` (not other phases' `phase-0.x`) and in `Columns:`, took,
  verdict), placed at the end of the phase section (before its trailing blank lines) on first use.
  A `Columns:` name shows the run's metric of that name, else the other phase's metric its
  criterion read, else the run's value of the var of that name. It lists the last RESULTS_ROWS
  runs; a line above it counts the earlier ones (`runbook history` has them all), so a phase swept
  ten thousand times keeps a plan a person can read and runbook can parse fast.

`clear_phase` undoes all three for a phase left without runs (`runbook forget` / `reset`): the
blocks go, with the blank line written before the results table, and every box is unticked.

`restate` rewrites another phase's status block and ticks when its verdict went stale (or is no
longer): `stale (was pass)` and why, every box unticked.

Blocks are written in the file's own newline style. The opening marker carries `sha=`: the first 8
hex digits of the SHA-256 of what runbook wrote between the markers. If the content no longer
matches (someone edited the table by hand), `apply_run` refuses with `HandEdited` instead of
erasing the edit; `hand_edits` lists every such block of a plan (what every reader reports) and
`check_plan` refuses on any. A block without `sha=` (written by hand or by a template) is simply
replaced.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Mapping
from typing import Literal

from runbook.formatting import format_took, format_value, minute_text
from runbook.model import Phase, Plan, Problem, RunRecord
from runbook.plan.markers import render_block
from runbook.plan.mdtext import detect_newline, ends_with_newline, line_end, to_lf

STATUS = "status"
RESULTS = "results"
RESULTS_ROWS = 20  # runs listed in a phase's results table; the earlier ones are counted above it


class HandEdited(Exception):
    """A tool-owned block was edited by hand since runbook wrote it."""


# ---- hashing the phase text (for "changed since its last run") ---------------------------------


def phase_source(text: str, phase: Phase) -> str:
    """The phase's source without tool-owned blocks and with every checkbox unticked (LF newlines)."""
    base = phase.span.start
    chars = list(text[base : phase.span.end])
    for step in phase.steps:
        offset = step.checkbox - base
        if 0 <= offset < len(chars) and chars[offset] in "xX":
            chars[offset] = " "
    cuts = sorted(
        ((b.span.start - base, b.span.end - base) for b in phase.blocks.values()), reverse=True
    )
    for start, end in cuts:
        if 0 <= start <= end <= len(chars):
            del chars[start:end]
    return to_lf("".join(chars))


def phase_text_hash(text: str, phase: Phase) -> str:
    """sha256 of the phase's own text; blank lines and trailing spaces do not count."""
    lines = [line.rstrip() for line in phase_source(text, phase).split("\n")]
    canonical = "\n".join(line for line in lines if line)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def phase_diff(old: str, new: str, label: str) -> str:
    """A unified diff of two `phase_source` texts."""
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"{label} (last run)",
            tofile=f"{label} (now)",
        )
    )


# ---- rendering --------------------------------------------------------------------------------


def block_sha(inner: str) -> str:
    return hashlib.sha256(to_lf(inner).encode("utf-8")).hexdigest()[:8]


def status_line(record: RunRecord, stale: str | None = None) -> str:
    """`**Status:** pass · 2026-11-29 14:30 UTC · run 20261129-143012-7f3a · accept_len 2.41 >= 1.5`;
    with `stale` (why the run no longer speaks for its phase, runbook/run/select.py `stale_reason`):
    `**Status:** stale (was pass) · 2026-11-29 14:30 UTC · run ... · its Pass: changed since run ...`."""
    verdict = f"stale (was {record.verdict})" if stale else record.verdict
    parts = [verdict, f"{minute_text(record.finished or record.started)} UTC", f"run {record.run_id}"]
    if record.decision is not None:
        parts.append(f"decided by run {record.decision.run} ({record.decision.why})")
    reason = " ".join((stale or record.reason).replace("·", "-").split())
    if stale:
        reason += "; `runbook next` runs it again from its first step"
    if reason:
        parts.append(reason)
    return "**Status:** " + " · ".join(parts)


def table_columns(plan: Plan, phase: Phase) -> list[str]:
    """The metric columns of a phase's results table: what its `Pass:` reads of its own runs,
    then its `Columns:`."""
    from runbook.plan import crossref
    from runbook.plan.criteria import metric_names

    names = metric_names(phase.criterion.expr) if phase.criterion else []
    if any("." in name for name in names):
        index = plan.phase_index()
        names = [name for name in names if crossref.split(name, index) is None]
    return list(dict.fromkeys([*names, *phase.columns]))


def varying_vars(records: list[RunRecord], exclude: list[str] | tuple[str, ...] = (),
                 defaults: Mapping[str, str] | None = None) -> list[str]:
    """Vars whose recorded value differs between `records` (records without vars do not count) or,
    given the plan's front matter `defaults`, from the value written there: a sweep of one run made
    with `--set` shows its value too."""
    from runbook.redact import redact_credentials

    values: dict[str, set[str | None]] = {}
    recorded = [r for r in records if r.vars]
    for r in recorded:
        for name in r.vars:
            values.setdefault(name, set())
    for name, seen in values.items():
        seen.update(r.vars.get(name) for r in recorded)
    written = {name: redact_credentials(value) for name, value in (defaults or {}).items()}  # as records keep them

    def differs(name: str, seen: set[str | None]) -> bool:
        if len(seen) > 1:
            return True
        return defaults is not None and any(v is not None and v != written.get(name) for v in seen)

    return [name for name, seen in values.items() if differs(name, seen) and name not in exclude]


def cell(record: RunRecord, name: str) -> float | str | None:
    """A run's value for a column: its metric, else the other phase's metric it read, else its var."""
    if name in record.metrics:
        return record.metrics[name]
    if name in record.ref_metrics:
        return record.ref_metrics[name]
    return record.vars.get(name)


def _text(value: float | str | None, width: int = 40) -> str:
    text = format_value(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def results_table(records: list[RunRecord], metric_names: list[str], earlier: int = 0, phase_id: str = "",
                  defaults: Mapping[str, str] | None = None) -> list[str]:
    """The results table's lines: one row for each of the last RESULTS_ROWS of `records` (the
    phase's runs, oldest first) with a column for each var that differs between those rows or from
    its front matter value in `defaults` (the plan's `vars`), then `metric_names`; above the table a
    line counting the runs left out (`earlier` runs before `records` and those cut from its start)."""
    omitted = earlier + max(0, len(records) - RESULTS_ROWS)
    records = records[-RESULTS_ROWS:]
    var_names = varying_vars(records, exclude=metric_names, defaults=defaults)
    header = ["run", "finished", "commit", *var_names, *metric_names, "took", "verdict"]
    rows = [
        [
            r.run_id,
            minute_text(r.finished),
            (r.commit_before or "")[:7] or "-",
            *(_text(r.vars.get(name)) for name in var_names),
            *(_text(cell(r, name)) for name in metric_names),
            format_took(r.duration_s),
            verdict_cell(r),
        ]
        for r in records
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    if omitted:
        command = f"runbook history {phase_id} --limit 0" if phase_id else "runbook history --limit 0"
        lines[:0] = [f"The last {len(records)} runs; {omitted:,} earlier run{'s' * (omitted != 1)} in the ledger "
                     f"(`{command}`).", ""]
    return lines


def verdict_cell(record: RunRecord) -> str:
    """The verdict column: a sweep's trial and the record of a choice say what they are."""
    if record.trial is not None:
        return f"{record.verdict} (trial {record.trial.index}/{record.trial.of})"
    if record.decision is not None:
        return f"{record.verdict} (chose {record.decision.run})"
    return record.verdict


def _block(name: str, lines: list[str], newline: str) -> str:
    inner = "".join(line + newline for line in lines)
    return render_block(name, inner, newline, {"sha": block_sha(inner)})


# ---- applying ---------------------------------------------------------------------------------


def _edit_problems(phase: Phase, file: str, severity: Literal["error", "warning"]) -> list[Problem]:
    found = []
    for name, block in phase.blocks.items():
        want = block.attrs.get("sha")
        if not want or want == block_sha(block.inner):
            continue
        what = {RESULTS: "results table", STATUS: "status block"}.get(name, f"runbook:{name} block")
        found.append(Problem(
            file=file, line=block.span.start_line, col=1, severity=severity,
            message=f"the {what} of {phase.display_name} was edited by hand since runbook wrote it (its marker "
                    f"says sha={want}, the content now hashes to {block_sha(block.inner)}): runbook will not "
                    f"erase the edit nor commit it as its own record; move your text outside the "
                    f"<!-- runbook:{name} --> markers, or delete the whole block to let runbook rebuild it",
        ))
    return found


def hand_edits(plan: Plan, file: str = "", severity: Literal["error", "warning"] = "warning") -> list[Problem]:
    """Every block of every phase of `plan` whose content no longer matches the `sha=` its opening
    marker carries (edited by hand since runbook wrote it), as `file:line` problems, in file order.
    Every reader reports these (validate as errors, the others as warnings); `runbook next`,
    `forget` and `reset` refuse while there is one (`check_plan`)."""
    return [p for phase in plan.phases for p in _edit_problems(phase, file or plan.path, severity)]


def _raise(found: list[Problem], file: str) -> None:
    if found:
        first = found[0]
        where = f"{file}:{first.line}" if file else f"line {first.line}"
        more = "".join(f"; also {file or 'line'}:{p.line}: {p.message.split(' (its marker', 1)[0]}"
                       for p in found[1:4])
        raise HandEdited(f"{where}: {first.message}{more}.")


def check_blocks(text: str, phase: Phase, file: str = "") -> None:
    """Raise HandEdited if a block of `phase` was edited since runbook wrote it."""
    _raise(_edit_problems(phase, file, "error"), file)


def check_plan(plan: Plan, file: str = "") -> None:
    """Raise HandEdited naming each block of the whole plan edited by hand since runbook wrote it:
    a verb that commits the plan must not commit such an edit as runbook's record."""
    _raise(hand_edits(plan, file, "error"), file)


def _status_edit(text: str, phase: Phase, line: str, newline: str) -> tuple[int, int, str]:
    """The edit that writes the phase's status block: replaced where it is, else right after the heading."""
    status = _block(STATUS, [line], newline)
    if STATUS in phase.blocks:
        span = phase.blocks[STATUS].span
        return (span.start, span.end, status)
    at = line_end(text, phase.heading_span.start)
    prefix = newline if at == len(text) and not ends_with_newline(text) else ""
    return (at, at, prefix + status)


def _tick_edits(text: str, phase: Phase, done: set[str]) -> list[tuple[int, int, str]]:
    """The edits that tick the steps in `done` and untick the others."""
    edits = []
    for step in phase.steps:
        ticked = text[step.checkbox] in "xX"
        if (step.id in done) != ticked:
            edits.append((step.checkbox, step.checkbox + 1, "x" if step.id in done else " "))
    return edits


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    out = text
    ordered = sorted(((s, e, i, new) for i, (s, e, new) in enumerate(edits)), reverse=True)
    for start, end, _i, new in ordered:  # back to front, so earlier offsets stay valid
        out = out[:start] + new + out[end:]
    return out


def apply_run(
    text: str,
    plan: Plan,
    phase_id: str,
    record: RunRecord,
    history: list[RunRecord],
    metric_names: list[str] | None = None,
    file: str = "",
    earlier: int = 0,
    decides: bool = True,
) -> str:
    """The plan text with `record` written into phase `phase_id`.

    `decides`: False for a sweep's trial, which goes into the results table only (the status block
    and the checkboxes keep saying what the deciding run did).

    `plan` must be the parse of `text`. `history` is the phase's runs for the results table, oldest
    first (it should end with `record`): every run, or the last RESULTS_ROWS of them and in
    `earlier` how many came before. `metric_names`: the table's metric columns (default:
    `table_columns`). Raises HandEdited (nothing changes) or KeyError when the phase is not in the
    plan.
    """
    phase = plan.find_phase(phase_id)
    if phase is None:
        raise KeyError(phase_id)
    if metric_names is None:
        metric_names = table_columns(plan, phase)
    check_blocks(text, phase, file)
    newline = detect_newline(text)
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement), non-overlapping

    if decides:
        edits.append(_status_edit(text, phase, status_line(record), newline))
        edits += _tick_edits(text, phase, {r.step_id for r in record.steps if r.completed})

    # results table
    results = _block(RESULTS, results_table(history, metric_names, earlier, phase.id, plan.vars), newline)
    if RESULTS in phase.blocks:
        span = phase.blocks[RESULTS].span
        edits.append((span.start, span.end, results))
    else:
        body_end = phase.span.start + len(text[phase.span.start : phase.span.end].rstrip())
        at = line_end(text, body_end)
        lead = newline if at == len(text) and not ends_with_newline(text) else ""
        edits.append((at, at, lead + newline + results))

    return _apply(text, edits)


def restate(text: str, plan: Plan, phase_id: str, record: RunRecord, stale: str | None, file: str = "") -> str:
    """The plan text with the status block and ticks of phase `phase_id` saying what its latest run
    `record` is worth now: with `stale` (why it no longer speaks for the phase) the block says
    `stale (was pass)` and why, and every box is unticked (the phase runs again from its first
    step); without, they are what `apply_run` wrote for `record`. Only a phase whose status block
    names `record` is touched (the results table never); the text is returned as it is otherwise.
    Raises HandEdited (nothing changes) when a block of the phase was edited by hand."""
    phase = plan.find_phase(phase_id)
    if phase is None or phase.status is None or phase.status.run_id != record.run_id:
        return text
    check_blocks(text, phase, file)
    newline = detect_newline(text)
    done = set() if stale else {r.step_id for r in record.steps if r.completed}
    return _apply(text, [_status_edit(text, phase, status_line(record, stale), newline),
                         *_tick_edits(text, phase, done)])


def clear_phase(text: str, plan: Plan, phase_id: str, file: str = "") -> str:
    """The plan text with phase `phase_id` as if it never ran: no status block, no results table,
    no ticked box. `plan` must be the parse of `text`. Raises HandEdited (nothing changes) or
    KeyError when the phase is not in the plan."""
    phase = plan.find_phase(phase_id)
    if phase is None:
        raise KeyError(phase_id)
    check_blocks(text, phase, file)
    newline = detect_newline(text)
    edits: list[tuple[int, int, str]] = []
    for name in (STATUS, RESULTS):
        block = phase.blocks.get(name)
        if block is None:
            continue
        start = block.span.start
        if name == RESULTS and text[:start].endswith(newline + newline):
            start -= len(newline)  # the blank line apply_run wrote before the table
        edits.append((start, block.span.end, ""))
    for step in phase.steps:
        if text[step.checkbox] in "xX":
            edits.append((step.checkbox, step.checkbox + 1, " "))
    out = text
    for start, end, new in sorted(edits, reverse=True):
        out = out[:start] + new + out[end:]
    return out
