#!/usr/bin/env bash
# `make demo`: the EAGLE-3 example plan, end to end, in its own workspace.
#
#   1. sets up .venv if needed (scripts/setup.sh);
#   2. makes a fresh workspace ($DEMO_DIR, default ./demo: its own git repo, made by
#      `runbook init --example eagle3`), or resumes the one that is there;
#   3. runs the plan: `runbook next --until-stop --yes` (every step's output is shown as it runs);
#   4. records a milestone in the notes (`runbook record ... --run RUN --plot train_loss`, RUN the
#      pick of Phase 2's sweep: with the chosen drafter's training curve as a chart);
#   5. prints `runbook status`, `runbook brief` and `git log --oneline`.
#
# Run it again to resume where it stopped; `rm -rf demo` to start over.
# Exit status: that of `runbook next` (0: the plan ran to its end), or of the first failing command.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
DEMO_DIR="${DEMO_DIR:-$REPO/demo}"
PLAN=plans/eagle3-game-plan.md
BIN="$REPO/.venv/bin"
START=$(date +%s)

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
elapsed() { local s=$(($(date +%s) - START)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

if [ ! -x "$BIN/runbook" ] || [ ! -x "$BIN/eagle" ]; then
    say "setting up .venv first (scripts/setup.sh)"
    bash "$REPO/scripts/setup.sh"
fi
export PATH="$BIN:$PATH"
# Quiet, offline libraries: the demo makes its own tiny models and never needs the network.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_NO_USAGE_STATS=1
# The toy models are tiny: one thread per process beats two threads fighting over shared cores
# (training measured 3-4x faster this way on a busy 2-core machine). Override by exporting it.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# vLLM's cache kept between the plan's server starts (eagle serve-bench starts two): each start then skips
# vLLM's model inspection in a subprocess. Override by exporting it.
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$DEMO_DIR/work/vllm-cache}"

if [ -f "$DEMO_DIR/$PLAN" ]; then
    say "$DEMO_DIR exists: resuming its plan (rm -rf $DEMO_DIR to start over)"
    cd "$DEMO_DIR"
else
    if [ -e "$DEMO_DIR" ] && [ -n "$(ls -A "$DEMO_DIR" 2>/dev/null)" ]; then
        echo "demo: $DEMO_DIR exists but holds no $PLAN; move it away or set DEMO_DIR" >&2
        exit 2
    fi
    say "starting over: a fresh workspace in $DEMO_DIR (runbook init --example eagle3)"
    mkdir -p "$DEMO_DIR"
    # Its own repository, even inside this one (demo/ is gitignored here).
    git -C "$DEMO_DIR" init -q
    runbook init "$DEMO_DIR" --example eagle3
    cd "$DEMO_DIR"
    printf '# eagle artifacts: targets, data, drafters (rebuilt by the plan)\nwork/\n' >> .gitignore
fi

# Runs are commits: give the workspace a git identity when the machine has none (CI often has none).
git config user.name >/dev/null || git config user.name "runbook demo"
git config user.email >/dev/null || git config user.email "demo@runbook.invalid"
if ! git rev-parse -q --verify HEAD >/dev/null; then
    git add -A
    git commit -q -m "runbook init --example eagle3"
fi

runbook validate "$PLAN"
say "the plan: runbook status"
runbook status --plan "$PLAN"

say "running the plan: runbook next --until-stop --yes  ($(elapsed) so far; about 8 min on 2 CPU cores)"
runs_before=$(find state/runs -maxdepth 1 -name '*.json' | wc -l)
set +e
runbook next --plan "$PLAN" --until-stop --yes
rc=$?
set -e
runs_after=$(find state/runs -maxdepth 1 -name '*.json' | wc -l)
say "runbook next exited $rc after $((runs_after - runs_before)) run(s) ($(elapsed) so far)"

if [ "$runs_after" -gt "$runs_before" ] && { [ "$rc" -eq 0 ] || [ "$rc" -eq 1 ]; }; then
    say "recording the milestone: runbook record ... --run <Phase 2's pick>"
    # line 1: the run the milestone is attached to (Phase 2's pick, else the last run); then the body
    out=$(python - <<'PY'
import json, pathlib
# in the order they started (two run ids of one second sort by their random suffix)
records = sorted((json.loads(p.read_text()) for p in pathlib.Path("state/runs").glob("*.json")),
                 key=lambda r: (r["started"], r["run_id"]))
runs = [r for r in records if not r.get("trial")]  # a sweep's trials decide nothing; the pick does
picked = next((r for r in reversed(runs) if r.get("decision") and r["decision"].get("sweep")), None)
print(picked["run_id"] if picked is not None else "last")
print("Path taken: " + " -> ".join(f"Phase {r['phase_label']} {r['verdict']}" for r in runs) + ".")
last = runs[-1]["metrics"]
if "accept_len" in last:
    # the decision the run supports, with the numbers it rests on (all held-out prompts, k = 3
    # measured; the k the Leviathan bound favours at the measured acceptance and cost ratio; the
    # data size Phase 2's sweep picked, with the acceptance of each size it tried)
    route = " -> ".join(r["phase_label"] for r in runs)
    k = (f"k = 3 measured; the Leviathan bound's best k = {int(last['best_k'])} (bound {last['best_k_bound']:.2f}x "
         f"at cost ratio c = {last['cost_ratio']:.3f}, against {last['leviathan_bound']:.2f}x at k = 3)"
         if "best_k" in last else "k = 3 measured (no bench ran: no best k)")
    data = ""
    if picked is not None:
        sweep = picked["decision"]["sweep"]
        tried = sorted((r for r in records if (r.get("trial") or {}).get("sweep") == sweep),
                       key=lambda r: r["trial"]["index"])
        sizes = ", ".join(f"{t['metrics']['accept_len']:.3f} at {t['trial']['point'].get('n_prompts', '?')}"
                          for t in tried if "accept_len" in t["metrics"])
        data = (f", {int(picked['metrics'].get('prepare_samples', 0))} training prompts with the draft vocabulary "
                f"re-chosen on them (coverage {picked['metrics'].get('vocab_coverage', 0):.3f}): Phase 2's sweep "
                f"measured accept_len {sizes} prompts on all held-out prompts and picked {picked['decision']['why']}")
    print(f"\nChosen: route {route}, {k}{data}. "
          f"Reason: accept_len {last['accept_len']:.3f} on all held-out prompts"
          + (f", {last['vllm_accept_len']:.3f} served by vLLM" if "vllm_accept_len" in last else "") + ".")
PY
)
    # attached to the run that chose the drafter (Phase 2's pick; else the last run), and --plot
    # train_loss: the chosen drafter's training curve (what `eagle train` appended to $RUNBOOK_SERIES
    # in the trial the pick chose) as a chart in the milestone, committed with the notes
    chosen=${out%%$'\n'*}
    path=${out#*$'\n'}
    echo "$path" | runbook record "Demo: the plan ran to its end" --plan "$PLAN" --run "$chosen" --body - --plot train_loss \
        --lesson "Probe before you train: \`eagle probe\` tells in minutes whether the old drafter carries over to the new target (fine-tune) or not (train from scratch), and its \`vocab_coverage\` whether its draft vocabulary does (keep it, or fine-tune with a new one)." \
        --next "Point the plan's vars at a real model (README: With a real model on a GPU server) and run \`runbook next --phase 0 --yes\`." \
        --next "Scale the data up further: add sizes to Phase 2's \`Sweep: n_prompts=...\` while the largest still wins."
fi

say "runbook status"
runbook status --plan "$PLAN"
say "runbook brief"
runbook brief --plan "$PLAN"
say "git log --oneline"
git --no-pager log --oneline
say "demo finished in $(elapsed): the plan with its results is $DEMO_DIR/$PLAN"
exit "$rc"
