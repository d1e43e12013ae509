"""The one home of runbook's Markdown text mechanics: newline style, line ends and counts, lines with
offsets, fenced code; and the editors that use it (markers, notes) agreeing on what is code."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from runbook.plan.markers import find_blocks
from runbook.plan.mdtext import (
    Fences,
    count_newlines,
    detect_newline,
    ends_with_newline,
    line_end,
    lines,
    to_lf,
    with_newlines,
)
from runbook.report import notes

_text = st.text(alphabet=st.sampled_from(list("ab \t`~\r\n")), max_size=40)


def test_newline_style_is_the_first_line_ending() -> None:
    assert detect_newline("a\r\nb\nc") == "\r\n"
    assert detect_newline("a\rb\r\n") == "\r"
    assert detect_newline("a\nb\r\n") == "\n"
    assert detect_newline("no ending") == "\n"
    assert with_newlines("a\r\nb\rc\nd", "\r\n") == "a\r\nb\r\nc\r\nd"
    assert to_lf("a\r\nb\rc\n") == "a\nb\nc\n"
    assert ends_with_newline("a\r") and ends_with_newline("a\n") and not ends_with_newline("a")


@settings(max_examples=300, deadline=None)
@given(_text, st.data())
def test_counts_and_line_ends_agree_with_a_plain_split(text: str, data: st.DataObject) -> None:
    a = data.draw(st.integers(0, len(text)))
    b = data.draw(st.integers(a, len(text)))
    # \r\n counts once, so a slice that cuts one in two counts what it holds
    assert count_newlines(text, a, b) == len(re.findall(r"\r\n|\r|\n", text[a:b]))
    found = lines(text)
    assert "".join(text[line.start : line.end] for line in found) == text
    assert [line.content for line in found] == [part for part in re.split(r"\r\n|\r|\n", text)][: len(found)]
    for line in found:
        for pos in range(line.start, line.start + len(line.content) + 1):
            assert line_end(text, pos) == line.end


def test_line_end_stops_at_a_bound() -> None:
    assert line_end("abc\r\ndef", 0) == 5
    assert line_end("abc\r\ndef", 0, 4) == 4  # the bound cuts the \r\n: past the \r only
    assert line_end("abc", 1) == 3


def _code(text: str) -> list[bool]:
    fences = Fences()
    return [fences.step(line) for line in text.split("\n")]


def test_fences_close_only_with_the_same_character_at_least_as_long_and_bare() -> None:
    assert _code("a\n```py\n~~~\n``\n``` not closing\n````\nb") == [False, True, True, True, True, True, False]
    assert _code("~~~~\n~~~\n```\n~~~~~\nb") == [True, True, True, True, False]


def test_fences_nested_in_list_items_count_at_any_indent() -> None:
    assert _code("- item\n\n      ```\n      - not a bullet\n      ```\n- next") == [False, False, True, True, True, False]


def test_markers_and_notes_read_the_same_fences() -> None:
    """A marker, heading or bullet inside fenced code is an example; both editors agree on what is code."""
    body = "- kept\n  ```\n  ## Lessons learned\n  <!-- runbook:notes-status -->\n  - in code\n  ~~~\n  - still code\n  ```\n- kept too\n"
    text = "# N\n\n## Lessons learned\n\n" + body
    assert notes.read_lessons(text) == ["kept", "kept too"]
    assert list(notes.find_sections(text)) == ["Lessons learned"] and notes.find_status_block(text) is None
    blocks, problems = find_blocks("<!-- runbook:status -->\n" + body + "<!-- /runbook:status -->\n")
    assert [b.name for b in blocks] == ["status"] and problems == []
