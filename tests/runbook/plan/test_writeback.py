"""Write-back is pure text -> text: only marked blocks and checkbox characters change."""

from __future__ import annotations

import pytest
from helpers import run_record

from runbook.formatting import format_took
from runbook.model import StepResult
from runbook.plan.parse import parse_plan
from runbook.plan.writeback import HandEdited, apply_run, phase_text_hash, results_table, status_line

PLAN = """\
---
runbook: 1
---

# Plan

## Phase 0: Probe (~5 min)

Goal.

Steps:
- [ ] One: `echo 1`
- [X] Two: `echo 2`
- [ ] Three:
  ```sh
  echo '- [ ] not a step'
  ```

Pass: `loss < 2 and acc > 0.5`
On pass: Phase 1


## Phase 1: Next
Steps:
- [ ] Go: `true`"""


def rec(run_id="20260101-000000-aaaa", verdict="pass", done=("step-1", "step-2", "step-3"), **kw):
    base = dict(
        run_id=run_id, plan="p.md", plan_blob="b", phase="phase-0", phase_label="0", phase_text_hash="h",
        started="2026-01-01T00:00:00.000000Z", finished="2026-01-01T00:04:12.000000Z", duration_s=252.4,
        verdict=verdict, reason="loss 1.2 < 2 and acc 0.75 > 0.5", metrics={"loss": 1.2, "acc": 0.75},
        commit_before="0123456789abcdef", steps=[StepResult(step_id=s, command="x", exit_code=0) for s in done],
    )
    base.update(kw)
    return run_record(**base)


def apply(text, record, history=None, phase="phase-0"):
    plan, problems = parse_plan(text, "p.md")
    assert not [p for p in problems if p.severity == "error"], problems
    return apply_run(text, plan, phase, record, history or [record], ["loss", "acc"], file="p.md")


def test_first_write_inserts_blocks_and_ticks():
    out = apply(PLAN, rec())
    assert out.startswith(PLAN[: PLAN.index("## Phase 0")])
    assert "## Phase 0: Probe (~5 min)\n<!-- runbook:status sha=" in out
    assert "- [x] One" in out and "- [X] Two" in out and "- [x] Three" in out  # an existing X stays as written
    assert "echo '- [ ] not a step'" in out
    table = out[out.index("<!-- runbook:results"):out.index("## Phase 1")]
    assert table.startswith("<!-- runbook:results sha=")
    assert table.endswith("<!-- /runbook:results -->\n\n\n")  # before the phase's trailing blank lines
    assert "| run | finished | commit | loss | acc | took | verdict |" in table
    assert "| 20260101-000000-aaaa | 2026-01-01 00:04 | 0123456 | 1.2 | 0.75 | 4m12s | pass |" in table
    assert out.endswith("- [ ] Go: `true`")  # the other phase is untouched


def test_second_run_appends_row_and_unticks_unreached_steps():
    first = apply(PLAN, rec())
    second = rec("20260101-000500-bbbb", verdict="error", done=("step-1",), reason="step-2 exited 3", metrics={})
    out = apply(first, second, [rec(), second])
    assert "- [x] One" in out and "- [ ] Two" in out and "- [ ] Three" in out
    assert "**Status:** error · 2026-01-01 00:04 UTC · run 20260101-000500-bbbb · step-2 exited 3" in out
    rows = [line for line in out.splitlines() if line.startswith("| 2026")]
    assert [r.split(" | ")[-1] for r in rows] == ["pass |", "error |"]
    assert out.count("<!-- runbook:status") == 1 and out.count("<!-- runbook:results") == 1


def test_idempotent_and_parser_reads_status_back():
    once = apply(PLAN, rec())
    assert apply(once, rec()) == once
    plan, _ = parse_plan(once, "p.md")
    status = plan.phases[0].status
    assert status.verdict == "pass" and status.run_id == "20260101-000000-aaaa"


def test_crlf_and_last_phase_without_newline():
    crlf = PLAN.replace("\n", "\r\n")
    out = apply(crlf, rec(phase="phase-1", steps=[StepResult(step_id="step-1", command="true", exit_code=0)]),
                phase="phase-1")
    assert "\n" not in out.replace("\r\n", "")
    head = "## Phase 1: Next\r\n"
    assert out.startswith(crlf[: crlf.index(head) + len(head)] + "<!-- runbook:status sha=")
    assert "-->\r\nSteps:\r\n- [x] Go: `true`\r\n\r\n<!-- runbook:results sha=" in out
    assert out.endswith("<!-- /runbook:results -->\r\n")


def test_hand_edit_inside_block_is_refused():
    once = apply(PLAN, rec())
    edited = once.replace("| 1.2 |", "| 1.2 (A100) |")
    with pytest.raises(HandEdited, match=r"p\.md:\d+: the results table of Phase 0 was edited by hand"):
        apply(edited, rec("20260101-000500-bbbb"))
    # deleting the whole block is the documented way out: it is rebuilt
    start, end = edited.index("<!-- runbook:results"), edited.index("<!-- /runbook:results -->\n") + 26
    rebuilt = apply(edited[:start] + edited[end:], rec())
    assert "| 1.2 |" in rebuilt


def test_phase_hash_ignores_blocks_checkboxes_and_blank_lines_only():
    plan, _ = parse_plan(PLAN, "p.md")
    before = phase_text_hash(PLAN, plan.phases[0])
    out = apply(PLAN, rec())
    plan2, _ = parse_plan(out, "p.md")
    assert phase_text_hash(out, plan2.phases[0]) == before
    edited = PLAN.replace("`echo 1`", "`echo 11`")
    plan3, _ = parse_plan(edited, "p.md")
    assert phase_text_hash(edited, plan3.phases[0]) != before


def test_small_renderers():
    assert format_took(5) == "5s" and format_took(252) == "4m12s" and format_took(7300) == "2h01m"
    assert status_line(rec()).startswith("**Status:** pass · 2026-01-01 00:04 UTC · run 20260101-000000-aaaa")
    assert results_table([rec(metrics={})], ["loss"])[2].split(" | ")[3] == "-"
