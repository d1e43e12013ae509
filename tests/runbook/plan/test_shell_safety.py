"""Shell safety and containment: vars are data, and a plan cannot make runbook write outside the repo.

- `{var}` values holding spaces, quotes, `$(...)`, backticks, `;`, `&&`, pipes, globs, newlines,
  `$HOME`, leading dashes reach the step as one argument, byte for byte, and nothing in them runs
  (property-based on `resolve_command` + `bash -c`, and through the real `runbook next`).
- `notes:` pointing outside the repository (`../../x`, absolute paths) and `state` outside it are
  refused with the file named, and nothing is written outside; a ledger file with a hostile
  run id or log path does not steer any write.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import helpers as H
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runbook.plan.resolve import resolve_command

HOSTILE = [
    "two words",
    "it's",
    'say "hi"',
    "$(touch PWNED)",
    "`touch PWNED`",
    "a; touch PWNED",
    "a && touch PWNED",
    "a | tee PWNED",
    "> PWNED",
    "line1\nline2; touch PWNED",
    "$HOME ${PATH} $((1+1))",
    "*",
    "-rf --no-preserve-root",
    "back\\slash\\",
    "{x} {{y}} }{",
    "tab\there",
    "'\"'\"'",
    "\u00e9\u2713 \U0001d518",
    "",
]

safe_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=60)


def _bash(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, timeout=30)


@settings(max_examples=H.examples(150), deadline=None)
@given(st.one_of(st.sampled_from(HOSTILE), safe_text))
def test_any_var_value_is_one_argument_never_code(counts, value: str) -> None:
    work = Path(__import__("tempfile").mkdtemp(prefix="shell-"))
    command = resolve_command("printf '%s\\0' {v} > out.bin", {"v": value})
    result = _bash(command, work)
    assert result.returncode == 0, result.stderr
    assert (work / "out.bin").read_bytes() == value.encode("utf-8") + b"\0"
    assert sorted(p.name for p in work.iterdir()) == ["out.bin"], "something ran"
    counts.add("shell_values_checked")


PLAN_TEMPLATE = """\
---
runbook: 1
title: Shell safety
vars:
{vars}
---

## Phase 0: Quote everything

Steps:
{steps}
- [ ] Score: `echo '{{"ok": 1}}' > "$RUNBOOK_METRICS"`

Pass: `ok == 1`
"""


@pytest.mark.slow
def test_hostile_vars_through_runbook_next(tmp_path: Path, counts) -> None:
    values = [v for v in HOSTILE if v]
    vars_yaml = "\n".join(f"  v{i}: {json.dumps(v, ensure_ascii=False)}" for i, v in enumerate(values))
    steps = "\n".join(f"- [ ] Echo {i}: `printf '%s\\0' {{v{i}}} > out{i}.bin`" for i in range(len(values)))
    plan = PLAN_TEMPLATE.format(vars=vars_yaml, steps=steps)
    repo = H.make_repo(tmp_path / "repo", plan)
    (repo / ".gitignore").write_text((repo / ".gitignore").read_text() + "out*.bin\n")
    H.git(repo, "commit", "-qam", "ignore outputs")
    dry = H.runbook_inproc(repo, "next", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    result = H.runbook(repo, "next", "--yes")
    H.assert_no_traceback(result)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    for i, value in enumerate(values):
        assert (repo / f"out{i}.bin").read_bytes() == value.encode() + b"\0", value
    assert not list(repo.rglob("PWNED")) and not list(Path.home().glob("PWNED"))
    counts.add("shell_values_checked", len(values))


# ---- containment ----------------------------------------------------------------------------


def _plan_with_notes(notes: str) -> str:
    return f"---\nrunbook: 1\nnotes: {json.dumps(notes)}\n---\n\n## Phase 0: a\n\nSteps:\n- [ ] x: `true`\n"


@pytest.mark.parametrize("notes", ["../../escaped-notes.md", "../x/../../escaped-notes.md", "ABS"])
def test_notes_outside_the_repo_is_refused(tmp_path: Path, counts, notes: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    if notes == "ABS":
        notes = str(outside / "escaped-notes.md")
    repo = H.make_repo(tmp_path / "box" / "repo", _plan_with_notes(notes))
    before = H.tree_snapshot(tmp_path)
    for args in (["record", "Escape", "--lesson", "l", "--next", "n"], ["record", "Escape", "--no-commit"], ["brief"]):
        result = H.runbook(repo, *args)
        H.assert_no_traceback(result, " ".join(args))
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "plans/plan.md" in result.stderr and ("outside" in result.stderr or "relative" in result.stderr), result.stderr
    after = H.tree_snapshot(tmp_path)
    assert after == before, sorted(set(after) ^ set(before))
    assert not list(tmp_path.rglob("escaped-notes.md"))
    counts.add("escapes_refused")


def test_absolute_notes_is_a_validate_error(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", _plan_with_notes("/etc/runbook-notes.md"))
    result = H.runbook_inproc(repo, "validate")
    assert result.returncode == 2
    assert "plans/plan.md:3:1:" in result.stderr and "relative" in result.stderr


def test_notes_symlink_out_of_the_repo_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "real.md").write_text("# Not yours\n")
    repo = H.make_repo(tmp_path / "repo", _plan_with_notes("notes.md"))
    (repo / "plans" / "notes.md").symlink_to(outside / "real.md")
    result = H.runbook_inproc(repo, "record", "Through a link", "--no-commit")
    assert result.returncode == 2, result.stdout + result.stderr
    assert (outside / "real.md").read_text() == "# Not yours\n"


@pytest.mark.parametrize("state", ["../escaped-state", "/tmp/runbook-escaped-state-test"])
def test_state_dir_outside_the_repo_is_refused(tmp_path: Path, counts, state: str) -> None:
    plan = "---\nrunbook: 1\n---\n\n## Phase 0: a\n\nSteps:\n- [ ] x: `true`\n"
    repo = H.make_repo(tmp_path / "repo", plan)
    (repo / "runbook.toml").write_text(f'state = "{state}"\n')
    H.git(repo, "add", "runbook.toml")
    H.git(repo, "commit", "-qm", "config")
    for args in (["next", "--yes"], ["record", "x", "--no-commit"]):
        result = H.runbook(repo, *args)
        H.assert_no_traceback(result, " ".join(args))
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "runbook.toml" in result.stderr and "outside" in result.stderr
    assert not (tmp_path / "escaped-state").exists()
    assert not Path("/tmp/runbook-escaped-state-test").exists()
    counts.add("escapes_refused")


def test_a_state_dir_that_links_out_of_the_repo_is_named_with_its_fix(tmp_path: Path, counts) -> None:
    """No runbook.toml, `state` a symlink to a directory outside: every verb refuses, naming `state`
    (never "None:", the absent config file), where it points and the fix; nothing is written there."""
    plan = "---\nrunbook: 1\n---\n\n## Phase 0: a\n\nSteps:\n- [ ] x: `true`\n"
    repo = H.make_repo(tmp_path / "repo", plan)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (repo / "state").symlink_to(outside)
    for args in (["next", "--yes"], ["status"], ["record", "x", "--no-commit"]):
        result = H.runbook_inproc(repo, *args)
        H.assert_no_traceback(result, " ".join(args))
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert result.stderr.startswith(f"state: the state directory is a link to {outside}"), result.stderr
        assert "None" not in result.stderr and "replace the link with a real directory" in result.stderr
    doc = json.loads(H.runbook_inproc(repo, "status", "--json").stdout)
    assert doc["error"]["code"] == "config" and doc["error"]["file"] == "state", doc
    assert list(outside.iterdir()) == []
    counts.add("escapes_refused")


@pytest.mark.slow
def test_hostile_ledger_ids_and_log_paths_steer_no_write(tmp_path: Path, counts) -> None:
    """A hand-made run record whose run id and log path climb out of the repo."""
    plan = (
        "---\nrunbook: 1\nnotes: notes.md\n---\n\n## Phase 0: a\n\nSteps:\n"
        "- [ ] x: `echo '{\"m\": 1}' > \"$RUNBOOK_METRICS\"`\n\nPass: `m >= 1`\n"
    )
    repo = H.make_repo(tmp_path / "box" / "repo", plan)
    evil = {
        "schema_version": 1, "run_id": "../../../../evil-run", "plan": "plans/plan.md", "plan_blob": "0" * 40,
        "phase": "phase-0", "phase_label": "0", "phase_text_hash": "0", "started": "2026-01-01T00:00:00.000000Z",
        "verdict": "error", "reason": "hand-made",
        "steps": [{"step_id": "../../../../evil-step", "command": "true", "exit_code": 1,
                   "log_path": "../../../../evil.log"}],
    }
    runs = repo / "state" / "runs"
    runs.mkdir(parents=True)
    (runs / "20260101-000000-0000.json").write_text(json.dumps(evil))
    H.git(repo, "add", "-f", "state")
    H.git(repo, "commit", "-qm", "hostile ledger")
    before = {p for p in H.tree_snapshot(tmp_path) if not p.startswith("box/repo/")}
    for args in (["next", "--yes"], ["record", "After evil", "--run", "last"], ["brief"], ["history"],
                 ["next", "--yes", "--phase", "0", "--restart"]):
        result = H.runbook(repo, *args)
        H.assert_no_traceback(result, " ".join(args))
    after = {p for p in H.tree_snapshot(tmp_path) if not p.startswith("box/repo/")}
    assert after == before, sorted(after - before)
    assert not list(tmp_path.rglob("evil*"))
    counts.add("escapes_refused")


# ---- vars inside the author's own quotes, here-documents and comments -------------------------------

# (template, expected bytes of out.bin given the value v); each writes out.bin in its own directory
CONTEXTS = {
    "plain": ("printf '%s\\0' {v} > out.bin", lambda v: v + "\0"),
    "single": ("printf '%s\\0' 'pre{v}post' > out.bin", lambda v: f"pre{v}post\0"),
    "double": ('printf \'%s\\0\' "pre{v}post" > out.bin', lambda v: f"pre{v}post\0"),
    "json-in-single": ("echo '{{\"name\": \"{v}\"}}' > out.bin", lambda v: '{"name": "' + v + '"}\n'),
    "json-group": ("echo '{\"name\": \"{v}\"}' > out.bin", lambda v: '{"name": "' + v + '"}\n'),
    "ansi-c": ("printf '%s\\0' $'pre{v}post' > out.bin", lambda v: f"pre{v}post\0"),
    "cmd-subst-in-double": (
        "printf '%s\\0' \"$(printf '%s' {v})\" > out.bin", lambda v: v.rstrip("\n") + "\0"
    ),
    "double-in-cmd-subst": (
        "printf '%s\\0' \"$(printf '%s' \"{v}\")\" > out.bin", lambda v: v.rstrip("\n") + "\0"
    ),
    "heredoc": ("cat > out.bin <<EOF\npre{v}post\nEOF", lambda v: f"pre{v}post\n"),
    "heredoc-quoted": ("cat > out.bin <<'EOF'\npre{v}post $HOME\nEOF", lambda v: f"pre{v}post $HOME\n"),
    "heredoc-dash": ("cat > out.bin <<-END\n\tpre{v}post\n\tEND", lambda v: f"pre{v}post\n"),
    "comment": ("printf done > out.bin # {v} ; touch PWNED", lambda v: "done"),
    "here-string": ("cat > out.bin <<< {v}", lambda v: v + "\n"),
    "here-string-double": ('cat > out.bin <<<"pre{v}post"', lambda v: f"pre{v}post\n"),
}
# a value with a line break is refused (UnsafeVar) in these contexts: it could end them early
LINE_SENSITIVE = {"heredoc", "heredoc-quoted", "heredoc-dash", "comment"}

HOSTILE_IN_QUOTES = HOSTILE + [
    "'; touch PWNED; '", '"; touch PWNED; "', "\\", "\\'", '\\"', "$'\\x41'", "x\nEOF\ntouch PWNED",
    "EOF", "\tEND", "${HOME}", "$(touch PWNED)`touch PWNED`", "'$(touch PWNED)'", '"$(touch PWNED)"',
    "\\$(touch PWNED)", "!!", "\r\ntouch PWNED",
]


def _run_context(name: str, value: str, work: Path) -> None:
    from runbook.plan.resolve import UnsafeVar

    template, expected = CONTEXTS[name]
    try:
        command = resolve_command(template, {"v": value})
    except UnsafeVar as exc:
        assert name in LINE_SENSITIVE and ("\n" in value or "\r" in value), (name, value, exc)
        return
    box = work / name
    box.mkdir()
    result = _bash(command, box)
    assert result.returncode == 0, (name, value, command, result.stderr)
    assert (box / "out.bin").read_bytes() == expected(value).encode("utf-8"), (name, value, command)
    assert sorted(p.name for p in box.iterdir()) == ["out.bin"], ("something ran", name, value, command)


@settings(max_examples=H.examples(100), deadline=None)
@given(st.one_of(st.sampled_from(HOSTILE_IN_QUOTES), safe_text))
def test_var_inside_quotes_heredocs_and_comments_is_data(counts, value: str) -> None:
    """Every context a plan author may put `{v}` in: the value arrives byte for byte, nothing runs."""
    work = Path(__import__("tempfile").mkdtemp(prefix="shellctx-"))
    for name in CONTEXTS:
        _run_context(name, value, work)
    counts.add("shell_values_checked", len(CONTEXTS))


REFUSED = [
    ("echo `echo {v}`", "backticks"),
    ("echo ${X:-{v}}", "${...}"),
    ('echo "${X:-{v}}"', "${...}"),
    ("echo $(( {v} + 1 ))", "arithmetic"),
    ("(( n = {v} ))", "arithmetic"),
    ("echo \\{v}", "backslash"),
    ('echo "\\{v}"', "backslash"),
    ("cat <<{v}\nx\n", "delimiter"),
    ("echo '{v}", "never closed"),
    ('echo "{v}', "never closed"),
    ("cat <<EOF\n{v}\n", "here-document is not closed"),
]


@pytest.mark.parametrize("template, why", REFUSED)
def test_contexts_no_quoting_can_make_safe_are_refused(template: str, why: str) -> None:
    from runbook.plan.resolve import UnsafeVar, unsafe_vars

    with pytest.raises(UnsafeVar) as exc:
        resolve_command(template, {"v": "$(touch PWNED)"})
    assert why in exc.value.reason
    assert [u.piece.value for u in unsafe_vars(template, {"v": "x"})] == ["v"]


def _fenced(body: str) -> str:
    return "- [ ] Script:\n  ```sh\n" + "".join(f"  {line}\n" for line in body.split("\n")) + "  ```\n"


def test_validate_reports_every_unsafe_var_with_its_place(tmp_path: Path) -> None:
    steps = "".join(_fenced(t) for t, _why in REFUSED[:8])
    steps += _fenced("cat <<EOF\n{v}\nEOF")  # fine unless the value holds a line break: it does
    plan = PLAN_TEMPLATE.format(vars='  v: "a\\nEOF\\ntouch PWNED"', steps=steps)
    repo = H.make_repo(tmp_path / "repo", plan)
    result = H.runbook(repo, "validate")
    H.assert_no_traceback(result)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if "cannot be used here" in line]
    assert len(lines) == 9, result.stderr
    assert all(re.match(r"plans/plan\.md:\d+:\d+: step-\d+: \{v\} cannot be used here", line) for line in lines)
    assert "line break" in lines[-1]
    nxt = H.runbook_inproc(repo, "next", "--yes")
    assert nxt.returncode == 2 and not list(repo.rglob("PWNED"))


@pytest.mark.slow
def test_vars_in_every_context_through_runbook_next(tmp_path: Path, counts) -> None:
    """The trial's attacks, as a plan author would write them: `echo '{a}'`, `echo "{a}"`, the JSON
    pattern, an unquoted heredoc in a fenced step; validate says ok, and nothing runs."""
    value = "$(touch PWNED)`touch PWNED`'\"; touch PWNED; \\"
    steps = ""
    for i, (name, (template, _expected)) in enumerate(CONTEXTS.items()):
        body = template.replace("out.bin", f"out-{i}.bin")
        steps += _fenced(body) if "\n" in body else f"- [ ] {name}: `` {body} ``\n"
    plan = PLAN_TEMPLATE.format(vars=f"  v: {json.dumps(value)}", steps=steps)
    repo = H.make_repo(tmp_path / "repo", plan)
    (repo / ".gitignore").write_text((repo / ".gitignore").read_text() + "out*.bin\n")
    H.git(repo, "commit", "-qam", "ignore outputs")
    check = H.runbook_inproc(repo, "validate")
    assert check.returncode == 0, check.stderr
    result = H.runbook(repo, "next", "--yes")
    H.assert_no_traceback(result)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    for i, (_name, (_template, expected)) in enumerate(CONTEXTS.items()):
        assert (repo / f"out-{i}.bin").read_bytes() == expected(value).encode(), _name
    assert not list(repo.rglob("PWNED"))
    counts.add("shell_values_checked", len(CONTEXTS))


# ---- commands runbook prints for people and agents to paste ------------------------------------------

HOSTILE_PLAN_NAMES = ["my plan.md", "$(touch PWNED).md", "`touch PWNED`.md", "it's.md", "a;touch PWNED.md",
                      'say "hi".md', "*.md", "tab\tname.md", "é✓.md"]


def _as_argv(command: str, work: Path) -> list[str]:
    """What `command` (starting with `runbook`) passes to runbook when pasted into bash."""
    result = subprocess.run(["bash", "-c", 'runbook() { printf "%s\\0" "$@"; }\n' + command],
                            cwd=work, capture_output=True, timeout=30)
    assert result.returncode == 0, (command, result.stderr)
    return result.stdout.decode().split("\0")[:-1]


@pytest.mark.slow
def test_printed_commands_are_shell_quoted(tmp_path: Path, counts) -> None:
    """The brief's and status's exact next command, and next's `runbook record` line, give runbook the
    plan's path as one argument when pasted into a shell, and run nothing else."""
    plan = PLAN_TEMPLATE.format(vars="  v: x", steps="")
    repo = H.make_repo(tmp_path / "repo", plan)
    H.commit_files(repo, {f"plans/{name}": plan for name in HOSTILE_PLAN_NAMES}, "hostile names")
    checked = 0
    for name in HOSTILE_PLAN_NAMES:
        rel = f"plans/{name}"
        brief = json.loads(H.runbook_inproc(repo, "brief", "--json", "--plan", rel).stdout)["result"]["next"]
        assert brief["argv"][brief["argv"].index("--plan") + 1] == rel, brief
        assert _as_argv(brief["command"], repo) == brief["argv"][1:]
        status = H.runbook_inproc(repo, "status", "--plan", rel)
        line = next(x for x in status.stdout.splitlines() if x.startswith("next (run): "))
        assert _as_argv(line.removeprefix("next (run): "), repo) == brief["argv"][1:]
        text = H.runbook_inproc(repo, "brief", "--plan", rel).stdout
        pasted = text.split("## Continue", 1)[1].split("```sh\n", 1)[1].split("\n```", 1)[0]
        assert _as_argv(pasted, repo) == brief["argv"][1:]
        ran = H.runbook_inproc(repo, "next", "--yes", "--plan", rel)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        record_line = next(x.strip() for x in ran.stdout.splitlines() if x.strip().startswith("runbook record "))
        args = _as_argv(record_line, repo)
        assert args[args.index("--plan") + 1] == rel
        checked += 4
    assert not list(repo.rglob("PWNED")) and not list(tmp_path.rglob("PWNED"))
    counts.add("printed_commands_checked", checked)
