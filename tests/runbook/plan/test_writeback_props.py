"""Write-back properties: a run changes only the marked blocks and the checkbox characters.

Random plans (prose, phases, steps with inline or fenced commands, criteria, hand-written
blocks, LF / CRLF, with or without a final newline) and random run sequences (verdicts, exit
codes, metrics) go through `writeback.apply_run` exactly as `runbook next` uses it (re-parse
between runs). After every run:

- the text outside the status / results blocks, with checkbox characters masked, is unchanged
  (the first write of a block may add the blank line that separates it; nothing else);
- every other phase's source is byte-identical;
- the plan still parses without errors and round-trips; the status block names the run.

Damaged markers (nested, duplicated, unbalanced, text on the marker line, hand edits inside a
block with `sha=`) are reported as `file:line` errors or `HandEdited`, never repaired; through
the real `runbook next` the plan stays byte-identical and nothing is committed.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import helpers as H
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from runbook.model import Plan, RunRecord, StepResult
from runbook.plan import writeback
from runbook.plan.parse import parse_plan, reassemble

VERDICTS = ["pass", "fail", "inconclusive", "error", "timeout", "interrupted"]

# ---- generating plans ------------------------------------------------------------------------

word = st.text(alphabet="abcdefghijklmnopqrstuvwxyzé✓ABC", min_size=1, max_size=8)
prose_line = st.builds(
    lambda first, words, tail: first + " " + " ".join(words) + tail,
    st.sampled_from(["Prose", "Why", "Note", "Context", "Über", "Результат"]),
    st.lists(st.one_of(word, st.sampled_from(["`code`", "{x}", "a|b", "*em*", "<b>", "--", "$HOME", "\t"])),
             max_size=8),
    st.sampled_from(["", " ", "  ", "\t", "."]),
)


@st.composite
def step_item(draw, idx: int) -> str:
    done = draw(st.booleans())
    box = draw(st.sampled_from(["x", "X"])) if done else " "
    title = draw(st.sampled_from(["Make", "Train", "Measure", "Über-step", "Do it"]))
    if draw(st.booleans()):
        return f"- [{box}] {title} {idx}: `echo {idx} {{x}}`"
    fence = draw(st.sampled_from(["```", "~~~", "````"]))
    return f"- [{box}] {title} {idx}:\n  {fence}sh\n  echo {idx}\n  echo '{{\"m0\": 1}}'\n  {fence}"


@st.composite
def phase_text(draw, label: int) -> str:
    parts = []
    est = draw(st.sampled_from(["", " (~5 min)", " (~2-3 h)"]))
    parts.append(f"## Phase {label}: part {label}{est}")
    if draw(st.booleans()):
        parts.append("")
        parts.extend(draw(st.lists(prose_line, max_size=3)))
    if draw(st.booleans()):
        parts += ["", "<!-- runbook:status -->", "**Status:** written by hand", "<!-- /runbook:status -->"]
    n_steps = draw(st.integers(0, 4))
    if n_steps:
        parts += ["", "Steps:"] + [draw(step_item(i)) for i in range(n_steps)]
    if draw(st.booleans()):
        parts += ["", f"Pass: `m0 >= {draw(st.integers(0, 3))}" + draw(st.sampled_from(["", " and m1 < 5", " or m2 == 1"])) + "`"]
    if draw(st.booleans()):
        parts.append("On fail: stop")
    if draw(st.booleans()):
        parts += ["", "<!-- runbook:results -->", "| run | verdict |", "|---|---|", "<!-- /runbook:results -->"]
    if draw(st.booleans()):
        parts += [""] + draw(st.lists(prose_line, min_size=1, max_size=2))
    parts += [""] * draw(st.integers(0, 2))
    return "\n".join(parts)


@st.composite
def plan_texts(draw) -> str:
    n = draw(st.integers(1, 4))
    head = ["---", "runbook: 1", "title: Random plan", "vars:", "  x: a b", "---", ""]
    if draw(st.booleans()):
        head += ["# Title", "", *draw(st.lists(prose_line, max_size=3)), ""]
    body = "\n".join(head) + "\n" + "\n\n".join(draw(phase_text(i)) for i in range(n))
    body = body.rstrip("\n") + draw(st.sampled_from(["", "\n", "\n\n"]))
    if draw(st.booleans()):
        body = body.replace("\n", "\r\n")
    return body


run_spec = st.tuples(
    st.integers(0, 3),  # phase index (mod number of phases)
    st.sampled_from(VERDICTS),
    st.lists(st.sampled_from([0, 0, 0, 1, None]), max_size=4),  # exit codes per step
    st.dictionaries(st.sampled_from(["m0", "m1", "m2"]), st.floats(-1e6, 1e6, allow_nan=False), max_size=3),
)


def make_record(plan: Plan, phase_id: str, n: int, verdict: str, exits: list, metrics: dict) -> RunRecord:
    phase = plan.find_phase(phase_id)
    steps = [
        StepResult(step_id=s.id, command=s.command, exit_code=exits[i] if i < len(exits) else None, metrics={})
        for i, s in enumerate(phase.steps)
    ]
    return H.run_record(
        run_id=f"20261129-1430{n:02d}-{n:04x}",
        plan="plans/plan.md",
        plan_blob="0" * 40,
        phase=phase.id,
        phase_label=phase.label,
        phase_text_hash=writeback.phase_text_hash(plan.text, phase),
        started=f"2026-11-29T14:30:{n:02d}.000000Z",
        finished=f"2026-11-29T14:31:{n:02d}.000000Z",
        duration_s=61.0 + n,
        steps=steps,
        metrics=metrics,
        criterion=phase.criterion.text if phase.criterion else None,
        verdict=verdict,
        reason="accept_len 2.41 >= 1.5 | pipe · dot",
        commit_before="abcdef0123456789",
    )


def outside(plan: Plan) -> str:
    """The text outside status/results blocks, with checkbox characters masked."""
    text = plan.text
    chars = list(text)
    for phase in plan.phases:
        for step in phase.steps:
            chars[step.checkbox] = "\0"
    cuts = sorted(((b.span.start, b.span.end) for p in plan.phases for b in p.blocks.values()), reverse=True)
    for a, b in cuts:
        del chars[a:b]
    return "".join(chars)


def only_newlines_added(before: str, after: str) -> bool:
    sm = difflib.SequenceMatcher(None, before, after, autojunk=False)
    for tag, _i1, _i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        if tag != "insert" or not re.fullmatch(r"[\r\n]+", after[j1:j2]):
            return False
    return True


def errors_of(problems) -> list[str]:
    return [str(p) for p in problems if p.severity == "error"]


@settings(max_examples=H.examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan_texts(), st.lists(run_spec, min_size=1, max_size=6))
def test_random_runs_change_only_blocks_and_checkboxes(counts, text: str, runs: list) -> None:
    plan, problems = parse_plan(text, "plans/plan.md")
    assume(plan is not None and not errors_of(problems))
    history: dict[str, list[RunRecord]] = {}
    for n, (pi, verdict, exits, metrics) in enumerate(runs):
        phase = plan.phases[pi % len(plan.phases)]
        record = make_record(plan, phase.id, n, verdict, exits, metrics)
        history.setdefault(phase.id, []).append(record)
        names = ["m0", "m1", "m2"][: 1 + n % 3]
        new_text = writeback.apply_run(plan.text, plan, phase.id, record, history[phase.id], names, file="plans/plan.md")
        new_plan, new_problems = parse_plan(new_text, "plans/plan.md")
        assert new_plan is not None and not errors_of(new_problems), (errors_of(new_problems), new_text)
        assert reassemble(new_plan) == new_text
        assert [p.id for p in new_plan.phases] == [p.id for p in plan.phases]
        # outside the blocks and checkboxes: unchanged (a first block may add its blank line)
        before, after = outside(plan), outside(new_plan)
        if set(phase.blocks) >= {"status", "results"}:
            assert after == before
        else:
            assert only_newlines_added(before, after), (before, after)
        # other phases: byte-identical
        for old, new in zip(plan.phases, new_plan.phases, strict=True):
            if old.id != phase.id:
                assert plan.text[old.span.start : old.span.end] == new_text[new.span.start : new.span.end]
        # the judged phase: status names the run, checkboxes follow the run
        judged = new_plan.find_phase(phase.id)
        assert judged.status is not None and judged.status.verdict == verdict
        assert judged.status.run_id == record.run_id
        done = {s.step_id for s in record.steps if s.exit_code == 0}
        assert [s.done for s in judged.steps] == [s.id in done for s in judged.steps]
        assert judged.blocks["results"].inner.count(record.run_id) == 1
        assert all(r.run_id in judged.blocks["results"].inner for r in history[phase.id])
        # newline style kept
        if "\r\n" in text:
            assert re.search(r"(?<!\r)\n", new_text) is None
        plan = new_plan
    counts.add("writeback_sequences")
    counts.add("writeback_runs", len(runs))


# ---- damaged markers and hand edits -----------------------------------------------------------

BASE = """\
---
runbook: 1
title: Damage
---

# Damage

Intro prose.

## Phase 0: Probe

Why we probe.

Steps:
- [ ] One: `echo '{"m0": 2}' > "$RUNBOOK_METRICS"`
- [ ] Two: `true`

Pass: `m0 >= 1`

Closing prose of phase 0.

## Phase 1: Next

Steps:
- [ ] Three: `true`
"""


def _after_one_run(text: str = BASE) -> str:
    plan, _ = parse_plan(text, "plans/plan.md")
    record = make_record(plan, "phase-0", 1, "pass", [0, 0], {"m0": 2.0})
    return writeback.apply_run(text, plan, "phase-0", record, [record], ["m0"])


def _lines_matching(text: str, pattern: str) -> list[int]:
    lines = text.split("\n")
    return [i for i, line in enumerate(lines) if re.search(pattern, line)]


DAMAGES = [
    "drop_close_status", "drop_open_status", "drop_close_results", "drop_open_results",
    "duplicate_status", "duplicate_results", "nest_open", "stray_close", "text_on_marker",
    "swap_close_open", "rename_close",
]


def damage(text: str, kind: str, where: float) -> str:
    lines = text.split("\n")
    close_s = _lines_matching(text, r"^<!-- /runbook:status")[0]
    open_s = _lines_matching(text, r"^<!-- runbook:status")[0]
    close_r = _lines_matching(text, r"^<!-- /runbook:results")[0]
    open_r = _lines_matching(text, r"^<!-- runbook:results")[0]
    if kind == "drop_close_status":
        del lines[close_s]
    elif kind == "drop_open_status":
        del lines[open_s]
    elif kind == "drop_close_results":
        del lines[close_r]
    elif kind == "drop_open_results":
        del lines[open_r]
    elif kind == "duplicate_status":
        lines[close_s + 1 : close_s + 1] = lines[open_s : close_s + 1]
    elif kind == "duplicate_results":
        lines[close_r + 1 : close_r + 1] = lines[open_r : close_r + 1]
    elif kind == "nest_open":
        at = open_r + 1 + int(where * (close_r - open_r - 1))
        lines.insert(at, "<!-- runbook:status -->")
    elif kind == "stray_close":
        phase0 = _lines_matching(text, r"^## Phase 0")[0]
        at = phase0 + 1 + int(where * (close_r - phase0))
        lines.insert(at, "<!-- /runbook:results -->")
    elif kind == "text_on_marker":
        lines[open_s] += " hand-written"
    elif kind == "swap_close_open":
        lines[open_r], lines[close_r] = lines[close_r], lines[open_r]
    elif kind == "rename_close":
        lines[close_s] = lines[close_s].replace("status", "results")
    return "\n".join(lines)


@settings(max_examples=H.examples(60), deadline=None)
@given(st.sampled_from(DAMAGES), st.floats(0, 1), st.booleans())
def test_damaged_markers_are_reported_not_repaired(counts, kind: str, where: float, crlf: bool) -> None:
    text = damage(_after_one_run(), kind, where)
    if crlf:
        text = text.replace("\n", "\r\n")
    plan, problems = parse_plan(text, "plans/plan.md")
    errors = [p for p in problems if p.severity == "error"]
    assert errors, f"{kind}: not reported"
    assert all(p.file == "plans/plan.md" and p.line >= 1 for p in errors)
    assert any("runbook:" in p.message for p in errors), [str(p) for p in errors]
    if plan is not None:
        assert reassemble(plan) == text
    counts.add("marker_damages_detected")


@settings(max_examples=H.examples(60), deadline=None)
@given(st.sampled_from(["status", "results"]), st.floats(0, 1), st.text(alphabet="abc |-*0123.", min_size=1, max_size=5))
def test_hand_edit_inside_a_block_raises_hand_edited(counts, name: str, where: float, junk: str) -> None:
    text = _after_one_run()
    plan, _ = parse_plan(text, "plans/plan.md")
    block = plan.find_phase("phase-0").blocks[name]
    inner_start = block.span.start + text[block.span.start :].index("\n") + 1
    inner_end = inner_start + len(block.inner)
    at = inner_start + int(where * (inner_end - inner_start - 1))
    edited = text[:at] + junk + text[at:]
    assume(writeback.block_sha(edited[inner_start:inner_end + len(junk)]) != block.attrs["sha"])
    plan2, problems = parse_plan(edited, "plans/plan.md")
    assert plan2 is not None and not errors_of(problems)
    record = make_record(plan2, "phase-0", 2, "fail", [1], {})
    with pytest.raises(writeback.HandEdited) as info:
        writeback.apply_run(edited, plan2, "phase-0", record, [record], ["m0"], file="plans/plan.md")
    assert "plans/plan.md:" in str(info.value) and "by hand" in str(info.value)
    counts.add("hand_edits_detected")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["nest_open", "duplicate_results", "drop_close_status", "hand_edit"])
def test_runbook_next_refuses_damaged_plan_and_leaves_it(tmp_path: Path, counts, kind: str) -> None:
    repo = H.make_repo(tmp_path / "repo", BASE)
    first = H.runbook(repo, "next", "--yes")
    assert first.returncode == 0, first.stderr
    plan_path = repo / "plans" / "plan.md"
    text = plan_path.read_text()
    if kind == "hand_edit":
        damaged = text.replace("| pass |", "| pass (checked by Ann) |")
        assert damaged != text
    else:
        damaged = damage(text, kind, 0.5)
    plan_path.write_text(damaged)
    H.git(repo, "commit", "-qam", "hand damage")
    head = H.git(repo, "rev-parse", "HEAD")
    result = H.runbook(repo, "next", "--yes", "--phase", "0", "--restart")
    H.assert_no_traceback(result, kind)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "plans/plan.md:" in result.stderr or "plans/plan.md:" in result.stdout
    assert plan_path.read_text() == damaged
    assert H.git(repo, "rev-parse", "HEAD") == head
    assert H.git(repo, "status", "--porcelain") == ""
    counts.add("marker_damages_refused_by_cli")
