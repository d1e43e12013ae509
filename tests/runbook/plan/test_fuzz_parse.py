"""Parser fuzzing: hostile Markdown never gives a traceback, and every input that parses round-trips.

Inputs: the example plans, the malformed corpus and the docs examples, mutated (cut at random
points, spliced, duplicated, junk inserted, CRLF / CR / BOM / tabs, very long lines), random
Unicode text with and without front matter, random bytes, a 100k-line plan and a 1 MB line.

For every input: `parse_plan` / `read_plan` return (Plan | None, problems) and never raise; a
None plan comes with at least one error; every problem names the file, a line inside it and a
column >= 1; when a plan comes back, its spans re-assemble the exact input text (so bytes
re-encode identically). A sample of mutants also goes through the real `runbook validate`.

Budget: RUNBOOK_FUZZ_EXAMPLES=5000 runs the biggest test with 5000 examples (default 200).
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from pathlib import Path

import helpers as H
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runbook.model import Plan, Problem
from runbook.plan.markers import find_blocks
from runbook.plan.parse import parse_plan, read_plan, reassemble

REPO = H.REPO
SCRATCH = Path(tempfile.mkdtemp(prefix="runbook-fuzz-"))


def _corpus() -> list[bytes]:
    files = sorted((REPO / "plans").rglob("*.md")) + sorted((REPO / "tests").rglob("*.md"))
    seeds = [p.read_bytes() for p in files]
    doc = (REPO / "docs" / "plan-format.md")
    if doc.exists():
        seeds += [b.encode() for b in re.findall(r"^````markdown\n(.*?)^````$", doc.read_text(), re.S | re.M)]
    return [s for s in seeds if s]


CORPUS = _corpus()

SNIPPETS = [
    "---\n", "runbook: 1\n", "## Phase 0: Probe (~5 min)\n", "## Phase 1: again {#phase-0}\n",
    "## Phase 2b\n", "# Title\n", "Steps:\n", "- [ ] Do: `echo {x}`\n", "- [x] Done: `true`\n",
    "  ```sh\n  echo nested\n  ```\n", "```\n", "~~~~\n", "Pass: `a >= 1 and (b < 2 or not c == 3)`\n",
    "Pass: a >\n", "Pass: ((((((((((a\n", "On pass: Phase 9\n", "On fail: stop\n", "Needs: Phase 0, Phase 1\n",
    "Timeout: 99999999999999999999h\n", "Timeout: -1s\n", "<!-- runbook:status -->\n",
    "<!-- /runbook:status -->\n", "<!-- runbook:results sha=deadbeef -->\n", "<!-- /runbook:results -->\n",
    "<!-- runbook:status --> trailing\n", "**Status:** pass · 2026-11-29 14:30 UTC · run x\n",
    "vars:\n  x: 1\n", "vars: [1, 2]\n", "notes: ../../etc/passwd\n", "title: {a: b}\n", "runbook: 2\n",
    "\t- [ ] tab: `x`\n", "    indented code\n", "> ## Phase 3: quoted\n", "| a | b |\n|---|---|\n",
    "\x00", "\ufeff", "\r", "\r\n", "\u2028", "\x0c", "\x1b[31m", "é✓𝔘", "{{", "}}", "{", "`", "\\",
    "[ ]", "<!--", "-->", "*" * 50, "#" * 7 + " deep\n", "a" * 5000,
    # round two: deep criteria, criteria right under a step, string literals, aliases, vars in quotes
    "Pass: " + "(" * 300 + "a > 1" + ")" * 300 + "\n", "Pass: " + "not " * 300 + "a > 1\n",
    "- [ ] s: `true`\nPass: m >= 1\n", 'Pass: `opt == "adamw" and x != \'y\'`\n', "Pass: `a == \"`\n",
    "runbook: &a [*a]\n", "x: &b [*b, *b]\ny: [*b, *b, *b]\n", "- [ ] q: `echo '{x}'`\n",
    '- [ ] q: `echo "{x}" ${{x}} $(( {x} ))`\n', "  ```sh\n  cat <<EOF\n  {x}\n  EOF\n  ```\n",
]

text_mutation = st.one_of(
    st.tuples(st.just("cut"), st.floats(0, 1)),
    st.tuples(st.just("delete"), st.floats(0, 1), st.floats(0, 1)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.sampled_from(SNIPPETS)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.text(max_size=30)),
    st.tuples(st.just("duplicate"), st.floats(0, 1), st.floats(0, 1)),
    st.tuples(st.just("swap_lines"), st.floats(0, 1), st.floats(0, 1)),
    st.tuples(st.just("newlines"), st.sampled_from(["\r\n", "\r", "\n"])),
    st.tuples(st.just("bom")),
    st.tuples(st.just("tabs")),
    st.tuples(st.just("long_line"), st.floats(0, 1), st.integers(1000, 200_000)),
)


def _at(text: str, frac: float) -> int:
    return min(len(text), int(frac * len(text)))


def mutate(text: str, ops: list[tuple]) -> str:
    for op in ops:
        kind = op[0]
        if kind == "cut":
            text = text[: _at(text, op[1])]
        elif kind == "delete":
            a, b = sorted((_at(text, op[1]), _at(text, op[2])))
            text = text[:a] + text[b:]
        elif kind == "insert":
            p = _at(text, op[1])
            text = text[:p] + op[2] + text[p:]
        elif kind == "duplicate":
            a, b = sorted((_at(text, op[1]), _at(text, op[2])))
            text = text[:b] + text[a:b] + text[b:]
        elif kind == "swap_lines":
            lines = text.splitlines(keepends=True)
            if len(lines) > 1:
                i, j = int(op[1] * (len(lines) - 1)), int(op[2] * (len(lines) - 1))
                lines[i], lines[j] = lines[j], lines[i]
                text = "".join(lines)
        elif kind == "newlines":
            text = re.sub(r"\r\n|\r|\n", op[1], text)
        elif kind == "bom":
            text = "\ufeff" + text
        elif kind == "tabs":
            text = re.sub(r"(?m)^  ", "\t", text)
        elif kind == "long_line":
            p = _at(text, op[1])
            text = text[:p] + ("x`{y}` " * (op[2] // 7)) + text[p:]
    return text


def _line_count(text: str) -> int:
    return len(re.findall(r"\r\n|\r|\n", text)) + 1


def check_parse(text: str, name: str = "fuzz.md") -> tuple[Plan | None, list[Problem]]:
    """The invariants every input must satisfy; returns the parse."""
    plan, problems = parse_plan(text, name)
    assert isinstance(problems, list)
    if plan is None:
        assert any(p.severity == "error" for p in problems), "no plan and no error"
    nlines = _line_count(text)
    for p in problems:
        assert p.file == name
        assert 1 <= p.line <= nlines + 1, (p, nlines)
        assert p.col >= 1
        assert str(p).startswith(f"{name}:{p.line}:{p.col}: ")
        assert p.message.strip()
    if plan is not None:
        assert plan.text == text
        assert reassemble(plan) == text
        assert plan.text.encode("utf-8", "surrogatepass") == text.encode("utf-8", "surrogatepass")
        for phase in plan.phases:
            assert text[phase.span.start : phase.span.end]
            for step in phase.steps:
                assert text[step.checkbox - 1] == "[" and text[step.checkbox + 1] == "]"
            for block in phase.blocks.values():
                assert text[block.span.start :].lstrip(" ").startswith(f"<!-- runbook:{block.name}")
        # the marker scanner is total over the same text
        find_blocks(text, file=name)
    return plan, problems


# ---- mutated corpus --------------------------------------------------------------------------


@settings(max_examples=H.examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(range(len(CORPUS))), st.lists(text_mutation, min_size=1, max_size=6))
def test_mutated_plans_never_crash_and_round_trip(counts, seed: int, ops: list[tuple]) -> None:
    text = mutate(CORPUS[seed].decode("utf-8", "replace"), ops)
    check_parse(text)
    counts.add("parse_inputs_mutated")


@settings(max_examples=H.examples(100), deadline=None)
@given(st.text(max_size=2000), st.booleans())
def test_random_text_never_crashes(counts, body: str, front_matter: bool) -> None:
    text = ("---\nrunbook: 1\n---\n" + body) if front_matter else body
    check_parse(text)
    counts.add("parse_inputs_random_text")


@settings(max_examples=H.examples(100), deadline=None)
@given(st.binary(max_size=3000), st.sampled_from([b"", b"---\nrunbook: 1\n---\n## Phase 0: x\n"]))
def test_binary_junk_is_a_problem_not_a_crash(counts, junk: bytes, prefix: bytes) -> None:
    path = SCRATCH / "junk.md"
    data = prefix + junk
    path.write_bytes(data)
    plan, problems = read_plan(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        assert plan is None and len(problems) == 1
        p = problems[0]
        assert p.file == str(path) and p.line >= 1 and p.col >= 1 and "UTF-8" in p.message
    else:
        plan2, problems2 = check_parse(text, str(path))
        assert [str(p) for p in problems] == [str(p) for p in problems2]
    counts.add("parse_inputs_binary")


@settings(max_examples=H.examples(60), deadline=None)
@given(st.sampled_from(range(len(CORPUS))), st.integers(0, 10**9), st.sampled_from(["\n", "\r\n", "\r"]),
       st.booleans())
def test_every_cut_point_of_every_seed(counts, seed: int, cut: int, nl: str, bom: bool) -> None:
    text = CORPUS[seed].decode("utf-8", "replace")
    text = re.sub(r"\r\n|\r|\n", nl, text)
    text = ("\ufeff" if bom else "") + text[: cut % (len(text) + 1)]
    check_parse(text)
    counts.add("parse_inputs_cut")


# ---- size ------------------------------------------------------------------------------------


def _big_plan(n_lines: int) -> str:
    head = "---\nrunbook: 1\nvars:\n  x: a b\n---\n# Big\n\n"
    phase = (
        "## Phase {i}: part {i} (~1 min)\n\nProse line.\n\nSteps:\n- [ ] One: `echo {{x}} {i}`\n"
        "- [x] Two:\n  ```sh\n  echo two\n  ```\n\nPass: `score >= {i}`\n\n"
    )
    chunks = [head]
    lines = head.count("\n")
    i = 0
    while lines < n_lines:
        piece = phase.format(i=i)
        chunks.append(piece)
        lines += piece.count("\n")
        i += 1
    return "".join(chunks)


@pytest.mark.slow
def test_100k_line_plan_parses_and_round_trips(counts) -> None:
    text = _big_plan(100_000)
    assert text.count("\n") >= 100_000
    t0 = time.monotonic()
    plan, problems = check_parse(text, "big.md")
    took = time.monotonic() - t0
    assert plan is not None and len(plan.phases) > 5000
    assert not [p for p in problems if p.severity == "error"], problems[:3]
    assert took < 120, f"100k lines took {took:.1f}s"
    crlf = text.replace("\n", "\r\n")
    plan2, _ = check_parse(crlf, "big.md")
    assert plan2 is not None and len(plan2.phases) == len(plan.phases)
    print(f"100k-line plan: {len(plan.phases)} phases parsed in {took:.1f}s")
    counts.report("parse_inputs_huge", 2)


def test_megabyte_line_and_100k_junk_lines(counts) -> None:
    long_line = "---\nrunbook: 1\n---\n## Phase 0: x\nSteps:\n- [ ] a: `" + "y" * 1_000_000 + "`\n"
    plan, _ = check_parse(long_line, "long.md")
    assert plan is not None and len(plan.phases[0].steps[0].command) == 1_000_000
    junk = "---\nrunbook: 1\n---\n" + "<!-- runbook:status -->\n```\n- [ ] `x`\n\t## Phase 1\n" * 25_000
    check_parse(junk, "junk.md")
    counts.report("parse_inputs_huge", 2)


# ---- the real CLI on mutants -----------------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=H.examples(5), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(range(len(CORPUS))), st.lists(text_mutation, min_size=1, max_size=4),
                          st.booleans()), min_size=10, max_size=10))
def test_runbook_validate_on_mutants_never_tracebacks(counts, batch: list) -> None:
    folder = Path(tempfile.mkdtemp(dir=SCRATCH))
    paths = []
    for i, (seed, ops, corrupt) in enumerate(batch):
        data = mutate(CORPUS[seed].decode("utf-8", "replace"), ops).encode("utf-8", "surrogatepass")
        if corrupt and data:
            data = data[: len(data) // 2] + b"\xff\xfe" + data[len(data) // 2 :]
        path = folder / f"m{i}.md"
        path.write_bytes(data)
        paths.append(path.name)
    for args in (paths, ["--json", *paths]):
        result = subprocess.run([*H.RUNBOOK, "validate", *args], cwd=folder, capture_output=True, text=True,
                                env=H.cli_env(), timeout=120)
        H.assert_no_traceback(result, "runbook validate")
        assert result.returncode in (0, 2), result.stderr[-2000:]
        if "--json" in args:
            envelope = json.loads(result.stdout)
            assert envelope["ok"] is True and envelope["exit_code"] == result.returncode
            data = envelope["result"]
            assert [p["plan"] for p in data["plans"]] == paths
            assert data["valid"] == (result.returncode == 0)
        else:
            for line in result.stderr.splitlines():
                m = re.match(r"(m\d+\.md):(\d+):(\d+): ", line)
                if m:
                    assert m.group(1) in paths
    counts.add("parse_inputs_cli", len(paths))
