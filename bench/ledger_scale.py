"""Benchmark: the read commands over a ledger of 10,000 run records (issue 28).

Builds a workspace the way a long project leaves it: a git repository made by `runbook init
--example eagle3`, then N run records shaped exactly as `runbook next` writes them (the plan's
resolved commands, its criteria judged, steps with 20-line log tails, merged metrics with their
`step-N.` copies, an environment fingerprint), the plan's status blocks and results tables written
back for each phase's latest run, all committed. Then it times `runbook status`, `brief`,
`next --dry-run` and `history` as whole processes (interpreter start-up included):

- cold: the index (state/index/) removed first, as after a clone, for each command once;
- warm: the median of --repeat runs, the index in place.

Wall time and CPU time (user + system of the child, from `resource.getrusage(RUSAGE_CHILDREN)`)
are both reported: the machine this runs on is shared, so wall time moves with everyone else's
load; CPU time moves much less. Compiled bytecode is written first (a normal install has it).

    .venv/bin/python -m bench.ledger_scale [--runs 10000] [--repeat 5] [--dir DIR] [--keep] [--json OUT]

`--dir DIR --keep` leaves the workspace for profiling (`--reuse` times an existing one again).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
RUNBOOK = str(BIN / "runbook")
COMMANDS: list[list[str]] = [["status"], ["brief"], ["next", "--dry-run"], ["history"]]
EXTRA: list[list[str]] = [["history", "--limit", "0"]]  # every run listed: reads all 10,000 (not a 300 ms command)
PLAN = "plans/eagle3-game-plan.md"
START = 1_764_000_000.0  # 2025-11-24: the project's first run

_LOG_WORDS = ("loss", "lr", "tok/s", "grad_norm", "acc_0", "acc_1", "acc_2", "mem")


def _env() -> dict[str, str]:
    env = dict(os.environ, RUNBOOK_ENV_PROBE="0", GIT_AUTHOR_NAME="bench", GIT_AUTHOR_EMAIL="bench@example.org",
               GIT_COMMITTER_NAME="bench", GIT_COMMITTER_EMAIL="bench@example.org")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=_env(), check=True, capture_output=True, text=True).stdout


def _log_tail(rng: random.Random, step: int, lines: int = 20) -> list[str]:
    out = []
    for i in range(lines):
        values = " ".join(f"{w} {rng.uniform(0, 4):.4f}" for w in rng.sample(_LOG_WORDS, 3))
        out.append(f"[step {step}] epoch {i // 5} iter {i * 50:5d} {values}")
    return out


def _metrics_for(name: str, rng: random.Random, good: bool) -> dict[str, float]:
    """What the eagle command in a step writes ($RUNBOOK_METRICS), roughly."""
    accept = rng.uniform(1.8, 3.2) if good else rng.uniform(1.0, 1.7)
    if " evaluate " in name or " probe " in name:
        out = {"accept_len": round(accept, 4), "greedy_match": 1.0}
        out.update({f"accept_rate_{k}": round(rng.uniform(0.2, 0.9), 4) for k in range(3)})
        if " probe " in name:
            out.update({f"cos_sim_l{layer}": round(rng.uniform(0.7, 0.99), 4) for layer in (2, 4, 5)})
        return out
    if " train " in name:
        out = {"train_loss": round(rng.uniform(1.0, 4.0), 4), "val_loss": round(rng.uniform(1.0, 4.0), 4),
               "val_accept_len": round(accept, 4), "train_tok_s": round(rng.uniform(800, 3000), 1)}
        out.update({f"val_acc_{k}": round(rng.uniform(0.2, 0.9), 4) for k in range(3)})
        return out
    if " extract " in name:
        return {"extract_tokens": float(rng.randint(10_000, 90_000)), "extract_tok_s": round(rng.uniform(900, 3000), 1),
                "extract_bytes": float(rng.randint(10**7, 10**9))}
    if " bench " in name:
        return {"plain_tok_s": 80.0, "spec_tok_s": round(80 * accept * 0.8, 2), "speedup": round(accept * 0.8, 3),
                "accept_len": round(accept, 4)}
    if " serve-bench " in name:
        return {"vllm_accept_len": round(accept, 4), "vllm_tok_s": round(rng.uniform(100, 400), 1)}
    return {}


def build(repo: Path, runs: int, seed: int = 0) -> dict:
    """The workspace with `runs` records; returns facts about it (sizes, phases)."""
    from runbook.formatting import iso
    from runbook.model import RunRecord, StepResult, merge_metrics
    from runbook.plan import writeback
    from runbook.plan.criteria import metric_names
    from runbook.plan.parse import parse_plan
    from runbook.run.envprint import fingerprint
    from runbook.run.local import judge
    from runbook.run.select import resolved_commands
    from runbook.store.ledger import run_path

    rng = random.Random(seed)
    repo.mkdir(parents=True, exist_ok=True)
    _git(repo, "init", "-q", "-b", "main")
    subprocess.run([RUNBOOK, "init", "--example", "eagle3"], cwd=repo, env=_env(), check=True, capture_output=True)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "runbook init --example eagle3")
    commit = _git(repo, "rev-parse", "HEAD").strip()
    text = (repo / PLAN).read_text(encoding="utf-8")
    plan, _ = parse_plan(text, PLAN)
    assert plan is not None
    blob = _git(repo, "hash-object", PLAN).strip()
    os.environ["RUNBOOK_ENV_PROBE"] = "0"
    env = fingerprint()
    phases = {p.id: p for p in plan.phases}
    # a project's shape: setup and the probe once or twice, then long sweeps of fine-tunes, the
    # fallback and the scale-up; the last runs leave Phase 2 to resume after an error
    order = ["setup", "phase-0"] + [rng.choice(["phase-1", "phase-1", "fallback", "phase-2"]) for _ in range(runs - 5)]
    order += ["setup", "phase-0", "phase-1", "phase-2"]
    order = order[:runs]
    moment = START
    latest: dict[str, RunRecord] = {}
    history: dict[str, list[RunRecord]] = {}
    state = repo / "state"
    for i, phase_id in enumerate(order):
        phase = phases[phase_id]
        commands = resolved_commands(plan, phase)
        last = i == len(order) - 1
        crash = last or rng.random() < 0.08
        good = rng.random() < 0.7
        started = moment
        steps = []
        t = started
        fail_at = len(commands) - 1 if crash else None
        for k, command in enumerate(commands):
            took = rng.uniform(5, 300)
            exit_code = 0 if fail_at is None or k < fail_at else 3
            steps.append(StepResult(
                step_id=f"step-{k + 1}", command=command, exit_code=exit_code,
                started=iso(_utc(t)), finished=iso(_utc(t + took)), duration_s=round(took, 3),
                metrics=_metrics_for(f" {command} ", rng, good) if exit_code == 0 else {},
                log_path=f"state/runs/RUN/step-{k + 1}.log", log_tail=_log_tail(rng, k + 1),
            ))
            t += took
            if exit_code:
                break
        run_id = f"{_utc(started):%Y%m%d-%H%M%S}-{rng.getrandbits(16):04x}"
        for step in steps:
            step.log_path = step.log_path.replace("RUN", run_id)
        metrics = merge_metrics(steps)
        if crash:
            verdict, reason = "error", f"{steps[-1].step_id} exited 3: `{steps[-1].command[:60]}`"
        else:
            verdict, reason = judge(phase.criterion.expr if phase.criterion else None, metrics, steps)
        record = RunRecord(
            run_id=run_id, plan=PLAN, plan_blob=blob, phase=phase.id, phase_label=phase.label,
            phase_text_hash=writeback.phase_text_hash(text, phase), started=iso(_utc(started)),
            finished=iso(_utc(t)), duration_s=round(t - started, 3), steps=steps, metrics=metrics,
            criterion=phase.criterion.text if phase.criterion else None, verdict=verdict, reason=reason,
            commit_before=commit, dirty=False, env=env,
        )
        path = run_path(state, run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(record.model_dump_json(indent=2) + "\n", encoding="utf-8")
        logs = state / "runs" / run_id  # the run's folder (gitignored), as a real run leaves it
        logs.mkdir()
        (logs / f"{steps[-1].step_id}.log").write_text("\n".join(steps[-1].log_tail) + "\n", encoding="utf-8")
        latest[phase.id] = record
        history.setdefault(phase.id, []).append(record)
        moment = t + rng.uniform(60, 900)
    for phase_id, record in latest.items():  # the plan as runbook next leaves it
        current, _ = parse_plan(text, PLAN)
        phase = current.find_phase(phase_id)
        names = metric_names(phase.criterion.expr) if phase.criterion else []
        text = writeback.apply_run(text, current, phase_id, record, history[phase_id], names, file=PLAN)
    (repo / PLAN).write_text(text, encoding="utf-8")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"bench: {runs} runs")
    sizes = [p.stat().st_size for p in (state / "runs").glob("*.json")]
    return {"runs": runs, "record_bytes_mean": round(statistics.mean(sizes)), "record_bytes_max": max(sizes),
            "ledger_bytes": sum(sizes), "plan_bytes": len(text.encode()),
            "runs_per_phase": {k: len(v) for k, v in history.items()}}


def git_growth(repo: Path, runs: int = 5) -> dict:
    """What git gains per run at this ledger size: `runs` more runs recorded the way `runbook next`
    records one (the record written, the plan's blocks written back, both committed by
    gitops.commit_paths), measured as loose objects, then packed (`git gc`)."""
    from runbook.plan import writeback
    from runbook.plan.parse import parse_plan
    from runbook.store import gitops
    from runbook.store.index import LedgerIndex
    from runbook.store.ledger import load_run, run_path

    def sizes() -> dict[str, int]:
        out = _git(repo, "count-objects", "-v")
        return {k: int(v) for k, v in (line.split(": ") for line in out.splitlines())}

    _git(repo, "gc", "-q")
    before = sizes()
    state = repo / "state"
    index = LedgerIndex.open(state, save=False)
    last = load_run(run_path(state, index.rows(PLAN)[-1].run_id))
    for k in range(runs):
        moment = time.time() + k
        record = last.model_copy(update={
            "run_id": f"{_utc(moment):%Y%m%d-%H%M%S}-{k:04x}", "started": f"{_utc(moment):%Y-%m-%dT%H:%M:%S}.000000Z",
            "finished": f"{_utc(moment + 600):%Y-%m-%dT%H:%M:%S}.000000Z",
            "metrics": {n: (v * (1 + 0.01 * (k + 1)) if isinstance(v, float) else v) for n, v in last.metrics.items()},
        })
        path = run_path(state, record.run_id)
        path.write_text(record.model_dump_json(indent=2) + "\n", encoding="utf-8")
        text = (repo / PLAN).read_text(encoding="utf-8")
        plan, _ = parse_plan(text, PLAN)
        index = LedgerIndex.open(state, save=False)
        history, earlier = index.runs(PLAN, record.phase, limit=writeback.RESULTS_ROWS)
        (repo / PLAN).write_text(writeback.apply_run(text, plan, record.phase, record, history, file=PLAN, earlier=earlier),
                                 encoding="utf-8")
        gitops.commit_paths(repo, [f"state/runs/{path.name}", PLAN], f"runbook: {record.phase} {record.verdict}")
    # the objects these commits added, compressed as git stores them loose (objectsize:disk)
    listed = _git(repo, "rev-list", "--objects", f"HEAD~{runs}..HEAD")
    objects = [line.split(" ", 1) for line in listed.splitlines()]
    checked = subprocess.run(["git", "cat-file", "--batch-check=%(objectname) %(objecttype) %(objectsize:disk)"],
                             cwd=repo, input="\n".join(o[0] for o in objects) + "\n", capture_output=True, text=True,
                             check=True).stdout.split("\n")
    by_kind: dict[str, int] = {}
    for (_sha, *name), line in zip(objects, checked, strict=False):
        kind, size = line.split()[1], int(line.split()[2])
        what = "record" if name and name[0].startswith("state/runs/") else (
            "plan" if name and name[0] == PLAN else ("runs tree" if name and name[0] == "state/runs" else kind))
        by_kind[what] = by_kind.get(what, 0) + size
    _git(repo, "gc", "-q")
    packed = sizes()
    tree = _git(repo, "cat-file", "-s", "HEAD:state/runs").strip()
    return {"runs_added": runs, "record_bytes": path.stat().st_size,
            "loose_bytes_per_run": round(sum(by_kind.values()) / runs),
            "loose_by_object_per_run": {k: round(v / runs) for k, v in sorted(by_kind.items())},
            "packed_bytes_per_run": round((packed["size-pack"] - before["size-pack"]) * 1024 / runs),
            "runs_tree_bytes": int(tree), "pack_bytes": packed["size-pack"] * 1024}


def _utc(seconds: float):
    import datetime as _dt

    return _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc)


def timed(argv: list[str], cwd: Path) -> tuple[float, float, int, int]:
    """(wall s, CPU s of the child, exit code, bytes on stdout) of one whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode, len(proc.stdout)


def drop_index(repo: Path) -> None:
    shutil.rmtree(repo / "state" / "index", ignore_errors=True)


def measure(repo: Path, repeat: int, commands: list[list[str]]) -> list[dict]:
    rows = []
    subprocess.run([RUNBOOK, "--help"], cwd=repo, env=_env(), capture_output=True)  # bytecode written
    for args in commands:
        drop_index(repo)
        cold_wall, cold_cpu, code, out_bytes = timed([RUNBOOK, *args], repo)
        warm = [timed([RUNBOOK, *args], repo) for _ in range(repeat)]
        rows.append({
            "command": "runbook " + " ".join(args), "exit_code": code, "stdout_bytes": out_bytes,
            "cold_wall_s": round(cold_wall, 3), "cold_cpu_s": round(cold_cpu, 3),
            "warm_wall_s": round(statistics.median(w for w, _c, _e, _b in warm), 3),
            "warm_cpu_s": round(statistics.median(c for _w, c, _e, _b in warm), 3),
            "warm_wall_min_s": round(min(w for w, _c, _e, _b in warm), 3),
            "warm_cpu_min_s": round(min(c for _w, c, _e, _b in warm), 3),
        })
    return rows


def baseline(repeat: int) -> dict:
    """Start-up alone: `python -c pass` and `runbook --help`."""
    out = {}
    for label, argv in (("python -c pass", [sys.executable, "-c", "pass"]), ("runbook --help", [RUNBOOK, "--help"])):
        samples = [timed(argv, Path.cwd()) for _ in range(repeat)]
        out[label] = {"wall_s": round(statistics.median(s[0] for s in samples), 3),
                      "cpu_s": round(statistics.median(s[1] for s in samples), 3)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="Build the workspace here (default: a temp dir).")
    parser.add_argument("--keep", action="store_true", help="Leave the workspace behind.")
    parser.add_argument("--reuse", action="store_true", help="Time an existing workspace in --dir again.")
    parser.add_argument("--command", action="append", default=None,
                        help="A command to time instead of the default four, e.g. --command 'history --limit 20'.")
    parser.add_argument("--json", type=Path, default=None, help="Write the figures here too.")
    parser.add_argument("--growth", type=int, default=5, help="Runs to add for the git growth figure (0: skip).")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="ledger-bench-"))
    repo = root / "ws" if args.dir is None else root
    commands = [c.split() for c in args.command] if args.command else COMMANDS + EXTRA
    try:
        if args.reuse:
            facts = {"runs": len(list((repo / "state" / "runs").glob("*.json")))}
        else:
            if repo.exists():
                shutil.rmtree(repo)
            t = time.perf_counter()
            facts = build(repo, args.runs)
            facts["build_s"] = round(time.perf_counter() - t, 1)
        os.sync()  # the build's 140 MB written out first: timing runs during writeback would measure the disk
        time.sleep(2)
        load = os.getloadavg()
        rows = measure(repo, args.repeat, commands)
        base = baseline(args.repeat)
        load_after = os.getloadavg()
        growth = git_growth(repo, args.growth) if args.growth else {}
    finally:
        if not args.keep and not args.reuse:
            shutil.rmtree(root, ignore_errors=True)
    print(f"ledger: {facts}")
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, load average {load[0]:.1f} before, "
          f"{load_after[0]:.1f} after; python {platform.python_version()}")
    for label, fig in base.items():
        print(f"{label:28s} wall {fig['wall_s'] * 1000:7.0f} ms   cpu {fig['cpu_s'] * 1000:6.0f} ms")
    print(f"{'command':28s} {'cold wall':>10s} {'cold cpu':>9s} {'warm wall':>10s} {'warm cpu':>9s} {'exit':>5s}")
    for row in rows:
        print(f"{row['command']:28s} {row['cold_wall_s'] * 1000:8.0f}ms {row['cold_cpu_s'] * 1000:7.0f}ms "
              f"{row['warm_wall_s'] * 1000:8.0f}ms {row['warm_cpu_s'] * 1000:7.0f}ms {row['exit_code']:5d}")
    if growth:
        print(f"git per run at this size: {growth}")
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "machine": platform.node(),
                                         "cpus": os.cpu_count(), "load": [load, load_after], "ledger": facts,
                                         "startup": base, "commands": rows, "git_growth": growth}, indent=2) + "\n")


if __name__ == "__main__":
    main()
