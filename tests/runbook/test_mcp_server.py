"""`runbook mcp` driven by the MCP SDK's own client over stdio, against the real command line.

Every test starts the real `runbook mcp` as a subprocess (the SDK's `stdio_client`) in a real git
repository. What the tools do is compared with what `runbook VERB --json` does: the same JSON
documents, and after a run, the same plan, ledger, notes and git history as a twin repository
driven by the command line. The lock and kill tests reuse the plan of tests/e2e/test_next_signals.py;
a client that goes away (a timed-out call, a killed client, a stopped server) never stops the run:
it goes on to its verdict and commit, and `wait` (with `next`'s `detach`) follows it.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import anyio
import helpers as H
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from runbook import contract
from runbook.mcp_server import TOOLS

RUNBOOK, git = H.RUNBOOK, H.git

ENV = {"RUNBOOK_ENV_PROBE": "0", "GIT_TERMINAL_PROMPT": "0"}
SERVER_ENV = H.cli_env(ENV)  # the environment the command line twin runs in: the ledger records some of it

PLAN = """\
---
runbook: 1
title: Tiny
notes: notes.md
vars:
  out: work
---

# Tiny plan

Prose the tool never rewrites.

## Phase 0: Score (~1 min)

Steps:
- [ ] Make: `mkdir -p {out} && echo made`
- [ ] Score: `echo '{"score": 3}' > "$RUNBOOK_METRICS"`

Pass: `score >= 2`
On pass: Phase 1

## Phase 1: Too hard

Steps:
- [ ] Score: `echo '{"score": 1}' > "$RUNBOOK_METRICS"`

Pass: `score >= 2`
On fail: stop
"""

NOTES = "# Tiny: notes\n\nWhy we do this.\n"

# step-2 records its shell's pid, then waits until the file `ok` exists (at most 20 s)
WAIT_PLAN = """\
---
runbook: 1
title: Signals
notes: notes.md
---

## Phase 0: Wait

Steps:
- [ ] Count: `echo run >> count.txt; echo '{"n": 1}' > $RUNBOOK_METRICS`
- [ ] Wait: `echo $$ > step2.pid; i=0; while [ ! -f ok ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done`

Pass: `n == 1`
"""


def params(repo: Path) -> StdioServerParameters:
    return StdioServerParameters(command=RUNBOOK[0], args=[*RUNBOOK[1:], "mcp"], cwd=str(repo), env=SERVER_ENV)


def run(coro_fn, *args):
    return anyio.run(coro_fn, *args)


def cli_json(repo: Path, *args: str) -> dict:
    done = H.runbook(repo, *args, "--json", env=ENV)
    return json.loads(done.stdout)


def wait_repo(tmp_path: Path) -> Path:
    return H.make_repo(tmp_path / "repo", WAIT_PLAN, notes=NOTES, ignore=("step2.pid", "count.txt", "ok"))


def wait_for(path: Path) -> None:
    H.wait_for_file(path, timeout=60, nonempty=True)


def runs(repo: Path) -> list[dict]:
    recs = [json.loads(p.read_text()) for p in (repo / "state" / "runs").glob("*.json")]
    return sorted(recs, key=lambda r: r["started"])


def servers_in(repo: Path) -> list[int]:
    """Pids of `runbook mcp` processes working in `repo` (a fresh temp dir: only ours are there)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd == str(repo.resolve()) and b"mcp" in cmdline and any(b"runbook" in part for part in cmdline):
            found.append(int(entry.name))
    return found


# ---- the normaliser: what differs between two runs of the same plan -----------------------------

_RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}")


def normalise(text: str) -> str:
    ids: dict[str, str] = {}
    text = _RUN_ID.sub(lambda m: ids.setdefault(m.group(0), f"RUN{len(ids) + 1}"), text)
    text = re.sub(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?Z?( UTC)?", "TIME", text)
    text = re.sub(r"\b[0-9a-f]{40}\b|\b[0-9a-f]{64}\b", "HASH", text)
    text = re.sub(r"\b(?=[0-9a-f]*\d)[0-9a-f]{7,12}\b", "SHA", text)
    text = re.sub(r"sha=[0-9a-f]{8}", "sha=X", text)
    text = re.sub(r'"duration_s": [0-9.]+', '"duration_s": 0', text)
    return re.sub(r"\| \d+(\.\d+)?(ms|s|m|h)( \d+s)? \|", "| TOOK |", text)


def repo_record(repo: Path) -> dict[str, object]:
    """Everything runbook wrote, normalised: plan, notes, ledger, and the git history."""
    ledger = [normalise(json.dumps(r, indent=1, sort_keys=True)) for r in runs(repo)]
    history = normalise(git(repo, "log", "--format=%s", "--name-only"))
    return {
        "plan": normalise((repo / "plans" / "plan.md").read_text()),
        "notes": normalise((repo / "plans" / "notes.md").read_text()),
        "ledger": ledger,
        "history": history,
        "status": normalise(git(repo, "status", "--porcelain")),
    }


# ---- tests --------------------------------------------------------------------------------------


def test_tools_are_the_verbs_and_answer_exactly_what_the_cli_prints(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN, notes=NOTES)
    calls = [("brief", {}, ["brief"]), ("status", {}, ["status"]), ("show", {"phase": "1"}, ["show", "1"]),
             ("validate", {}, ["validate"]), ("history", {}, ["history"]), ("next", {}, ["next", "--dry-run"])]

    async def main():
        async with Client(params(repo)) as client:
            assert client.instructions and "brief" in client.instructions
            listed = (await client.list_tools()).tools
            return listed, [await client.call_tool(name, args) for name, args, _ in calls]

    listed, results = run(main)
    assert [t.name for t in listed] == [t.name for t in TOOLS]
    assert {t.name for t in listed} >= {"brief", "status", "show", "validate", "history", "next", "record"}
    for tool in listed:
        assert tool.output_schema == contract.output_schema(tool.name), tool.name
        assert tool.input_schema["type"] == "object" and tool.input_schema.get("additionalProperties") is False
        assert tool.description
    by_name = {t.name: t for t in listed}
    assert by_name["status"].annotations.read_only_hint is True
    assert by_name["next"].annotations.read_only_hint is False
    assert by_name["next"].input_schema["properties"]["run"]["default"] is False  # a dry run unless asked
    assert by_name["forget"].annotations.destructive_hint and by_name["reset"].annotations.destructive_hint
    assert by_name["record"].input_schema["required"] == ["title"]

    for (name, _args, argv), result in zip(calls, results, strict=True):
        assert not result.is_error, (name, result.content)
        assert result.structured_content == cli_json(repo, *argv), name
        assert json.loads(result.content[0].text) == result.structured_content
    dry = results[-1].structured_content["result"]
    assert dry["dry_run"] and dry["selected"]["phase"] == "phase-0" and dry["runs"] == []
    preview = results[-1].content[-1].text  # the dry run's preview: the phase as written
    assert "## Phase 0: Score (~1 min)" in preview and "mkdir -p work && echo made" in preview
    assert not (repo / "state").exists() and git(repo, "status", "--porcelain") == ""  # nothing ran


def test_refusals_are_tool_errors_with_the_cli_code_and_message(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN.replace("Pass: `score >= 2`\nOn fail", "Pass: `score >=`\nOn fail"))

    async def main():  # the 2025 handshake era, as most hosts speak it today
        async with Client(params(repo), mode="legacy") as client:
            assert client.protocol_version == "2025-11-25"
            return (await client.call_tool("status", {}), await client.call_tool("next", {"run": True}),
                    await client.call_tool("show", {"bogus": 1}))

    status, nxt, bad = run(main)
    cli = H.runbook(repo, "status", env=ENV)
    for result in (status, nxt):
        assert result.is_error
        error = result.structured_content["error"]
        assert error["code"] == "plan_invalid" and result.structured_content["exit_code"] == 2
        assert error["file"] == "plans/plan.md" and error["line"] == 27
        assert result.content[0].text == cli.stderr.rstrip("\n")  # the same file:line:col lines
    assert status.structured_content == cli_json(repo, "status")
    assert nxt.structured_content == cli_json(repo, "next", "--yes")
    assert "plans/plan.md:27:" in status.content[0].text
    assert bad.is_error and bad.structured_content["error"]["code"] == "usage"
    assert "bogus" in bad.structured_content["error"]["message"]
    assert not (repo / "state" / "runs").exists()


def test_next_pass_then_fail_then_record_equals_the_cli(tmp_path: Path) -> None:
    ours = H.make_repo(tmp_path / "mcp", PLAN, notes=NOTES)
    twin = H.make_repo(tmp_path / "cli", PLAN, notes=NOTES)
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    record = {"title": "Phase 1 is too hard", "run": "last", "metrics": {"budget_h": 2.5},
              "lessons": ["score 1 is not enough"], "next_steps": ["make Phase 1 easier"]}

    async def main():
        async with Client(params(ours)) as client:
            first = await client.call_tool("next", {"run": True}, progress_callback=on_progress)
            second = await client.call_tool("next", {"run": True}, progress_callback=on_progress)
            noted = await client.call_tool("record", record)
            plan = await client.read_resource("runbook://plan/plans/plan.md")
            notes = await client.read_resource("runbook://notes/plans/notes.md")
            latest = await client.read_resource("runbook://run/latest")
            listed = await client.list_resources()
            missing = None
            try:
                await client.read_resource("runbook://plan/plans/nope.md")
            except Exception as exc:  # the SDK raises the server's MCP error
                missing = str(exc)
            return first, second, noted, plan, notes, latest, listed, missing

    first, second, noted, plan, notes, latest, listed, missing = run(main)
    # pass: exit 0, the run with its verdict and metrics
    assert not first.is_error and first.structured_content["exit_code"] == 0
    run0 = first.structured_content["result"]["runs"][0]
    assert run0["verdict"] == "pass" and run0["metrics"] == {"score": 3.0} and run0["recorded_in"]
    # fail: a judged run is no tool error; exit 1 as on the command line
    assert not second.is_error and second.structured_content["exit_code"] == 1
    assert second.structured_content["result"]["runs"][0]["verdict"] == "fail"
    assert not noted.is_error and noted.structured_content["result"]["lessons_added"] == ["score 1 is not enough"]
    # step output and the summary arrived as progress while the phase ran
    said = "\n".join(progress)
    assert "made" in said and "Phase 0 (Score): pass" in said and "Phase 1 (Too hard): fail" in said

    # the twin, driven by the command line
    for args in (["next", "--yes"], ["next", "--yes"]):
        H.runbook(twin, *args, env=ENV)
    H.runbook(twin, "record", "Phase 1 is too hard", "--run", "last", "--metric", "budget_h=2.5",
              "--lesson", "score 1 is not enough", "--next", "make Phase 1 easier", env=ENV)
    assert repo_record(ours) == repo_record(twin)
    assert "**Status:** fail" in (ours / "plans" / "plan.md").read_text()
    assert git(ours, "log", "-3", "--format=%s").splitlines() == [
        "runbook: record Phase 1 is too hard (score=1, budget_h=2.5)", "runbook: phase-1 fail (score=1)",
        "runbook: phase-0 pass (score=3)"]

    # resources: the files as they are on disk, and the latest run as the contract's RunView
    assert plan.contents[0].text == (ours / "plans" / "plan.md").read_text()
    assert notes.contents[0].text == (ours / "plans" / "notes.md").read_text()
    assert json.loads(latest.contents[0].text) == second.structured_content["result"]["runs"][0] | {"recorded_in": None}
    assert {str(r.uri) for r in listed.resources} == {
        "runbook://plan/plans/plan.md", "runbook://notes/plans/notes.md", "runbook://run/latest"}
    assert missing and "no resource runbook://plan/plans/nope.md" in missing
    # and the read tools agree with the command line after the runs too
    assert cli_json(ours, "history")["result"]["runs"][1]["verdict"] == "fail"


def test_a_second_client_gets_the_lock_error_never_a_second_run(tmp_path: Path) -> None:
    repo = wait_repo(tmp_path)

    async def main():
        results = {}
        async with Client(params(repo)) as first, Client(params(repo)) as second:
            async with anyio.create_task_group() as tg:

                progress: list[str] = []

                async def on_progress(value: float, total: float | None, message: str | None) -> None:
                    progress.append(message or "")

                async def running() -> None:
                    results["first"] = await first.call_tool("next", {"run": True}, progress_callback=on_progress)

                tg.start_soon(running)
                await anyio.to_thread.run_sync(wait_for, repo / "step2.pid")
                with anyio.fail_after(60):
                    while not any("Phase 0 · step-2" in m for m in progress):  # streamed while the step runs
                        await anyio.sleep(0.05)
                lock = json.loads((repo / "state" / "lock").read_text())
                results["lock"] = lock
                results["second"] = await second.call_tool("next", {"run": True})
                results["status"] = await second.call_tool("status", {})
                results["reset"] = await second.call_tool("reset", {"phase": "0"})  # takes the run lock too
                results["record"] = await second.call_tool("record", {"title": "Waiting", "lessons": ["patience"]})
                (repo / "ok").write_text("")
        return results

    results = run(main)
    second, lock = results["second"], results["lock"]
    assert second.is_error and second.structured_content["exit_code"] == 5
    error = second.structured_content["error"]
    assert error["code"] == "locked" and error["lock"]["pid"] == lock["pid"] and error["lock"]["run_id"] == lock["run_id"]
    assert f"pid {lock['pid']}" in second.content[0].text and lock["run_id"] in second.content[0].text
    assert results["status"].structured_content["result"]["running"]["run_id"] == lock["run_id"]
    reset = results["reset"]
    assert reset.is_error and reset.structured_content["error"]["code"] == "locked"
    assert reset.structured_content["error"]["lock"]["run_id"] == lock["run_id"]
    assert not results["record"].is_error  # record needs only the short write lock
    assert "patience" in (repo / "plans" / "notes.md").read_text()
    assert results["first"].structured_content["exit_code"] == 0
    assert [r["verdict"] for r in runs(repo)] == ["pass"]  # one run, never a second
    assert (repo / "count.txt").read_text() == "run\n"
    assert not (repo / "state" / "lock").exists()


CLIENT = textwrap.dedent("""
    import os, sys, anyio
    from mcp import Client, StdioServerParameters
    async def main():
        env = {"RUNBOOK_ENV_PROBE": "0", **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}
        params = StdioServerParameters(command=sys.argv[1], args=sys.argv[2:] + ["mcp"], cwd=".", env=env)
        async with Client(params, mode="legacy") as client:
            print("calling next", flush=True)
            await client.call_tool("next", {"run": True})
    anyio.run(main)
""")


def _assert_goes_on_to_its_verdict(repo: Path, step_pid: int) -> None:
    """The run nobody cancelled is still running its step; let the step finish: the run is judged
    `pass` (its step exited 0, never signalled), written back and committed, its step 1 run once."""
    assert H.alive(step_pid), "the step was stopped"
    assert (repo / "state" / "lock").exists() and not runs(repo)
    (repo / "ok").write_text("")
    deadline = time.monotonic() + 60
    while (repo / "state" / "lock").exists() or not runs(repo):
        assert time.monotonic() < deadline, "the run was never recorded"
        time.sleep(0.1)
    rec = runs(repo)[-1]
    assert rec["verdict"] == "pass" and [s["exit_code"] for s in rec["steps"]] == [0, 0], rec
    text = (repo / "plans" / "plan.md").read_text()
    assert "- [x] Count" in text and "- [x] Wait" in text and "**Status:** pass" in text
    assert H.poll(lambda: git(repo, "log", "-1", "--format=%s").startswith("runbook: phase-0 pass"), 30)
    assert git(repo, "status", "--porcelain", "--untracked-files=no") == ""
    assert (repo / "count.txt").read_text() == "run\n"  # one run, never restarted


def test_a_client_killed_mid_step_leaves_the_run_going_to_its_verdict_and_commit(tmp_path: Path) -> None:
    """The agent host dies mid-step (SIGKILL to the client process this test started): the server sees
    its stdin close and leaves at once, and the run goes on, is judged, written back and committed."""
    repo = wait_repo(tmp_path)
    client = subprocess.Popen([sys.executable, "-c", CLIENT, *RUNBOOK], cwd=repo, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(repo / "step2.pid")
        step_pid = int((repo / "step2.pid").read_text())
        server = servers_in(repo)
        assert len(server) == 1, server
    finally:
        client.kill()  # the agent host dies: the server sees its stdin close
        client.communicate(timeout=30)
    assert H.gone(server[0], timeout=15)  # the server left without waiting for the run
    _assert_goes_on_to_its_verdict(repo, step_pid)


def test_a_call_that_times_out_leaves_the_run_going_and_wait_gives_its_verdict(tmp_path: Path) -> None:
    """Issue 47: a client with a 5 s request timeout calls `next` with run=true on a longer step. The
    call times out (the SDK cancels the request); the run is not stopped: `wait` from the same client
    sees it running at step-2, then finished `pass`, judged and committed."""
    repo = wait_repo(tmp_path)

    async def main():
        async with Client(params(repo), read_timeout_seconds=5) as client:
            started = anyio.current_time()
            with pytest.raises((MCPError, TimeoutError)):
                await client.call_tool("next", {"run": True})
            timed_out = anyio.current_time() - started
            await anyio.to_thread.run_sync(wait_for, repo / "step2.pid")
            step_pid = int((repo / "step2.pid").read_text())
            waiting = await client.call_tool("wait", {"timeout": 1})
            await anyio.to_thread.run_sync(_assert_goes_on_to_its_verdict, repo, step_pid)
            return timed_out, waiting, await client.call_tool("wait", {"timeout": 3})

    timed_out, waiting, finished = run(main)
    assert timed_out < 15
    state = waiting.structured_content["result"]
    assert not waiting.is_error and waiting.structured_content["exit_code"] == 5 and state["state"] == "running"
    assert state["running"]["step"] == "step-2" and state["running"]["heartbeat"], state
    done = finished.structured_content
    assert not finished.is_error and done["exit_code"] == 0 and done["result"]["state"] == "finished"
    assert done["result"]["run_id"] == state["run_id"] and done["result"]["run"]["verdict"] == "pass"


def test_sigterm_to_the_server_leaves_its_run_going_to_its_verdict(tmp_path: Path) -> None:
    """The host stops the server (SIGTERM, as hosts do after closing its stdin): the server leaves at
    once and its run goes on to its verdict and commit."""
    repo = wait_repo(tmp_path)

    async def main():
        async with Client(params(repo)) as client:
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    try:
                        await client.call_tool("next", {"run": True})
                    except Exception:  # the server went away under the call
                        pass

                tg.start_soon(call)
                await anyio.to_thread.run_sync(wait_for, repo / "step2.pid")
                (server,) = servers_in(repo)
                os.kill(server, signal.SIGTERM)  # the host stops the server it started (ours, in our temp repo)
                return int((repo / "step2.pid").read_text()), server

    step_pid, server = run(main)
    assert H.gone(server, timeout=15)
    _assert_goes_on_to_its_verdict(repo, step_pid)


SLOW_PLAN = """\
---
runbook: 1
title: Slow
notes: notes.md
---

## Phase 0: Twenty seconds

Steps:
- [ ] Sleep: `echo sleeping; sleep 20; echo '{"score": 3}' > "$RUNBOOK_METRICS"`

Pass: `score >= 2`
"""


def test_detach_and_wait_run_a_20s_phase_for_a_client_with_a_5s_timeout(tmp_path: Path) -> None:
    """Issue 47: the SDK's client with a 5 s request timeout runs a 20 s phase to its verdict. `next`
    with detach answers at once with the run id (the supervisor of `runbook next --detach` runs it);
    each `wait` (4 s, then by run id) answers before the client's timeout, running at step-1 with its
    heartbeat, until the run is finished: judged `pass`, written back and committed."""
    repo = H.make_repo(tmp_path / "repo", SLOW_PLAN, notes=NOTES)

    async def main():
        async with Client(params(repo), read_timeout_seconds=5) as client:
            started = anyio.current_time()
            detached = await client.call_tool("next", {"run": True, "detach": True})
            answered = anyio.current_time() - started
            run_id = detached.structured_content["result"]["detached"]["run_id"]
            waits = []
            while anyio.current_time() - started < 90:
                begun = anyio.current_time()
                args = {"timeout": 4} if len(waits) % 2 == 0 else {"timeout": 4, "run": run_id}
                result = await client.call_tool("wait", args)
                waits.append((anyio.current_time() - begun, result))
                if result.structured_content["result"]["state"] != "running":
                    break
            return detached, answered, waits

    detached, answered, waits = run(main)
    assert not detached.is_error and detached.structured_content["exit_code"] == 0, detached.content
    result = detached.structured_content["result"]
    assert result["runs"] == [] and result["detached"]["phase"] == "phase-0" and answered < 5
    run_id = result["detached"]["run_id"]
    assert len(waits) >= 3, [w[1].structured_content["result"]["state"] for w in waits]
    for took, waited in waits[:-1]:
        state = waited.structured_content
        assert not waited.is_error and state["exit_code"] == 5 and took < 5, (took, state)
        assert state["result"]["state"] == "running" and state["result"]["run_id"] == run_id
        holder = state["result"]["running"]
        assert holder["run_id"] == run_id and holder["step"] == "step-1" and holder["detached"], holder
        assert holder["heartbeat"] and holder["steps_total"] == 1
    took, last = waits[-1]
    final = last.structured_content
    assert not last.is_error and final["exit_code"] == 0 and took < 5, final
    assert final["result"]["state"] == "finished" and final["result"]["run"]["verdict"] == "pass"
    assert final["result"]["run"]["metrics"] == {"score": 3.0} and final["result"]["run"]["detached"]
    cli = cli_json(repo, "wait", "--run", run_id)  # the same document, but for how long each waited
    cli["result"]["waited_s"] = final["result"]["waited_s"]
    assert final == cli
    assert git(repo, "log", "-1", "--format=%s").strip() == "runbook: phase-0 pass (score=3)"
    assert [r["verdict"] for r in runs(repo)] == ["pass"] and not (repo / "state" / "lock").exists()


def test_history_sorts_both_ways_and_plot_writes_the_png(tmp_path: Path) -> None:
    """`history` with newest_first answers `runbook history --desc --json`, without it `runbook history
    --json`; `plot` answers `runbook plot --json` and writes the PNG (an `out` outside the repository is
    a `usage` tool error). `detach` without `run` is refused, naming the argument."""
    repo = H.make_repo(tmp_path / "repo", PLAN, notes=NOTES)
    for _ in range(2):
        H.runbook(repo, "next", "--yes", env=ENV)

    async def main():
        async with Client(params(repo)) as client:
            return [await client.call_tool(name, args) for name, args in (
                ("history", {}), ("history", {"newest_first": True}),
                ("history", {"newest_first": True, "sort": "score"}),
                ("plot", {"metric": "score", "out": "charts/score.png"}),
                ("plot", {"metric": "score", "out": str(tmp_path / "away.png")}),
                ("next", {"detach": True}))]

    oldest, newest, highest, plot, away, detach = run(main)
    assert oldest.structured_content == cli_json(repo, "history")
    assert newest.structured_content == cli_json(repo, "history", "--desc")
    assert highest.structured_content == cli_json(repo, "history", "--sort", "score", "--desc")
    ids = [r["run_id"] for r in oldest.structured_content["result"]["runs"]]
    assert len(ids) == 2 and [r["run_id"] for r in newest.structured_content["result"]["runs"]] == ids[::-1]
    assert oldest.structured_content["result"]["runs"][0]["verdict"] == "pass"
    assert newest.structured_content["result"]["descending"] is True
    assert not plot.is_error, plot.content
    drawn = plot.structured_content["result"]
    assert drawn["png"] == "charts/score.png" and drawn["runs"] == ids and drawn["points"] == 2
    assert (repo / "charts" / "score.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (repo / "charts" / "score.svg").is_file()
    assert away.is_error and away.structured_content["error"]["code"] == "usage"
    assert away.structured_content["error"]["message"].startswith("out: ") and not (tmp_path / "away.png").exists()
    assert detach.is_error and "detach" in detach.structured_content["error"]["message"]
    assert [r["verdict"] for r in runs(repo)] == ["pass", "fail"]  # the refused `next` ran nothing


def test_logs_and_cancel_tools_show_and_stop_a_run_in_progress(tmp_path: Path) -> None:
    """`logs` answers what `runbook logs --json` answers; `cancel` from a second client stops the first
    client's run, which ends recorded `interrupted`, and `next` resumes it at its unfinished step."""
    repo = H.make_repo(tmp_path / "repo", WAIT_PLAN.replace("Wait: `echo $$", "Wait: `echo waiting for ok; echo $$"),
                       notes=NOTES)
    (repo / ".gitignore").write_text((repo / ".gitignore").read_text() + "step2.pid\ncount.txt\nok\n")
    git(repo, "commit", "-qam", "ignore the steps' files")

    async def main():
        results = {}
        async with Client(params(repo)) as first, Client(params(repo)) as second:
            async with anyio.create_task_group() as tg:

                async def running() -> None:
                    results["next"] = await first.call_tool("next", {"run": True})

                tg.start_soon(running)
                await anyio.to_thread.run_sync(wait_for, repo / "step2.pid")
                results["logs"] = await second.call_tool("logs", {})
                results["logs_cli"] = await anyio.to_thread.run_sync(cli_json, repo, "logs")
                results["step1"] = await second.call_tool("logs", {"step": "1", "lines": 5})
                results["cancel"] = await second.call_tool("cancel", {"wait": 60})
            (repo / "ok").write_text("")
            results["again"] = await second.call_tool("next", {"run": True})
        return results

    results = run(main)
    logs = results["logs"]
    assert not logs.is_error and logs.structured_content == results["logs_cli"]
    shown = logs.structured_content["result"]
    assert shown["step"] == "step-2" and shown["running"] and shown["lines"] == ["waiting for ok"]
    assert shown["log_path"] == f"state/runs/{shown['run_id']}/step-2.log"
    assert results["step1"].structured_content["result"]["step"] == "step-1"

    cancel = results["cancel"]
    assert not cancel.is_error and cancel.structured_content["exit_code"] == 0, cancel.content
    stopped = cancel.structured_content["result"]
    assert stopped["cancelled"] and "SIGTERM" in stopped["how"]
    assert stopped["run"]["run_id"] == shown["run_id"] and stopped["run"]["verdict"] == "interrupted"
    ended = results["next"].structured_content  # the first client's call ended with the cancelled run
    assert ended["exit_code"] == 4 and [r["verdict"] for r in ended["result"]["runs"]] == ["interrupted"]
    assert [s["exit_code"] for s in runs(repo)[0]["steps"]] == [0, -15]

    again = results["again"].structured_content
    assert again["exit_code"] == 0 and again["result"]["runs"][0]["verdict"] == "pass"
    assert (repo / "count.txt").read_text() == "run\n"  # resumed at step 2: step 1 did not run again
    assert not (repo / "state" / "lock").exists()


def test_init_writes_agents_md_and_a_config_that_starts_the_server(tmp_path: Path) -> None:
    done = H.runbook(tmp_path, "init", "ws", "--title", "Drafter", "--json", env=ENV)
    result = json.loads(done.stdout)["result"]
    ws = tmp_path / "ws"
    agents = (ws / "AGENTS.md").read_text()
    assert "AGENTS.md" in result["created"]
    assert "runbook brief" in agents and "`plans/game-plan.md` is the game plan" in agents
    assert all(tool.name in agents for tool in TOOLS)  # the tools it names are the server's
    server = result["mcp_config"]["mcpServers"]["runbook"]
    assert server["args"][-3:] == ["mcp", "--root", str(ws.resolve())]
    text = H.runbook(tmp_path, "init", "ws2", env=ENV).stdout
    assert json.loads(text[text.index("{"):]) == {"mcpServers": {"runbook": {**server, "args": [
        *server["args"][:-1], str((tmp_path / "ws2").resolve())]}}}

    async def main():  # the host's view: the printed command, started anywhere
        host = StdioServerParameters(command=server["command"], args=server["args"], cwd=str(tmp_path), env=SERVER_ENV)
        async with Client(host) as client:
            return await client.call_tool("brief", {})

    brief = run(main)
    assert not brief.is_error and brief.structured_content["result"]["plan"] == "plans/game-plan.md"

    # an AGENTS.md of the project's own gets the runbook section appended; once there, it stays
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "AGENTS.md").write_text("# House rules\n\nRun the linter.\n")
    H.runbook(mine, "init", env=ENV)
    grown = (mine / "AGENTS.md").read_text()
    assert grown.startswith("# House rules\n\nRun the linter.\n\n## runbook: how this project is driven\n")
    (mine / "plans" / "game-plan.md").rename(mine / "plans" / "moved.md")
    (mine / "plans" / "next-steps.md").unlink()
    (mine / "runbook.toml").unlink()
    H.runbook(mine, "init", env=ENV)
    assert (mine / "AGENTS.md").read_text() == grown


def test_the_locks_pin_the_sdk_and_what_it_needs() -> None:
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement

    root = Path(__file__).resolve().parents[2]
    extra = next(line for line in (root / "pyproject.toml").read_text().splitlines() if line.startswith("mcp = "))
    assert extra == f'mcp = ["mcp=={version("mcp")}"]'
    locks = [path for path in sorted((root / "requirements").glob("lock-*.txt")) if "\nmcp==" in path.read_text()]
    assert any(path.name == "lock-cpu.txt" for path in locks)
    for path in locks:
        pins = {}
        for line in path.read_text().splitlines():
            if "==" in line and not line.startswith("#"):
                name, pinned = line.split("==", 1)
                pins[name.strip().lower().replace("_", "-")] = pinned.split(";")[0].strip()
        assert pins["mcp"] == version("mcp"), path
        for dist in ("mcp", "mcp-types"):
            for text in requires(dist) or []:
                req = Requirement(text)
                if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                    continue
                name = req.name.lower().replace("_", "-")
                assert name in pins, f"{path.name}: {dist} needs {req}, not pinned"
                assert req.specifier.contains(pins[name], prereleases=True), f"{path.name}: {name}=={pins[name]} vs {req}"


def test_every_tool_argument_is_a_parameter_of_its_verb() -> None:
    import importlib

    from runbook.cli import COMMANDS
    from runbook.mcp_server import NextArgs

    samples = {"title": "t", "run": "last", "phase": "1", "metric": "score"}
    for tool in TOOLS:
        command = importlib.import_module(COMMANDS[tool.name][0]).command
        names = {param.name for param in command.params}
        required = {name: samples[name] for name, field in tool.args.model_fields.items() if field.is_required()}
        assert set(tool.args(**required).cli_kwargs()) <= names, tool.name
        assert "as_json" in names
    argv = NextArgs(run=True, plan="plans/p.md", phase="1", restart=True, until_stop=True, no_commit=True,
                    detach=True).argv()
    assert argv == ["next", "--yes", "--json", "--plan", "plans/p.md", "--phase", "1", "--restart", "--until-stop",
                    "--no-commit", "--detach"]
    command = importlib.import_module(COMMANDS["next"][0]).command
    flags = {opt for param in command.params for opt in param.opts}
    assert {a for a in argv if a.startswith("--")} <= flags


def test_nul_bytes_and_re_split_var_names_are_tool_errors_never_a_crash(tmp_path: Path) -> None:
    """A NUL byte in any argument (a `set` value, a plan path, a record title) and a `set` key holding `=`
    are `usage` tool errors naming the argument; the server answers the next call as before, runs
    nothing and writes nothing (a NUL reached Popen: a ValueError through the SDK, JSON-RPC code 0)."""
    repo = H.make_repo(tmp_path / "repo", PLAN, notes=NOTES)

    async def main():
        async with Client(params(repo)) as client:
            calls = [await client.call_tool("next", {"run": True, "set": {"budget": "1\x00; touch PWNED"}}),
                     await client.call_tool("next", {"run": True, "set": {"budget=9": "1"}}),
                     await client.call_tool("status", {"plan": "plans/plan.md\x00x"}),
                     await client.call_tool("record", {"title": "A\x00B", "no_commit": True})]
            return calls, await client.call_tool("status", {})

    calls, after = run(main)
    for result, where in zip(calls, ("set.budget", "budget=9", "plan", "title"), strict=True):
        assert result.is_error, result
        error = result.structured_content["error"]
        assert error["code"] == "usage" and where in error["message"], error
    assert "NUL byte" in calls[0].structured_content["error"]["message"]
    assert "not a var name" in calls[1].structured_content["error"]["message"]
    assert not after.is_error and after.structured_content == cli_json(repo, "status")
    assert not (repo / "state" / "runs").exists() and not (repo / "PWNED").exists()
    assert H.git(repo, "status", "--porcelain") == ""


def test_a_server_runs_reads_and_writes_only_its_own_repository(tmp_path: Path) -> None:
    """`runbook mcp --root A` refuses (a `usage` tool error naming the argument) every plan path that
    leads out of A: another repository's plan by absolute path or `..`, a link inside A to it, a plan of
    a repository nested inside A, in `next` (run: true), `record`, `validate` and `status`. Nothing
    runs and nothing is written in the other repositories (a server rooted at A ran B's steps and
    wrote B's notes); A's own plan is served as before."""
    a = H.make_repo(tmp_path / "a", PLAN, notes=NOTES)
    b = H.make_repo(tmp_path / "b", PLAN.replace("mkdir -p {out}", "mkdir -p {out} && touch RAN"), notes=NOTES)
    nested = H.make_repo(a / "vendor" / "c", PLAN.replace("mkdir -p {out}", "mkdir -p {out} && touch RAN"),
                         notes=NOTES)
    (a / "plans" / "link.md").symlink_to(b / "plans" / "plan.md")
    before = {repo: (git(repo, "log", "--format=%H"), (repo / "plans" / "notes.md").read_bytes())
              for repo in (b, nested)}
    b_plan = str(b / "plans" / "plan.md")
    server = StdioServerParameters(command=RUNBOOK[0], args=[*RUNBOOK[1:], "mcp", "--root", str(a)],
                                   cwd=str(tmp_path), env=SERVER_ENV)

    async def main():
        async with Client(server) as client:
            calls = [await client.call_tool(tool, arguments) for tool, arguments in (
                ("next", {"run": True, "plan": b_plan}),
                ("next", {"run": True, "plan": "../b/plans/plan.md"}),
                ("next", {"run": True, "plan": "vendor/c/plans/plan.md"}),
                ("record", {"plan": b_plan, "title": "Not here"}),
                ("record", {"plan": "plans/link.md", "title": "Not here"}),
                ("validate", {"plans": ["plans/plan.md", b_plan]}),
                ("status", {"plan": "plans/link.md"}))]
            return calls, await client.call_tool("status", {"plan": "plans/plan.md"})

    calls, own = run(main)
    for result, where in zip(calls, ("plan", "plan", "plan", "plan", "plan", "plans[1]", "plan"), strict=True):
        assert result.is_error, result
        error = result.structured_content["error"]
        assert error["code"] == "usage" and error["message"].startswith(f"{where}: "), error
        assert f"outside {a.resolve()}, the repository this server serves" in error["message"], error
    assert not own.is_error and own.structured_content == cli_json(a, "status", "--plan", "plans/plan.md")
    for repo in (b, nested):
        assert not (repo / "RAN").exists() and not (repo / "state").exists()
        assert (git(repo, "log", "--format=%H"), (repo / "plans" / "notes.md").read_bytes()) == before[repo]
    assert not (a / "state" / "runs").exists()


def test_an_empty_plan_path_and_a_bad_metric_name_are_refused_naming_the_argument(tmp_path: Path) -> None:
    """Found by tests/runbook/test_fuzz_inputs.py::test_mcp_tool_arguments_are_a_result_or_a_tool_error:
    an empty path in `plans` was refused as "outside" the repository (abspath led it to the root's
    parent), and a `record` metric named "" or "a=b" as `--metric: 'a=b=1.0' is not NAME=NUMBER`, an
    option the host never sent. Both are `usage` tool errors naming the argument; nothing is written;
    a real metric name is recorded."""
    repo = H.make_repo(tmp_path / "repo", PLAN, notes=NOTES)

    async def main():
        async with Client(params(repo)) as client:
            refused = [await client.call_tool("validate", {"plans": ["plans/plan.md", ""]}),
                       await client.call_tool("record", {"title": "t", "metrics": {"a=b": 1}}),
                       await client.call_tool("record", {"title": "t", "metrics": {"": 1}})]
            notes = (repo / "plans" / "notes.md").read_text()
            return refused, notes, await client.call_tool("record", {"title": "t", "metrics": {"accept_len": 2.41},
                                                                     "no_commit": True})

    (empty, equals, nameless), notes, recorded = run(main)
    for result in (empty, equals, nameless):
        assert result.is_error and result.structured_content["error"]["code"] == "usage", result
    assert empty.structured_content["error"]["message"] == "plans[1]: an empty path names no plan file"
    for result, name in ((equals, "'a=b'"), (nameless, "''")):
        message = result.structured_content["error"]["message"]
        assert f"metrics: Value error, {name} is not a metric name" in message and "--metric" not in message
    assert notes == NOTES and git(repo, "log", "--format=%s") == "init\n"
    assert not recorded.is_error and "Metrics: accept_len 2.41" in (repo / "plans" / "notes.md").read_text()


# ---- the wire: raw bytes on the server's stdin ----------------------------------------------------


class RawServer:
    """`runbook mcp` on raw stdio: bytes in, one parsed JSON reply a line out (read by a thread)."""

    def __init__(self, repo: Path, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([*RUNBOOK, "mcp"], cwd=repo, env={**SERVER_ENV, **(env or {})},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.replies: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
        assert self.reply()["id"] == "init"
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.replies.put(json.loads(line))

    def send(self, message: dict | bytes) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def reply(self, timeout: float = 20) -> dict:
        try:
            return self.replies.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no reply from the server within {timeout:g} s") from None

    def until(self, rid: str, timeout: float = 20) -> list[dict]:
        """The replies before the one to request `rid`, which must come too."""
        got = []
        while (reply := self.reply(timeout)).get("id") != rid:
            got.append(reply)
        assert "result" in reply, reply
        return got

    def peak_kb(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


MALFORMED: list[tuple[bytes, tuple[object, int] | None]] = [  # (a line, the (id, code) answered; None: no answer)
    (b"not json", (None, -32700)),
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/list"', (1, -32700)),  # cut: its id is readable
    (b"\xff\xfe{", (None, -32700)),
    (b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":' + b"[" * 5000 + b"]" * 5000 + b"}",
     (2, -32700)),  # nested deeper than the parser goes
    (b"[1, 2]", (None, -32600)), (b"[]", (None, -32600)), (b'"hello"', (None, -32600)), (b"42", (None, -32600)),
    (b'{"foo": 1}', (None, -32600)),
    (b'{"jsonrpc":"1.0","id":3,"method":"tools/list"}', (3, -32600)),
    (b'{"jsonrpc":"2.0","id":[4],"method":"tools/list"}', (None, -32600)),
    (b'{"jsonrpc":"2.0","id":true,"method":"tools/list"}', (None, -32600)),
    (b'{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}', (None, -32600)),
    (b'{"jsonrpc":"2.0","id":null,"method":"tools/list"}', (None, -32600)),
    (b'{"jsonrpc":"2.0","id":"five","method":5}', ("five", -32600)),
    (b'{"jsonrpc":"2.0","id":6}', (6, -32600)),  # neither a request nor a response
    (b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":"x"}', (7, -32602)),
    (b'{"jsonrpc":"2.0","id":8,"method":"tools/list","params":[1]}', (8, -32602)),
    (b'{"jsonrpc":"2.0","id":9,"method":"no/such/method"}', (9, -32601)),
    (b'{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":5}}', (10, -32602)),
    (b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":"x"}', None),  # a notification: no answer
    (b"", None), (b"   \r", None),  # blank lines carry no message
]


def test_malformed_messages_are_answered_with_json_rpc_errors_and_the_server_serves_on(
        tmp_path: Path, counts) -> None:
    """Each line the SDK dropped without a word (a client waited forever) is answered as JSON-RPC 2.0
    says: -32700 for invalid JSON, -32600 for JSON that is no request (a batch, a wrong `jsonrpc`, an
    id or method of the wrong type), -32602 for params that are no object, with the request's id where
    it can be read and `null` where not; unknown methods (-32601) as the SDK answers them; a
    notification never. After each, the next request is answered, and the tools work as before."""
    repo = H.make_repo(tmp_path / "repo", PLAN, notes=NOTES)
    server = RawServer(repo)
    try:
        for i, (line, expected) in enumerate(MALFORMED):
            server.send(line + b"\n")
            server.send({"jsonrpc": "2.0", "id": f"ping-{i}", "method": "ping"})
            got = server.until(f"ping-{i}")
            if expected is None:
                assert got == [], (line, got)
                continue
            assert len(got) == 1, (line[:80], "answered", got)
            reply = got[0]
            assert reply["jsonrpc"] == "2.0" and (reply["id"], reply["error"]["code"]) == expected, (line[:80], reply)
            assert reply["error"]["message"]
        server.send({"jsonrpc": "2.0", "id": "status", "method": "tools/call",
                     "params": {"name": "status", "arguments": {}}})
        status = server.reply()
        assert status["id"] == "status" and status["result"]["structuredContent"] == cli_json(repo, "status")
    finally:
        server.close()
    assert server.proc.returncode == 0
    H.assert_no_traceback(("", server.proc.stderr.read().decode()), "runbook mcp")
    counts.add("mcp_malformed_messages", len(MALFORMED))


def test_an_over_size_message_is_refused_at_once_naming_the_limit_and_never_read_whole(
        tmp_path: Path, counts) -> None:
    """A message over the limit (4 MiB; RUNBOOK_MCP_MAX_MESSAGE_MB) is answered as soon as its first
    bytes cross it, with -32600 naming the limit and the request's id, before the client has sent the
    rest; the rest is thrown away as it comes, so the server's memory stays flat (a 50 MB message held
    it for seconds at 1.2 GB, then answered a tool result); the next request is answered. Through the
    SDK's own client with the limit set to 1 MiB: a 2 MB `record` title is an MCP error naming the
    limit, nothing is written, and the next call works."""
    repo = H.make_repo(tmp_path / "repo", PLAN, notes=NOTES)
    server = RawServer(repo)
    try:
        before = server.peak_kb()
        head = b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"record","arguments":{"title":"'
        server.send(head + b"x" * (8 << 20))  # 8 MiB, no end of line yet
        reply = server.reply(timeout=30)  # answered now, while the client still holds 42 MB of it
        assert reply["id"] == 5 and reply["error"]["code"] == -32600, reply
        assert "over the limit of 4194304 bytes (4 MiB; RUNBOOK_MCP_MAX_MESSAGE_MB sets it)" in reply["error"]["message"]
        server.send(b"x" * (42 << 20) + b'"}}}\n')
        server.send({"jsonrpc": "2.0", "id": "after", "method": "tools/list"})
        assert server.until("after", timeout=60) == []
        # the id after the arguments cannot be read in time: answered with id null
        server.send(b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":"status","arguments":{"plan":"'
                    + b"y" * (5 << 20) + b'"}},"id":6}\n')
        assert server.reply(timeout=30)["id"] is None
        grew_mb = (server.peak_kb() - before) / 1024
        assert grew_mb < 100, f"the server's peak memory grew {grew_mb:.0f} MB"
    finally:
        server.close()
    assert server.proc.returncode == 0

    small = StdioServerParameters(command=RUNBOOK[0], args=[*RUNBOOK[1:], "mcp"], cwd=str(repo),
                                  env={**SERVER_ENV, "RUNBOOK_MCP_MAX_MESSAGE_MB": "1"})

    async def main():
        async with Client(small) as client:
            with pytest.raises(MCPError) as refused:
                await client.call_tool("record", {"title": "x" * (2 << 20)})
            return refused.value, await client.call_tool("status", {})

    refused, status = run(main)
    assert refused.error.code == -32600 and "over the limit of 1048576 bytes (1 MiB" in refused.error.message
    assert not status.is_error and status.structured_content == cli_json(repo, "status")
    assert (repo / "plans" / "notes.md").read_text() == NOTES and git(repo, "status", "--porcelain") == ""
    counts.add("mcp_over_size_messages", 3)
    print(f"reliability measure: 50 MB message, server peak memory grew {grew_mb:.1f} MB")
