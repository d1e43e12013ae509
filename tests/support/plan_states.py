"""The plan states of docs/next.md, each built with real `runbook next` runs in a real git repo.

Used by tests/runbook/run/test_plan_states.py (status, next --dry-run and brief agree; the brief's command is
what `runbook next` does) and tests/runbook/test_json_contract.py (every command's --json in every state).
Imported by name (`import plan_states as S`: tests/ is on sys.path); built once per session by the
`plan_states` fixture of conftest.py.

The plan branches: Phase 0 probes; Phase 1 trains (fails unless work/acc says otherwise; exits 1
with a traceback while work/crash exists) and falls back to Phase 2 on a fail; Phase 2 passes
unless work/fb says 0 (and outlives its 3 s timeout while work/slow exists); both stop after a
pass. Phase 3 is a detour nothing leads to, with a step that outlives its 1 s timeout. work/ is
gitignored, so the knobs there change outcomes without changing any tracked file.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import helpers as H

PLAN = """\
---
runbook: 1
title: States
notes: notes.md
---

# Game plan: states

A plan that branches, for the state table of docs/next.md.

## Phase 0: Probe (~1 min)

Steps:
- [ ] Probe: `if [ -f work/hold ]; then while [ ! -f work/go ]; do sleep 0.05; done; fi; echo '{"score": 3}' > "$RUNBOOK_METRICS"`

Pass: `score >= 2`

## Phase 1: Train (~2 min)

Steps:
- [ ] Train: `[ ! -f work/crash ] || { echo 'Traceback (most recent call last):'; echo 'RuntimeError: boom'; exit 1; }; echo "{\\"acc\\": $(cat work/acc 2>/dev/null || echo 0.3)}" > "$RUNBOOK_METRICS"`

Pass: `acc >= 0.5`
On pass: stop
On fail: Phase 2

## Phase 2: Fallback (~2 min)

Steps:
- [ ] Fallback: `[ ! -f work/slow ] || sleep 10; echo "{\\"fb\\": $(cat work/fb 2>/dev/null || echo 1)}" > "$RUNBOOK_METRICS"`

Pass: `fb >= 1`
On pass: stop
Timeout: 3s

## Phase 3: Detour

Steps:
- [ ] Slow: `sleep 5`

Pass: `score >= 1`
Timeout: 1s
"""

NOTES = """\
# Notes: states

## Next steps

- Run Phase 1 with more data
"""

# state -> (what it is, the phase the next action acts on, its kind, its outcome)
STATES: dict[str, tuple[str, str | None, str, str | None]] = {
    "fresh": ("no run yet", "phase-0", "run", None),
    "mid-plan": ("Phase 0 passed", "phase-1", "run", None),
    "failed-and-stopped": ("Phase 1 failed, its fallback Phase 2 failed, On fail: stop", "phase-2", "nothing", "failed"),
    "failed-with-fallback": ("Phase 1 failed; its On fail leads to Phase 2", "phase-2", "run", None),
    "rewritten-phase": ("Phase 0 passed, then its step was rewritten", "phase-0", "run", None),
    "detour-timed-out": ("finished, then `--phase 3` timed out", "phase-3", "resume", None),
    "detour-after-error": ("Phase 0 passed, Phase 1 ended error, then `--phase 2` timed out", "phase-1", "resume",
                           None),
    "repeated-error": ("Phase 0 passed, Phase 1 ended error twice the same way, nothing changed", "phase-1",
                       "nothing", "repeated"),
    "running": ("a `runbook next` is running Phase 0", "phase-0", "running", None),
    "finished": ("Phase 0 and Phase 1 passed; Phase 1 stops", None, "nothing", "finished"),
    "finished-with-failures": ("Phase 1 failed, the fallback passed and stops", None, "nothing", "finished"),
}


def run(repo: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """runbook ARGS in `repo`, in this process (helpers.runbook_inproc): the states are read from the files
    each verb leaves; `start_running` keeps a real process, whose lock the others see."""
    return H.runbook_inproc(repo, *args, timeout=timeout)


def rb_json(repo: Path, *args: str, timeout: float = 60) -> tuple[dict, subprocess.CompletedProcess]:
    done = run(repo, *args, "--json", timeout=timeout)
    return json.loads(done.stdout), done


def _next(repo: Path, *args: str) -> None:
    done = run(repo, "next", "--yes", *args)
    assert done.returncode in (0, 1, 4), done.stdout[-2000:] + done.stderr[-2000:]


def knob(repo: Path, name: str, value: str) -> None:
    (repo / "work").mkdir(exist_ok=True)
    (repo / "work" / name).write_text(value + "\n")


def fresh_repo(path: Path) -> Path:
    repo = H.make_repo(path, PLAN, notes=NOTES)
    (repo / ".gitignore").write_text("state/lock\nstate/write.lock\nstate/runs/*/\nwork/\n")
    H.git(repo, "commit", "-qam", "ignore work/")
    return repo


def build(name: str, path: Path) -> Path:
    """A repository at `path` in state `name` (not `running`: see `start_running`)."""
    repo = fresh_repo(path)
    if name == "fresh":
        return repo
    _next(repo)  # Phase 0 pass
    if name == "mid-plan":
        return repo
    if name == "rewritten-phase":
        plan = repo / "plans" / "plan.md"
        plan.write_text(plan.read_text().replace("""echo '{"score": 3}'""", """echo '{"score": 4}'"""))
        H.git(repo, "commit", "-qam", "rewrite Phase 0's probe")
        return repo
    if name == "finished":
        knob(repo, "acc", "0.9")
        _next(repo)  # Phase 1 pass, On pass: stop
        return repo
    if name == "detour-timed-out":
        knob(repo, "acc", "0.9")
        _next(repo)  # finished
        _next(repo, "--phase", "3")  # the detour: timeout
        return repo
    if name in ("detour-after-error", "repeated-error"):
        knob(repo, "crash", "1")
        _next(repo)  # Phase 1: error at step 1 (a traceback)
        if name == "repeated-error":
            _next(repo)  # resumed: the same error at the same step, nothing changed
            return repo
        knob(repo, "slow", "1")
        _next(repo, "--phase", "2")  # the detour: Phase 2 (where Phase 1's fail leads) times out
        return repo
    _next(repo)  # Phase 1 fail -> Phase 2
    if name == "failed-with-fallback":
        return repo
    if name == "failed-and-stopped":
        knob(repo, "fb", "0")
    _next(repo)  # Phase 2: fail (stop) or pass (stop)
    assert name in ("failed-and-stopped", "finished-with-failures"), name
    return repo


def copy(repo: Path, path: Path) -> Path:
    shutil.copytree(repo, path, symlinks=True)
    return path


def start_running(repo: Path) -> subprocess.Popen:
    """Start `runbook next --yes` on a fresh repo and return once its Phase 0 step is running."""
    knob(repo, "hold", "1")
    proc = H.popen_runbook(repo, "next", "--yes")
    lock = repo / "state" / "lock"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            info = json.loads(lock.read_text())
        except (OSError, ValueError):
            info = {}
        if info.get("step") == "step-1" and info.get("step_pgid"):
            return proc
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the run never reached its step")


def finish_running(repo: Path, proc: subprocess.Popen) -> tuple[str, str]:
    knob(repo, "go", "1")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out[-2000:] + err[-2000:]
    (repo / "work" / "hold").unlink()
    return out, err
