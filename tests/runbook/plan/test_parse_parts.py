"""The parser's helpers: `{var}` resolution, marked blocks, and project discovery."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from helpers import git
from hypothesis import given, settings
from hypothesis import strategies as st

from runbook.plan.markers import find_blocks, render_block
from runbook.plan.mdtext import detect_newline
from runbook.plan.resolve import placeholders, resolve_command, suspicious_groups
from runbook.store.project import ConfigError, discover_plans, find_repo_root, load_config, state_dir

VARS = {"target": "work/target", "spaced": "my dir", "evil": "x; rm -rf /"}


# ---- resolve -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command,resolved",
    [
        ("eagle --out {target}", "eagle --out work/target"),
        ("ls {spaced}/a", "ls 'my dir'/a"),
        ("echo {evil}", "echo 'x; rm -rf /'"),
        ("echo {{target}} }} {{", "echo {target} } {"),
        ("echo ${HOME} ${target}", "echo ${HOME} ${target}"),
        ("""echo '{"a": {"b": 1}}' > m.json""", """echo '{"a": {"b": 1}}' > m.json"""),
        ("awk '{print $1}' f", "awk '{print $1}' f"),
        ("find . -exec rm {} \\;", "find . -exec rm {} \\;"),
        ("echo {a,b} {1..3}", "echo {a,b} {1..3}"),
        ('echo "{\\"n\\": $(ls {target} | wc -l)}"', 'echo "{\\"n\\": $(ls work/target | wc -l)}"'),
        ("echo {undeclared}", "echo {undeclared}"),
        ("unclosed {", "unclosed {"),
    ],
)
def test_resolve(command: str, resolved: str) -> None:
    assert resolve_command(command, VARS) == resolved


def test_placeholders_and_suspicious_groups() -> None:
    assert placeholders("a {target} {x} {target} ${y} '{\"k\": {spaced}}'") == ["target", "x"]
    found = [(piece.text, guess) for piece, guess in suspicious_groups("a { target } '{\"k\": {tagret}}' {json}", VARS)]
    assert found == [("{ target }", "target"), ("{tagret}", "target")]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30))
def test_a_var_value_always_arrives_as_one_argument(value: str) -> None:
    resolved = resolve_command("prog --x {v} --y", {"v": value})
    assert shlex.split(resolved) == ["prog", "--x", value, "--y"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab $'\"{}\\", max_size=25))
def test_resolution_is_total_and_identity_without_vars(command: str) -> None:
    # with no vars declared, only `{{` / `}}` escapes change
    out = resolve_command(command, {})
    if "{{" not in command and "}}" not in command:
        assert out == command


# ---- markers -------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["status", "results", "a-b.c"]),
    st.lists(st.sampled_from(["| a | b |", "**Status:** pass", "", "text"]), max_size=4),
    st.sampled_from(["\n", "\r\n"]),
)
def test_render_then_find_gives_back_the_inner_text(name: str, lines: list[str], nl: str) -> None:
    inner = "".join(line + nl for line in lines)
    text = f"before{nl}" + render_block(name, inner, nl) + "after"
    blocks, problems = find_blocks(text)
    assert problems == []
    [block] = blocks
    assert block.name == name and block.inner == inner
    assert text[block.span.start : block.span.end] == render_block(name, inner, nl)
    assert block.span.start_line == 2 and block.span.end_line == 3 + len(lines)


def test_markers_in_fences_are_examples_and_attrs_are_read() -> None:
    text = (
        "```markdown\n<!-- runbook:status -->\n```\n"
        "~~~~\n<!-- /runbook:results -->\n```\n~~~~\n"
        "  <!-- runbook:results sha=1a2b run=r1 -->\n| x |\n<!-- /runbook:results -->\n"
    )
    blocks, problems = find_blocks(text, file="p.md")
    assert problems == []
    [block] = blocks
    assert (block.name, block.attrs, block.inner, block.span.start_line) == ("results", {"sha": "1a2b", "run": "r1"}, "| x |\n", 8)


def test_marker_problems() -> None:
    text = "<!-- runbook:a -->\n<!-- runbook:b -->\n<!-- /runbook:a -->\n<!-- runbook:a --> trailing\n<!-- /runbook:z -->\n"
    blocks, problems = find_blocks(text, file="p.md")
    assert [b.name for b in blocks] == ["a"]
    assert [(p.line, p.message.split(" ")[0]) for p in problems] == [(2, "marker"), (4, "a"), (5, "closing")]
    assert all(p.file == "p.md" for p in problems)


def test_find_blocks_in_a_range_and_newlines() -> None:
    text = "x\n<!-- runbook:a -->\n1\n<!-- /runbook:a -->\ny\n<!-- runbook:a -->\n2\n<!-- /runbook:a -->\n"
    start = text.index("y")
    blocks, problems = find_blocks(text, start, len(text), first_line=5)
    assert problems == [] and [(b.inner, b.span.start_line) for b in blocks] == [("2\n", 6)]
    assert detect_newline("a\r\nb") == "\r\n" and detect_newline("a") == "\n"


# ---- project -------------------------------------------------------------------------------

PLAN = "---\nrunbook: 1\n---\n\n## Phase 0: A\n\nSteps:\n- [ ] x: `true`\n"


def test_repo_root_from_git(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    (deep / "f.md").write_text("x")
    assert find_repo_root(deep) == tmp_path.resolve()
    assert find_repo_root(deep / "f.md") == tmp_path.resolve()
    # a worktree or submodule has a .git *file*
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / ".git").write_text("gitdir: ../.git/modules/sub\n")
    assert find_repo_root(sub) == sub.resolve()


def test_config_sources(tmp_path: Path) -> None:
    assert load_config(tmp_path).plans == ["plans/*.md"] and load_config(tmp_path).source is None
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.runbook]\nplans = "docs/*.md"\nstate = "var/state"\n')
    config = load_config(tmp_path)
    assert (config.plans, config.state) == (["docs/*.md"], "var/state")
    assert state_dir(tmp_path) == tmp_path / "var" / "state"
    (tmp_path / "runbook.toml").write_text('plans = ["a/*.md", "b/*.md"]\n')
    assert load_config(tmp_path).plans == ["a/*.md", "b/*.md"]  # runbook.toml wins
    (tmp_path / "runbook.toml").write_text('plans = [\n')
    with pytest.raises(ConfigError, match="runbook.toml: not valid TOML"):
        load_config(tmp_path)
    (tmp_path / "runbook.toml").write_text("state = 3\n")
    with pytest.raises(ConfigError, match="state"):
        load_config(tmp_path)


def test_discover_plans(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "b.md").write_text(PLAN)
    (plans / "a.md").write_bytes(b"\xef\xbb\xbf" + PLAN.replace("\n", "\r\n").encode())
    (plans / "notes.md").write_text("---\ntitle: notes\n---\n# Notes\n")
    (plans / "prose.md").write_text("# runbook: not front matter\n")
    (plans / "sub").mkdir()
    (plans / "sub" / "c.md").write_text(PLAN)
    assert [p.name for p in discover_plans(tmp_path)] == ["a.md", "b.md"]
    (tmp_path / "runbook.toml").write_text('plans = ["plans/**/*.md"]\n')
    assert sorted(p.name for p in discover_plans(tmp_path)) == ["a.md", "b.md", "c.md"]
