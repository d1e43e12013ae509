"""`make demo` end to end: scripts/demo.sh in a temp workspace, then the record it leaves.

One slow test (it trains real drafters on the CPU and starts vLLM): the demo must run the
EAGLE-3 example plan along a path its transitions allow, write the measured numbers into the
plan's results tables, record a milestone in the notes, and commit each run as one git commit.
Running it a second time must say it resumes, and run nothing new.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from helpers import git

from runbook.model import Plan, RunRecord
from runbook.plan.parse import load_plan

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "scripts" / "demo.sh"
PLAN = "plans/eagle3-game-plan.md"
NOTES = "plans/eagle3-next-steps.md"
MILESTONE = "Demo: the plan ran to its end"



def test_example_template_is_the_plan() -> None:
    """`runbook init --example eagle3` copies templates/examples/eagle3/: it must be plans/eagle3-*."""
    for name in ("eagle3-game-plan.md", "eagle3-next-steps.md"):
        shipped = REPO / "templates" / "examples" / "eagle3" / name
        assert shipped.read_bytes() == (REPO / "plans" / name).read_bytes(), f"copy plans/{name} to {shipped}"


def test_plan_routes_on_acceptance_and_shows_the_rest() -> None:
    """Phase 0 judges the old drafter's acceptance only: cosine similarity does not discriminate (issue 50)
    and a low vocabulary coverage calls for a new vocabulary (Phase 0b), so both are columns. Phase 2
    scales the data in a sweep picked on held-out acceptance, and its chosen drafter is Phase 3's input;
    Phase 3 shows the k the Leviathan bound favours (eagle bench's best_k) beside the acceptance."""
    plan = load_plan(REPO / PLAN)
    phase0, phase2, phase3 = plan.find_phase("phase-0"), plan.find_phase("phase-2"), plan.find_phase("phase-3")
    assert phase0 is not None and phase0.criterion is not None and phase2 is not None and phase3 is not None
    assert phase0.criterion.text.strip("`") == "accept_len >= 1.15"
    assert phase0.columns == ["cos_sim_l4", "vocab_coverage"]
    assert (phase2.sweep, phase2.pick, phase2.outputs) == (["n_prompts=100,200"], "best:accept_len", ["{draft_big}"])
    assert any("--limit {n_prompts}" in step.command for step in phase2.steps)
    assert phase2.on_pass == "Phase 3" and phase3.inputs == ["{draft_big}"]
    assert {"best_k", "best_k_bound"} <= set(phase3.columns)
    assert "`-k <best_k>`" in phase3.goal
    # Phase P, first of a real project (Phase S deleted): a drafter already published for the successor,
    # measured as our own are; it ends the plan when it passes, else Phase 0. Nothing leads to it at toy scale.
    published, setup = plan.find_phase("published"), plan.find_phase("setup")
    assert published is not None and setup is not None and published.criterion is not None
    assert plan.phases.index(published) == plan.phases.index(setup) + 1 and setup.on_pass == "Phase 0"
    assert published.criterion.text.strip("`") == "accept_len >= 1.75 and greedy_match == 1"
    assert (published.on_pass, published.on_fail) == ("stop", "Phase 0")
    assert any(step.command.startswith("eagle evaluate --model {target} --draft {published_draft} --prompts {heldout}")
               for step in published.steps)


def run_demo(workspace: Path, home: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    # A HOME without a git identity: the demo must set one in its workspace (as on bare CI machines).
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    # The toy targets of Phase S and 0 (`eagle toy-target`) come from this machine's toy cache, where
    # the toy_target / toy_successor fixtures keep the very same toys (eagle/toy.py from_cache).
    from eagle.toy import cache_root

    env.update(DEMO_DIR=str(workspace), HOME=str(home), GIT_CONFIG_NOSYSTEM="1", EAGLE_CACHE=str(cache_root()))
    start = time.monotonic()
    done = subprocess.run(["bash", str(DEMO)], env=env, capture_output=True, text=True, timeout=20 * 60)
    return done, time.monotonic() - start


def load_runs(workspace: Path) -> list[RunRecord]:
    files = (workspace / "state" / "runs").glob("*.json")
    # in the order they started (two run ids of one second sort by their random suffix)
    return sorted((RunRecord.model_validate_json(f.read_text()) for f in files), key=lambda r: (r.started, r.run_id))


def next_phase(plan: Plan, run: RunRecord) -> str | None:
    """Where the plan goes after this judged run: a phase id, or None for stop / the end."""
    phase = plan.find_phase(run.phase)
    assert phase is not None
    if run.verdict == "pass":
        if phase.on_pass is None:
            index = plan.phases.index(phase)
            return plan.phases[index + 1].id if index + 1 < len(plan.phases) else None
        ref = phase.on_pass
    else:
        ref = phase.on_fail or "stop"
    if ref.strip().lower() == "stop":
        return None
    target = plan.find_phase(ref)
    assert target is not None, ref
    return target.id


def results_rows(plan: Plan, phase_id: str) -> tuple[list[str], dict[str, list[str]]]:
    """The results table of a phase: its header and its rows by run id."""
    phase = plan.find_phase(phase_id)
    assert phase is not None and "results" in phase.blocks, f"{phase_id} has no results table"
    lines = [line.strip() for line in phase.blocks["results"].inner.splitlines() if line.strip().startswith("|")]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    header, rows = cells[0], cells[2:]
    assert all(set(cell) <= set("-") for cell in cells[1]), lines[1]
    return header, {row[0]: row for row in rows}


@pytest.mark.slow
def test_demo_runs_the_plan_records_and_commits(tmp_path: Path) -> None:
    workspace, home = tmp_path / "demo", tmp_path / "home"
    home.mkdir()
    done, took = run_demo(workspace, home)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "starting over: a fresh workspace" in out
    for shown in ("==> runbook status", "==> runbook brief", "==> git log --oneline", "demo finished in"):
        assert shown in out, shown
    # How long it took is reported, not asserted (speed targets live in benchmarks, not tests).
    print(f"demo took {took:.0f} s")

    plan = load_plan(workspace / PLAN)
    records = load_runs(workspace)
    runs = [run for run in records if run.trial is None]  # the phases' runs; a sweep's trials decide nothing
    trials = [run for run in records if run.trial is not None]
    assert runs, "no run records in state/runs/"

    # Every phase on the taken path reached a verdict, and the path is the one the plan's
    # transitions give: Phase S, the probe, then the vocabulary question and one of the two
    # fine-tunes (or the fallback from scratch), then Phase 2 (a sweep: its pick decides) and Phase 3.
    expected: str | None = plan.phases[0].id
    for run in runs:
        assert run.phase == expected, [r.phase for r in runs]
        assert run.verdict in ("pass", "fail"), f"{run.phase}: {run.verdict} ({run.reason})"
        expected = next_phase(plan, run)
    assert expected is None, f"the plan did not run to its end: {expected} is next"
    path = [run.phase for run in runs]
    assert path[:2] == ["setup", "phase-0"] and path[-2:] == ["phase-2", "phase-3"], path
    assert path[2] in ("phase-0b", "fallback"), path
    if path[2] == "phase-0b":
        assert path[3] in ("phase-1", "phase-1b") and len(path) == 6, path
    print(f"route: {' -> '.join(path)}")

    # Phase 2 ran as its sweep: one trial per data size, the one with the best held-out acceptance
    # picked (its record, a copy naming the trial, is Phase 2's run), and Phase 3 benchmarked its drafter
    chose = runs[-2]
    assert chose.decision is not None and chose.decision.by == "pick"
    assert [t.trial.point for t in trials if t.trial] == [{"n_prompts": "100"}, {"n_prompts": "200"}]
    assert [t.metrics["prepare_samples"] for t in trials] == [100, 200]
    best = max(trials, key=lambda t: t.metrics["accept_len"])
    assert chose.decision.run == best.run_id and chose.metrics == best.metrics
    assert chose.decision.why.startswith("best:accept_len: max accept_len")
    print("data sweep: " + ", ".join(f"{t.metrics['accept_len']:.3f} at {t.trial.point['n_prompts']}"
                                     for t in trials if t.trial) + f"; picked {best.trial.point if best.trial else ''}")

    for run in runs + trials:
        phase = plan.find_phase(run.phase)
        assert phase is not None and phase.status is not None
        if run.trial is None:
            assert phase.status.verdict == run.verdict and phase.status.run_id == run.run_id
        assert all(step.done for step in phase.steps), f"{run.phase}: unticked steps"
        # The results table holds the measured numbers: every metric column of the run's row is
        # the run record's value (as written, 6 significant digits).
        header, rows = results_rows(plan, run.phase)
        assert run.run_id in rows, f"{run.phase}: run {run.run_id} not in its results table"
        row = dict(zip(header, rows[run.run_id], strict=True))
        assert row["verdict"].split(" (")[0] == run.verdict
        metric_columns = header[3:-2]
        assert metric_columns, header
        for name in metric_columns:
            if name in run.overrides:  # a var the run set (a sweep's point: n_prompts), as it ran
                assert row[name] == run.vars[name], (name, row[name], run.vars)
                continue
            assert name in run.metrics, f"{run.phase}: column {name} is not a metric of the run"
            assert math.isclose(float(row[name]), run.metrics[name], rel_tol=1e-5), (name, row[name], run.metrics[name])

    # The numbers are real measurements, not placeholders: the probe measured similarity per
    # layer, training and decoding measured acceptance, and vLLM counted its own acceptance.
    by_phase = {run.phase: run.metrics for run in runs}
    assert any(name.startswith("cos_sim_l") for name in by_phase["phase-0"])
    assert {"cos_sim_l4", "vocab_coverage"} <= set(results_rows(plan, "phase-0")[0])  # shown, not judged
    assert {"best_k", "best_k_bound"} <= set(results_rows(plan, "phase-3")[0])
    assert 0.0 < by_phase["phase-0"]["vocab_coverage"] <= 1.0  # the old vocabulary over the new target's outputs
    if "phase-0b" in by_phase:
        assert 0.0 < by_phase["phase-0b"]["vocab_coverage"] <= 1.0
    assert 1.0 <= by_phase["setup"]["accept_len"] <= 4.0 and by_phase["setup"]["greedy_match"] == 1
    assert 1.0 <= by_phase["phase-3"]["vllm_accept_len"] <= 4.0
    assert by_phase["phase-3"]["plain_tok_s"] > 0 and by_phase["phase-3"]["spec_tok_s"] > 0
    # the chosen drafter measured the same acceptance in Phase 3's bench as in its trial's evaluate
    assert math.isclose(by_phase["phase-3"]["accept_len"], best.metrics["accept_len"], rel_tol=1e-9)

    # The notes hold the milestone, attached to the run that chose the drafter (Phase 2's pick).
    notes = (workspace / NOTES).read_text()
    milestones = notes.split("## Milestones", 1)[1].split("\n## ", 1)[0]
    assert re.search(rf"^### \d{{4}}-\d\d-\d\d \d\d:\d\d UTC · {re.escape(MILESTONE)}$", milestones, re.M), milestones
    assert f"Run `{chose.run_id}`" in milestones
    assert "Path taken: Phase S pass -> Phase 0 " in milestones and "-> Phase 2 pass -> Phase 3 pass." in milestones
    # the decision with its reason: route, k, data size (each size's acceptance, the pick) and the
    # acceptance on all held-out prompts
    chosen = re.search(r"Chosen: route S -> 0 -> .* -> 2 -> 3, k = 3 .*, (\d+) training prompts .*Phase 2's sweep "
                       r"measured accept_len (\d\.\d{3}) at 100, (\d\.\d{3}) at 200 prompts on all held-out prompts "
                       r"and picked best:accept_len: max accept_len .*"
                       r"Reason: accept_len \d\.\d{3} on all held-out prompts", milestones, re.S)
    assert chosen, milestones
    assert int(chosen[1]) == best.metrics["prepare_samples"]
    assert [float(chosen[2]), float(chosen[3])] == [round(t.metrics["accept_len"], 3) for t in trials]
    # ... k measured at 3, and the k the Leviathan bound favours at the measured a and c (eagle bench)
    chosen_k = re.search(r"k = 3 measured; the Leviathan bound's best k = (\d+) \(bound (\d+\.\d\d)x at cost ratio "
                         r"c = \d+\.\d{3}, against (\d+\.\d\d)x at k = 3\)", milestones)
    assert chosen_k, milestones
    assert int(chosen_k[1]) == by_phase["phase-3"]["best_k"] and 1 <= int(chosen_k[1]) <= 8
    assert float(chosen_k[2]) >= float(chosen_k[3])  # the best k's bound is never below k = 3's
    assert "Probe before you train" in notes.split("## Lessons learned", 1)[1]
    # ... with the chosen drafter's training curve as a chart (record --plot train_loss: the picked trial's)
    curve = f"plots/{chose.run_id}-train_loss.png"
    assert f"![train_loss by step, run {best.run_id}]({curve})" in milestones
    assert "train_loss" in {s.name for s in best.series}
    from PIL import Image

    with Image.open(workspace / "plans" / curve) as image:
        assert image.format == "PNG" and image.size == (800, 450)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert sum(n for n, rgb in colours if rgb != (255, 255, 255)) > 0.01 * 800 * 450  # not blank

    # Each run is one git commit, holding exactly its run record, its metric series (when its steps
    # wrote any: the runs that trained) and the plan; the sweep's spec one more.
    for run in records:
        record = f"state/runs/{run.run_id}.json"
        commits = git(workspace, "log", "--format=%H", "--", record).split()
        assert len(commits) == 1, f"{record}: {len(commits)} commits"
        files = git(workspace, "show", "--name-only", "--format=", commits[0]).split()
        kept = [f"state/runs/{run.run_id}.series.jsonl"] if run.series else []
        assert sorted(files) == sorted([PLAN, record, *kept]), files
        subject = git(workspace, "log", "-1", "--format=%s", commits[0]).strip()
        assert subject.startswith(f"runbook: {run.phase} {run.verdict}"), subject
    subjects = git(workspace, "log", "--format=%s").splitlines()
    run_subjects = [s for s in subjects if s.startswith("runbook: ")
                    and not s.startswith(("runbook: record ", "runbook: plan edits", "runbook: sweep "))]
    assert len(run_subjects) == len(records), subjects
    assert sum(s.startswith("runbook: sweep ") and s.endswith("of phase-2 (2 points)") for s in subjects) == 1
    assert subjects[0].startswith(f"runbook: record {MILESTONE}")
    assert git(workspace, "status", "--porcelain", "--untracked-files=no").strip() == ""

    # Again: it says it resumes, runs nothing new, and still ends with the handoff.
    again, _ = run_demo(workspace, home)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-4000:]
    assert f"{workspace} exists: resuming its plan (rm -rf {workspace} to start over)" in out
    assert len(load_runs(workspace)) == len(records)
    assert "==> runbook brief" in out and "runbook next exited 0 after 0 run(s)" in out


@pytest.mark.slow
def test_plan_rechooses_the_vocabulary_when_the_data_grows(toy_data: Path) -> None:
    """Phase 2 trains on three times the data: it chooses the draft vocabulary again on that data (not
    `--from-draft`, which keeps the 64-conversation one), and a vocabulary chosen on more conversations
    covers more of held-out answers (the toy's shared data dir: 24 conversations against 4, the last 8 held out)."""
    from eagle.data import hidden_io, vocab

    plan = load_plan(REPO / PLAN)
    phase = plan.find_phase("Phase 2")
    assert phase is not None
    vocab_steps = [s.command for s in phase.steps if "eagle vocab" in s.command]
    assert len(vocab_steps) == 1 and "--data {data_big}" in vocab_steps[0], vocab_steps
    assert "--draft-vocab 256" in vocab_steps[0] and "--from-draft" not in vocab_steps[0], vocab_steps

    rows = []
    for index in hidden_io.list_samples(toy_data):
        sample = hidden_io.load_sample(toy_data, index)
        rows.append((sample["input_ids"], sample["loss_mask"]))
    held = vocab.count_tokens(rows[-8:], 2048)

    def coverage(train_rows: int) -> float:
        chosen = vocab.choose_top(vocab.count_tokens(rows[:train_rows], 2048), 256)
        return float(held[chosen].sum()) / float(held.sum())

    small, big = coverage(4), coverage(24)
    assert big > small and big > 0.95, (small, big)  # measured: 0.17 -> 0.98
