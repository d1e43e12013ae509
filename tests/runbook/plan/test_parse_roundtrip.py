"""Round trip: the parsed spans of every plan re-assemble the exact original bytes.

Covers every plan file under tests/ and plans/, the examples in docs/plan-format.md, CRLF and BOM
variants of all of them, and (with hypothesis) documents stitched together from plan-like lines.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runbook.model import Plan
from runbook.plan.parse import parse_plan, reassemble

REPO = Path(__file__).resolve().parents[3]


def doc_examples() -> list[tuple[str, str]]:
    doc = (REPO / "docs" / "plan-format.md").read_text()
    blocks = re.findall(r"^````markdown\n(.*?)^````$", doc, re.S | re.M)
    return [(f"docs/plan-format.md#example{i}", b) for i, b in enumerate(blocks) if b.startswith("---")]


def plan_files() -> list[Path]:
    files = sorted((REPO / "plans").rglob("*.md")) + sorted((REPO / "tests").rglob("*.md"))
    return [p for p in files if b"runbook:" in p.read_bytes()[:4096]]


def sources() -> list[tuple[str, bytes]]:
    out = [(str(p.relative_to(REPO)), p.read_bytes()) for p in plan_files()]
    out += [(name, text.encode()) for name, text in doc_examples()]
    return out


def check_round_trip(plan: Plan, data: bytes) -> None:
    """The helper: front matter + preamble + phase spans == text == the original bytes, and every
    sub-span (heading, steps, blocks, criterion) lies inside its phase."""
    text = plan.text
    assert text.encode("utf-8") == data
    assert plan.front_matter_span.start == 0
    assert reassemble(plan) == text
    ends = [plan.front_matter_span.end] + [p.span.start for p in plan.phases]
    assert ends == sorted(ends)
    for a, b in zip(plan.phases, plan.phases[1:], strict=False):
        assert a.span.end == b.span.start
    if plan.phases:
        assert plan.phases[-1].span.end == len(text)
    for phase in plan.phases:
        inside = range(phase.span.start, phase.span.end + 1)
        assert phase.heading_span.start == phase.span.start
        assert text[phase.span.start :].lstrip().startswith("##")
        for step in phase.steps:
            assert step.span.start in inside and step.span.end in inside
            assert text[step.checkbox] in " xX" and text[step.checkbox - 1] == "[" and text[step.checkbox + 1] == "]"
            assert (text[step.checkbox] != " ") == step.done
        for block in phase.blocks.values():
            assert block.span.start in inside and block.span.end in inside
            assert text[block.span.start :].startswith(f"<!-- runbook:{block.name}")
        if phase.criterion is not None:
            assert phase.criterion.text in text[phase.criterion.span.start : phase.criterion.span.end]


ALL = sources()


def test_there_are_plans_to_check() -> None:
    names = [name for name, _ in ALL]
    assert any(name.startswith("plans/") for name in names)
    assert sum(name.startswith("docs/") for name in names) >= 2
    assert sum(name.startswith("tests/malformed/") for name in names) >= 10


@pytest.mark.parametrize("name,data", ALL, ids=[n for n, _ in ALL])
@pytest.mark.parametrize("variant", ["as-is", "crlf", "bom", "crlf+bom"])
def test_spans_reassemble_the_exact_bytes(name: str, data: bytes, variant: str) -> None:
    if "crlf" in variant:
        data = data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    if "bom" in variant:
        data = b"\xef\xbb\xbf" + data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        pytest.skip("not UTF-8 (the corpus case for undecodable files)")
    plan, _ = parse_plan(text, name)
    if plan is None:
        assert "malformed" in name, f"{name} should parse"
        return
    check_round_trip(plan, data)


@pytest.mark.parametrize("name,data", [s for s in ALL if not s[0].startswith("tests/malformed/")])
def test_crlf_and_bom_parse_to_the_same_plan(name: str, data: bytes) -> None:
    lf = data.decode()
    crlf = "\ufeff" + lf.replace("\n", "\r\n")
    a, pa = parse_plan(lf, name)
    b, pb = parse_plan(crlf, name)
    assert a is not None and b is not None
    assert [str(p) for p in pa] == [str(p) for p in pb]
    strip = {"span", "heading_span", "blocks", "steps", "criterion"}
    assert [p.model_dump(exclude=strip) for p in a.phases] == [p.model_dump(exclude=strip) for p in b.phases]
    for pa_, pb_ in zip(a.phases, b.phases, strict=True):
        assert [(s.command, s.text, s.done) for s in pa_.steps] == [(s.command, s.text, s.done) for s in pb_.steps]
        assert all("\r" not in s.command for s in pb_.steps)
        assert [p.span.start_line for p in [pa_]] == [p.span.start_line for p in [pb_]]
    check_round_trip(b, crlf.encode())


# ---- generated documents ---------------------------------------------------------------------

LINES = [
    "",
    "Prose about the plan.",
    "## Phase 0: Probe (~5 min)",
    "## Phase 1: Next {#next}",
    "## Phase 2b: Third (~1 h)",
    "## Appendix",
    "# Title",
    "### Phase 9: too deep",
    "Steps:",
    "- [ ] Do it: `echo {x}`",
    "- [x] Done: `true`",
    "- [ ] No command",
    "  ```sh",
    "  echo nested",
    "```",
    "~~~",
    "Pass: `score >= 1`",
    "Pass: score >",
    "On pass: Phase 1",
    "On fail: stop",
    "Needs: Phase 0",
    "Timeout: 20m",
    "<!-- runbook:status -->",
    "**Status:** pass · 2026-11-29 14:30 UTC · run 1",
    "<!-- /runbook:status -->",
    "<!-- runbook:results -->",
    "<!-- /runbook:results -->",
    "> ## Phase 3: quoted",
    "Phase 4: underlined",
    "---",
    "    indented code",
    "\t- [ ] tabbed",
    "| a | b |",
    "café ✓ \u2028 \x0c",
]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(LINES), max_size=40),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.booleans(),
    st.booleans(),
)
def test_generated_documents_never_crash_and_round_trip(lines: list[str], nl: str, bom: bool, final_nl: bool) -> None:
    text = nl.join(["---", "runbook: 1", "vars:", "  x: a b", "---", *lines]) + (nl if final_nl else "")
    if bom:
        text = "\ufeff" + text
    plan, problems = parse_plan(text, "gen.md")
    assert plan is not None
    assert reassemble(plan) == text
    check_round_trip(plan, text.encode())
    for problem in problems:
        assert problem.file == "gen.md" and problem.line >= 1 and problem.col >= 1
