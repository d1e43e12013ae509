"""Every command with --json, in every state of docs/next.md's table and in every refusal: stdout is
exactly one JSON document that validates against the published schema (docs/schemas/), its
exit_code is the process's, and --json never asks a question.

The plan states are built with real runs (tests/support/plan_states.py). Most invocations run the real CLI
in this process (click's runner) to keep the suite fast; the checks that are about the process
itself (stdout, exit status, a terminal) run the console script.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time
from pathlib import Path

import jsonschema
import plan_states as S
import pytest
from click.testing import CliRunner

from runbook.cli import cli
from runbook.contract import RESULTS

H = S.H

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"
VALIDATORS = {
    command: jsonschema.Draft202012Validator(json.loads((SCHEMAS / f"{command}.schema.json").read_text()))
    for command in RESULTS
}

READ_ONLY = [
    ["validate"], ["status"], ["show"], ["show", "1"], ["next", "--dry-run"], ["next"], ["history"],
    ["history", "1"], ["history", "--desc"], ["brief"], ["brief", "--max-chars", "300"], ["wait", "--timeout", "0"],
]
WRITING = [
    ["next", "--yes"], ["next", "--yes", "--until-stop"], ["next", "--yes", "--phase", "1", "--restart"],
    ["record", "Milestone", "--lesson", "l", "--no-commit"], ["forget", "last"], ["reset", "1"], ["init"],
    ["init", "--title", "A: B"],
]


def check(stdout: str, exit_code: int, command: str) -> dict:
    """One document, valid against the command's schema, its exit_code the process's."""
    envelope = json.loads(stdout)  # one document: anything after it would not parse
    errors = sorted(VALIDATORS[command].iter_errors(envelope), key=lambda e: list(e.path))
    assert not errors, f"{command}: {errors[0].message} at {list(errors[0].path)}"
    assert envelope["command"] == command and envelope["schema_version"] == 1
    assert envelope["exit_code"] == exit_code, (envelope, exit_code)
    assert envelope["ok"] == ("result" in envelope) == ("error" not in envelope)
    return envelope


def invoke(repo: Path, args: list[str], monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.chdir(repo)
    result = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    return check(result.stdout, result.exit_code, args[0])


@pytest.fixture
def built(plan_states: dict[str, Path]) -> dict[str, Path]:
    return plan_states  # tests/conftest.py builds them once per session


@pytest.fixture(autouse=True)
def _no_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNBOOK_ENV_PROBE", "0")


def _expect(name: str, args: list[str], env: dict) -> None:
    """What each command must say in the named state (beyond the schema)."""
    command = args[0]
    if command == "next" and args == ["next"]:
        # --json never asks: without --yes it refuses when there is something to run
        if env["ok"]:
            assert env["result"]["runs"] == [] and env["result"]["next"]["kind"] in ("nothing", "retry")
        else:
            assert env["error"]["code"] in ("confirmation_required", "blocked")
    elif command in ("status", "brief", "validate", "history") or args == ["next", "--dry-run"] or args[:2] == ["show", "1"]:
        assert env["ok"] is True and env["exit_code"] == 0, env
    elif command == "wait":  # nothing runs in these states: the latest run, ended; none: unknown_run
        if env["ok"]:
            run = env["result"]["run"]
            assert env["result"]["state"] in ("finished", "died") and env["result"]["waited_s"] == 0, env
            assert env["exit_code"] == {"pass": 0, "fail": 1, "inconclusive": 3}.get(run["verdict"], 4)
        else:
            assert env["error"]["code"] == "unknown_run", env
    elif command == "show":
        assert env["ok"] is True and (env["result"]["phase"] is None) == (env["result"]["next"]["kind"] == "nothing")


@pytest.mark.parametrize("name", [n for n in S.STATES if n != "running"])
def test_every_command_in_every_state(name: str, built: dict[str, Path], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for args in READ_ONLY:
        _expect(name, args, invoke(built[name], args, monkeypatch))
    for i, args in enumerate(WRITING):
        repo = S.copy(built[name], tmp_path / f"w{i}")
        env = invoke(repo, args, monkeypatch)
        if args[0] == "next" and env["ok"]:
            runs = env["result"]["runs"]
            assert env["exit_code"] == ({"pass": 0, "fail": 1, "inconclusive": 3}.get(runs[-1]["verdict"], 4) if runs else 0)
        if args[0] == "init":  # a starter plan beside the state's plan: created, then refused once there
            assert env["ok"] and "plans/game-plan.md" in env["result"]["created"], env
            again = invoke(repo, args, monkeypatch)
            assert again["error"]["code"] == "usage" and "refusing to overwrite" in again["error"]["message"]
        if args[0] in ("forget", "reset") and name == "fresh":
            assert (env["ok"], env["error"]["code"] if not env["ok"] else None) == (
                (False, "unknown_run") if args[0] == "forget" else (True, None))


def test_every_command_while_a_run_holds_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = S.fresh_repo(tmp_path / "repo")
    proc = S.start_running(repo)
    try:
        for args in READ_ONLY:
            env = invoke(repo, args, monkeypatch)
            if args[0] in ("status", "brief"):
                assert env["result"]["running"]["pid"] == proc.pid
        for args in WRITING:
            env = invoke(repo, args, monkeypatch)
            if args[0] in ("next", "forget", "reset") and args != ["forget", "last"]:
                assert env["error"]["code"] == "locked" and env["exit_code"] == 5, env
                assert env["error"]["lock"]["pid"] == proc.pid
            elif args[0] == "record":  # the short write lock only: it works while a phase runs
                assert env["ok"] is True
    finally:
        S.finish_running(repo, proc)


def _broken(tmp_path: Path) -> Path:
    repo = S.fresh_repo(tmp_path / "broken")
    (repo / "plans" / "plan.md").write_text(S.PLAN.replace("Pass: `score >= 2`", "Pass: `score >=`"))
    return repo


def _several(tmp_path: Path) -> Path:
    repo = S.fresh_repo(tmp_path / "several")
    (repo / "plans" / "other.md").write_text(S.PLAN.replace("title: States", "title: Other"))
    return repo


def _no_plan(tmp_path: Path) -> Path:
    empty = tmp_path / "empty"
    (empty / ".git").mkdir(parents=True)
    return empty


ERRORS = {
    # state -> (args, expected error code, exit code), for every command that reads the plan
    "broken plan": (_broken, "plan_invalid", 2),
    "several plans": (_several, "several_plans", 2),
    "no plan": (_no_plan, "no_plan", 2),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_refusals_are_error_envelopes(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make, code, exit_code = ERRORS[case]
    repo = make(tmp_path)
    for args in [["status"], ["show"], ["next", "--dry-run"], ["next", "--yes"], ["history", "1"], ["brief"],
                 ["record", "T"], ["forget", "last"], ["reset", "1"]]:
        env = invoke(repo, args, monkeypatch)
        assert (env["ok"], env["error"]["code"], env["exit_code"]) == (False, code, exit_code), (args, env)
        assert env["error"]["message"] and env["error"]["hint"] or env["error"]["problems"], (args, env)
    if case == "broken plan":
        env = invoke(repo, ["status"], monkeypatch)
        [problem] = env["error"]["problems"]
        assert problem["file"] == "plans/plan.md" and problem["line"] == env["error"]["line"] > 1
    if case == "no plan":  # history reads every plan's ledger: with neither plan nor ledger it refuses too
        env = invoke(repo, ["history"], monkeypatch)
        assert (env["ok"], env["error"]["code"]) == (False, "no_plan")
        env = invoke(repo, ["history", "--plan", "plans/missing.md"], monkeypatch)
        assert env["error"]["code"] == "no_plan" and env["error"]["file"] == "plans/missing.md"
    # validate reports rather than refuses, except when there is no plan at all
    env = invoke(repo, ["validate"], monkeypatch)
    if case == "no plan":
        assert env["error"]["code"] == "no_plan"
    else:
        assert env["ok"] and env["exit_code"] == (2 if case == "broken plan" else 0)
        assert env["result"]["valid"] is (case != "broken plan")


def test_unknown_phase_and_run_and_bad_options(built: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    repo = built["mid-plan"]
    for args in (["show", "9"], ["next", "--dry-run", "--phase", "9"], ["history", "9"], ["reset", "9"]):
        env = invoke(repo, args, monkeypatch)
        assert env["error"]["code"] == "unknown_phase" and env["exit_code"] == 2 and "phase-1" in env["error"]["message"]
    env = invoke(repo, ["forget", "20990101"], monkeypatch)
    assert env["error"]["code"] == "unknown_run" and env["exit_code"] == 2
    env = invoke(repo, ["record", "T", "--metric", "x=fast"], monkeypatch)
    assert env["error"]["code"] == "usage" and "NAME=NUMBER" in env["error"]["message"]
    for args in (["status", "--bogus"], ["next", "--frobnicate"], ["brief", "--max-chars", "3"], ["history", "a", "b"]):
        env = invoke(repo, args, monkeypatch)
        assert env["error"]["code"] == "usage" and env["exit_code"] == 2, (args, env)


def test_the_process_prints_one_document_even_for_usage_errors(built: dict[str, Path]) -> None:
    repo = built["mid-plan"]
    for args, command, code in ((["status", "--bogus", "--json"], "status", 2), (["bogus", "--json"], "runbook", 2),
                                (["--json"], "runbook", 2), (["next", "--yes", "--json", "--phase", "9"], "next", 2)):
        done = H.runbook(repo, *args)
        assert done.returncode == code, (args, done.stdout, done.stderr)
        envelope = json.loads(done.stdout)
        assert envelope["command"] == command and envelope["exit_code"] == code and envelope["ok"] is False
        if command in VALIDATORS:
            check(done.stdout, done.returncode, command)


def test_lock_held_by_a_live_process_is_data(built: dict[str, Path], tmp_path: Path) -> None:
    repo = S.copy(built["mid-plan"], tmp_path / "repo")
    sleeper = H.hold_run_lock(repo / "state", "20990101-000000-abcd")  # a live holder, as runbook next is
    try:
        done = H.runbook(repo, "next", "--yes", "--json")
        envelope = check(done.stdout, done.returncode, "next")
        assert done.returncode == 5 and envelope["error"]["code"] == "locked"
        holder = envelope["error"]["lock"]
        assert (holder["pid"], holder["run_id"], holder["phase"], holder["label"], holder["alive"]) == (
            sleeper.pid, "20990101-000000-abcd", "phase-1", "Phase 1", True)
        status = check(H.runbook(repo, "status", "--json").stdout, 0, "status")
        assert status["result"]["next"]["kind"] == "running" and status["result"]["phases"][1]["state"] == "running"
    finally:
        sleeper.kill()
        sleeper.wait()
    # the holder is gone: the lock is stale, and every reader says `runbook next` takes it over
    status = check(H.runbook(repo, "status", "--json").stdout, 0, "status")["result"]
    assert status["running"] is None and status["next"]["kind"] == "run"
    assert status["next"]["why"].startswith("A killed run (20990101-000000-abcd")


def _in_a_terminal(repo: Path, args: list[str], env: dict[str, str], answer: tuple[str, bytes] | None = None) -> tuple[int, str]:
    """Run the console script with a terminal on stdin and stdout; returns (exit code, all it wrote).
    `answer`: (prompt text, what to type when it appears)."""
    leader, follower = pty.openpty()
    # stderr too goes to the terminal when a question is expected (click asks there)
    proc = subprocess.Popen([*H.RUNBOOK, *args], cwd=repo, stdin=follower, stdout=follower,
                            stderr=follower if answer is not None else subprocess.DEVNULL, env=H.cli_env(env),
                            close_fds=True)
    os.close(follower)
    chunks = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.2)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
            if answer is not None and answer[0].encode() in b"".join(chunks):
                os.write(leader, answer[1])
                answer = None
        elif proc.poll() is not None:
            break
    else:
        proc.kill()
    os.close(leader)
    return proc.wait(timeout=30), b"".join(chunks).decode().replace("\r\n", "\n")


def test_json_never_prompts_nor_opens_an_editor_even_in_a_terminal(built: dict[str, Path], tmp_path: Path) -> None:
    repo = S.copy(built["mid-plan"], tmp_path / "repo")
    editor = tmp_path / "editor.sh"
    opened = tmp_path / "editor-was-opened"
    editor.write_text(f"#!/bin/sh\ntouch {opened}\n")
    editor.chmod(0o755)
    env = {"EDITOR": str(editor), "VISUAL": str(editor)}
    code, out = _in_a_terminal(repo, ["next", "--json"], env)
    envelope = check(out, code, "next")
    assert code == 2 and envelope["error"]["code"] == "confirmation_required" and "[Y/n]" not in out
    code, out = _in_a_terminal(repo, ["record", "--json"], env)
    envelope = check(out, code, "record")
    assert code == 2 and envelope["error"]["code"] == "usage" and not opened.exists()
    # without --json, the terminal is asked; "no" is a refusal (exit 2), never the "fail" exit code 1
    code, out = _in_a_terminal(repo, ["next"], env, answer=("[Y/n]", b"n\n"))
    assert "Run Phase 1?" in out and "not confirmed: nothing ran" in out and code == 2


def test_a_wrong_document_fails_the_schemas(built: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The schemas are strict enough to catch a wrong envelope: another verb's name, ok with an error,
    an error without ok false, an error code no refusal uses, a missing version or warnings list."""
    good = invoke(built["mid-plan"], ["status"], monkeypatch)
    refused = invoke(built["mid-plan"], ["show", "no-such-phase"], monkeypatch)
    assert refused["ok"] is False and refused["error"]["code"] == "unknown_phase"
    wrong = {
        "another verb": ("status", {**good, "command": "history"}),
        "ok with an error too": ("status", {**good, "error": refused["error"]}),
        "not ok, with a result": ("status", {**good, "ok": False}),
        "ok without a result": ("show", {k: v for k, v in refused.items() if k != "error"} | {"ok": True}),
        "an unknown error code": ("show", {**refused, "error": {**refused["error"], "code": "oops"}}),
        "no runbook_version": ("status", {k: v for k, v in good.items() if k != "runbook_version"}),
        "no warnings": ("status", {k: v for k, v in good.items() if k != "warnings"}),
        "a warning that is no string": ("status", {**good, "warnings": [3]}),
    }
    for what, (command, doc) in wrong.items():
        assert list(VALIDATORS[command].iter_errors(doc)), f"{what}: the schema accepted it"
    assert not list(VALIDATORS["status"].iter_errors(good)) and not list(VALIDATORS["show"].iter_errors(refused))


def test_json_before_the_verb_and_from_the_environment(built: dict[str, Path]) -> None:
    repo = built["mid-plan"]
    plain = H.runbook(repo, "status", "--json")
    for args, env in ((["--json", "status"], None), (["status"], {"RUNBOOK_JSON": "1"}),
                      (["--json", "status", "--json"], None)):
        done = H.runbook(repo, *args, env=env)
        assert done.returncode == plain.returncode == 0, (args, done.stderr)
        doc = check(done.stdout, done.returncode, "status")
        assert doc["result"] == json.loads(plain.stdout)["result"]
        assert doc["runbook_version"] == json.loads(plain.stdout)["runbook_version"] != ""
    # --help stays help, and `mcp` (no --json of its own) is left alone by the variable
    assert H.runbook(repo, "--json", "--help").stdout.startswith("Usage: runbook")
    assert H.runbook(repo, "status", "--help", env={"RUNBOOK_JSON": "1"}).stdout.startswith("Usage: runbook status")


def test_every_warning_said_is_in_the_envelope(built: dict[str, Path], tmp_path: Path) -> None:
    """A ledger record that cannot be read is warned about by the reading verbs: the same lines on stderr
    (`warning: ...`) and in the envelope's `warnings`, for each of them."""
    repo = S.copy(built["mid-plan"], tmp_path / "repo")
    (repo / "state" / "runs" / "20200101-000000-dead.json").write_text("{ cut")
    seen = 0
    for args in (["status"], ["brief"], ["history"], ["next", "--dry-run"], ["show", "1"], ["diff", "last~1", "last"]):
        done = H.runbook_inproc(repo, *args, "--json")
        doc = check(done.stdout, done.returncode, args[0])
        said = [line.removeprefix("warning: ") for line in done.stderr.splitlines() if line.startswith("warning: ")]
        assert doc["warnings"] == said, (args, doc["warnings"], done.stderr)
        seen += bool(said)
    assert seen >= 4  # status, brief, history and next at least name the broken record
