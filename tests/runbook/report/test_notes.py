"""The notes document format: owned sections edited, every other byte kept."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runbook.report import notes
from runbook.report.notes import Milestone, apply_record

M1 = Milestone(
    title="Pipeline validated end to end",
    when="2026-11-29 14:30 UTC",
    body="Extraction ran at full speed.\n\nNo OOM with batch 4.",
    metrics={"extract_tok_s": 2912.0, "accept_len": 2.41},
    run_id="20261129-143012-7f3a",
    phase="phase-0",
    phase_label="0",
    verdict="pass",
    commit="1a2b3c4d5e6f7a8b",
)
M2 = Milestone(title="Second", when="2026-11-30 09:00 UTC")

BEFORE = "# Notes: drafter\n\nThe anchor does 340 tok/s, we do 82.5.\n\n## Hardware\n\n8x PCIe GPUs.\n\n"
OWNED = (
    "<!-- runbook:notes-status -->\nold status\n<!-- /runbook:notes-status -->\n\n"
    "## Milestones\n\n### 2026-11-01 · First\n\nearly numbers\n\n"
    "## Lessons learned\n\n- Use `--prepared-data`, not --data-path.\n- batch 4, not 2000\n\n"
    "## Next steps\n\n- old step\n\n"
)
AFTER = "## Appendix: commands\n\n```sh\n## Milestones\necho not a heading\n```\n\nhand text, no newline"


def test_milestone_entry_has_date_title_run_commit_body_metrics() -> None:
    entry = notes.render_milestone(M1)
    assert entry.startswith("### 2026-11-29 14:30 UTC · Pipeline validated end to end\n")
    assert "Run `20261129-143012-7f3a` · Phase 0 (`phase-0`) · pass · commit `1a2b3c4d5e`" in entry
    assert "Extraction ran at full speed.\n\nNo OOM with batch 4." in entry
    assert "Metrics: extract_tok_s 2912 · accept_len 2.41" in entry


def test_hand_written_text_around_owned_sections_is_byte_identical() -> None:
    text = BEFORE + OWNED + AFTER
    new, outcome = apply_record(text, M1, ["a new lesson"], ["step one", "step two"], "fresh status", replace_next=True)
    assert new.startswith(BEFORE)
    assert new.endswith(AFTER)
    owned = new[len(BEFORE) : len(new) - len(AFTER)]
    assert "fresh status" in owned and "old status" not in owned
    # the old milestone stays, the new one is appended after it (newest last)
    assert owned.index("### 2026-11-01 · First") < owned.index("### 2026-11-29 14:30 UTC · Pipeline")
    assert "- old step" not in owned and "- step one\n- step two\n" in owned
    assert "- batch 4, not 2000\n- a new lesson\n" in owned
    assert outcome.lessons_added == ["a new lesson"] and outcome.created == []
    # the fenced "## Milestones" in the appendix was not taken for the section
    assert notes.find_sections(new)["Milestones"].start < len(BEFORE) + len(OWNED)


def test_repeated_lesson_is_not_added_again() -> None:
    text = BEFORE + OWNED + AFTER
    lessons = ["use --prepared-data, not --data-path", "Batch 4,  not 2000.", "new one", "NEW ONE"]
    new, outcome = apply_record(text, M2, lessons)
    assert outcome.lessons_added == ["new one"]
    assert outcome.lessons_skipped == ["use --prepared-data, not --data-path", "Batch 4, not 2000.", "NEW ONE"]
    assert notes.read_lessons(new) == ["Use `--prepared-data`, not --data-path.", "batch 4, not 2000", "new one"]
    again, outcome = apply_record(new, M2, ["new one"])
    assert outcome.lessons_added == [] and notes.read_lessons(again) == notes.read_lessons(new)


def test_sections_are_created_on_first_use_in_order() -> None:
    text = "# Notes\n\nSome framing.\n"
    new, outcome = apply_record(text, M1, ["lesson"], ["next"], "status")
    assert new.startswith(text)
    order = [new.index(s) for s in ("<!-- runbook:notes-status -->", "## Milestones", "## Lessons learned", "## Next steps")]
    assert order == sorted(order)
    assert outcome.created == ["notes-status", "Milestones", "Lessons learned", "Next steps"]
    assert notes.read_framing(new) == "Some framing."
    assert notes.read_status(new) == "status"


def test_missing_section_goes_between_its_neighbours() -> None:
    text = "# N\n\n## Milestones\n\n### a\n\nx\n\n## Next steps\n\n- n\n\n## Mine\n\nkeep\n"
    new, _ = apply_record(text, M2, ["lesson"])
    assert new.index("## Milestones") < new.index("## Lessons learned") < new.index("## Next steps")
    assert new.endswith("## Next steps\n\n- n\n\n## Mine\n\nkeep\n")


def test_crlf_document_stays_crlf() -> None:
    text = (BEFORE + OWNED + AFTER).replace("\n", "\r\n")
    new, _ = apply_record(text, M1, ["l1"], ["n1"], "s\nt")
    assert "\n" not in new.replace("\r\n", "")
    assert new.startswith(BEFORE.replace("\n", "\r\n")) and new.endswith(AFTER.replace("\n", "\r\n"))


def test_next_steps_are_added_after_those_there_and_replaced_only_when_asked() -> None:
    text = BEFORE + OWNED + AFTER
    new, outcome = apply_record(text, M1, [], ["step one", "Old step."])
    assert new.startswith(BEFORE) and new.endswith(AFTER)
    assert notes.read_next_steps(new) == ["old step", "step one"]
    assert outcome.next_steps_added == ["step one"] and outcome.next_steps_skipped == ["Old step."]
    assert not outcome.next_steps_replaced
    again, _ = apply_record(new, M2, [], ["step two"])
    assert notes.read_next_steps(again) == ["old step", "step one", "step two"]
    replaced, outcome = apply_record(again, M2, [], ["only this"], replace_next=True)
    assert notes.read_next_steps(replaced) == ["only this"] and outcome.next_steps_replaced
    prose = "# N\n\n## Next steps\n\nWrite the paper.\n"  # prose, then a list after a blank line
    added, _ = apply_record(prose, M2, [], ["n1"])
    assert added.endswith("## Next steps\n\nWrite the paper.\n\n- n1\n")
    crlf, _ = apply_record((BEFORE + OWNED + AFTER).replace("\n", "\r\n"), M2, [], ["n2"])
    assert "\n" not in crlf.replace("\r\n", "") and "- old step\r\n- n2\r\n" in crlf


def test_next_steps_untouched_without_new_ones() -> None:
    text = BEFORE + OWNED + AFTER
    new, outcome = apply_record(text, M2)
    assert "- old step" in new and not outcome.next_steps_replaced


def test_empty_document_and_milestones_read_back() -> None:
    new, _ = apply_record("", M1, ["x"])
    new, _ = apply_record(new, M2)
    entries = notes.read_milestones(new)
    assert [e.heading for e in entries] == ["2026-11-29 14:30 UTC · Pipeline validated end to end", "2026-11-30 09:00 UTC · Second"]
    assert "Metrics: extract_tok_s 2912" in entries[0].text


def test_unclosed_status_marker_is_a_problem() -> None:
    text = "# N\n\n<!-- runbook:notes-status -->\nstuff\n\n## Milestones\n"
    assert notes.problems(text) == [(3, "<!-- runbook:notes-status --> is never closed; add <!-- /runbook:notes-status --> after it or delete the marker")]
    # the sections after it are still found
    assert "Milestones" in notes.find_sections(text)


# prose with no headings or fences: nothing in it can be taken for an owned part
_prose = st.lists(st.text(alphabet=st.sampled_from(list("ab -*<>!")), max_size=12), max_size=6)


@settings(max_examples=150, deadline=None)
@given(before=_prose, after=_prose, crlf=st.booleans())
def test_property_bytes_outside_owned_sections_survive(before: list[str], after: list[str], crlf: bool) -> None:
    nl = "\r\n" if crlf else "\n"
    head = "".join(line + nl for line in before)
    tail = "## Tail" + nl + nl.join(after)
    full = head + "## Milestones" + nl + nl + "### old" + nl + nl + tail
    new, _ = apply_record(full, M1, ["l"], ["n"], "s")
    assert new.startswith(head)
    assert new.endswith(tail)
    assert notes.read_lessons(new) == ["l"] and notes.read_next_steps(new) == ["n"]
