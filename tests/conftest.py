"""Shared fixtures: the cached toy targets, their data and trained drafters; and the guard that keeps
`make test-fast` (tests not marked slow) from training a model or starting vLLM.

`toy_target` and `toy_successor` are built once per machine (under $EAGLE_CACHE or
~/.cache/runbook-eagle, keyed by a hash of the toy config and TOY_VERSION) and reused by every
test session; concurrent pytest processes wait for one builder instead of racing. Tests must
treat the returned directories as read-only.

A test that uses a fixture of `TRAINS` must be marked slow (checked at collection); a fast test
that trains past a few steps or starts vLLM anyway, in its own process or in one it starts, fails
(tests/support/training_guard.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import training_guard
from helpers import Counts

from eagle.common import collect_less

# The workers import torch, transformers and vLLM and run eagle's commands in process: they collect with
# the thresholds eagle's own processes start with (eagle.common.collect_less), from the start rather than
# from the first in-process command on (the three workers spent 18 s of CPU in the collector, 2026-12-05).
collect_less()

REPO = Path(__file__).resolve().parents[1]
PROMPTS = REPO / "plans" / "data" / "prompts.jsonl"
HELDOUT = REPO / "plans" / "data" / "prompts-heldout.jsonl"
SITE = Path(training_guard.__file__).resolve().parent / "site"  # sitecustomize.py: the guard in child processes
# Fixtures that train a model (on a machine where nothing is cached yet) or start vLLM.
TRAINS = {"toy_target", "toy_successor", "toy_data", "toy_drafter", "toy_drafter_normed", "arch_targets"}
# The longest modules, started first so that no worker is left with one of them at the end
# (`make test` passes --no-loadscope-reorder so pytest-xdist keeps this order instead of putting the
# modules with the most tests first). Longest first, by each module's wall time under `make test` on the
# 2-core machine (2026-12-04, fifth session: the demo 281 s, vLLM's engines 181 s and serving 180 s,
# Slurm 99 s, the architectures end to end 91 s, ... down to about 15 s); the rest keep pytest's order.
# Except the modules that mostly wait (Slurm's time limit: 81 s of its 99; the kill -9 tests' random
# moments; MCP's 20 s phase): three workers share two cores, so one worker waiting costs nothing while
# the other two compute, but two waiting at once leave a core idle. Queued side by side, they waited
# together (45 core-seconds idle around 240-300 s in each of two runs, 2026-12-05); now Slurm runs first,
# beside the demo and the vLLM engines, and the kill -9 tests come three computing modules after MCP's.
FIRST = ["test_slurm.py", "test_demo.py", "test_engines.py", "test_serve.py", "test_arch_e2e.py",
         "test_train_from_server.py", "test_mcp_server.py", "test_triton_attention.py", "test_prepare_vllm.py",
         "test_k2_drafters.py", "test_crash_safety.py", "test_fuzz_special_files.py", "test_mla_drafters.py",
         "test_training_guard.py", "test_drafter_serving.py", "test_published_phase.py", "test_ddp.py",
         "test_hostile_inputs.py", "test_extract_shard.py", "test_fuzz_inputs.py", "test_lock_takeover.py",
         "test_json_contract.py", "test_step_graph.py", "test_eagle_bad_inputs.py", "test_setup.py",
         "test_drafter_layouts.py",
         # then the modules of 11-20 s (2026-12-05), waiting ones between computing ones, so that the last
         # to run are short and the three workers end together (one ran on alone for 15 s before)
         "test_shell_safety.py", "test_git_hygiene.py", "test_series.py", "test_detach.py", "test_eagle_logging.py",
         "test_commits_hold_one_change.py", "test_train.py", "test_fuzz_parse.py", "test_hidden_capture.py",
         "test_k2_train_cli.py", "test_sweep.py", "test_ledger_index.py"]


# Training steps of arch_targets' toys where the default (300) is more than tests/e2e/test_arch_e2e.py's
# acceptance checks need: Qwen3 at 120 gives held-out accept_len 2.72 (> 1.8 asserted) and its vLLM
# equality holds (2026-12-02, 2-core machine). DeepSeek-V3 (and Kimi-K2.5, its wrapper) keep 300: at
# 120 and 180 steps its accept_len was 1.84 and 1.81, too close to the 1.8 asserted (3.0 at 300).
ARCH_TOY_STEPS = {"qwen3": 120}


def pytest_configure(config: pytest.Config) -> None:
    training_guard.install()
    # The toy models are tiny: one thread per process beats threads fighting over shared cores
    # (the demo does the same); and test processes run three at a time under `make test`.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Every vLLM server a test starts shares vLLM's cache (eagle/serving/server.py KEPT_CACHES): its
    # model-inspection results, which otherwise cost each start a vllm import in a subprocess (~13 s of CPU).
    from eagle.toy import cache_root

    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_root() / "vllm"))


def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every process of this test session shares: the base temp dir, or with pytest-xdist
    the folder above its workers' own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """`session_dir/name`, made by `build(path)` once per test session, whichever process asks first
    (the others wait on a lock, then read it); a half-made one from a failed build is made again."""
    path = session_dir(tmp_path_factory) / "built-once" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    done = path.with_name(f"{path.name}.done")
    with open(path.with_name(f"{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            build(path)
            done.touch()
    return path


def _fast(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is None and item.get_closest_marker("gpu") is None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse fast tests that use a training fixture; run the longest modules first (`FIRST`; the
    rest keep their order); `gpu` tests run only where torch sees a CUDA device (torch is imported
    only if some are collected)."""
    items.sort(key=lambda item: FIRST.index(item.path.name) if item.path.name in FIRST else len(FIRST))  # stable
    offenders = [f"{item.nodeid} uses {', '.join(sorted(TRAINS & set(item.fixturenames)))}"
                 for item in items if _fast(item) and TRAINS & set(getattr(item, "fixturenames", ()))]
    if offenders:
        raise pytest.UsageError("tests that train a model must be marked @pytest.mark.slow "
                                "(make test-fast leaves them out):\n  " + "\n  ".join(offenders))
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device (make test-gpu on a GPU host)")
        for item in gpu:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fast_tests_do_not_train(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                             monkeypatch: pytest.MonkeyPatch):
    """A fast test (not slow, not gpu) that trains or starts vLLM, here or in a child, fails."""
    if not _fast(request.node):
        yield
        return
    folder = tmp_path_factory.getbasetemp() / "training-guard"
    folder.mkdir(exist_ok=True)
    guard = folder / f"{hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:16]}.log"
    guard.unlink(missing_ok=True)
    monkeypatch.setenv(training_guard.ENV, str(guard))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(SITE), os.environ.get("PYTHONPATH")) if p))
    yield
    found = guard.read_text().strip() if guard.exists() else ""
    if found:
        pytest.fail(f"a test not marked slow trains a model or starts vLLM; mark it @pytest.mark.slow:\n{found}")


@pytest.fixture(scope="session")
def counts(tmp_path_factory: pytest.TempPathFactory) -> Counts:
    """The reliability counters of this session (helpers.Counts)."""
    return Counts(session_dir(tmp_path_factory) / "reliability-counts.json")


@pytest.fixture(scope="session")
def toy_target() -> Path:
    """The default toy target (8 layers, hidden 128, vocab 2048, 300 steps, seed 0)."""
    from eagle.toy import cached_target

    return cached_target()


@pytest.fixture(scope="session")
def toy_successor(toy_target: Path) -> Path:
    """The successor of `toy_target`: same architecture and tokenizer, trained on a shifted language."""
    from eagle.toy import cached_target

    return cached_target(successor=True)


@pytest.fixture(scope="session")
def toy_data(toy_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared + extracted data dir: 32 regenerated prompts of plans/data/prompts.jsonl,
    default layer ids, hidden states on disk, vocab of 256. Read-only for tests."""
    from eagle.data.extract import extract
    from eagle.data.prepare import prepare
    from eagle.data.vocab import build_vocab

    def build(out: Path) -> None:
        prepare(model=toy_target, data=PROMPTS, out=out, limit=32, regenerate=True, max_new_tokens=48, batch_size=32,
                echo=False)
        extract(model=toy_target, data=out)
        build_vocab(data=out, draft_vocab=256)

    return built_once(tmp_path_factory, "toy-data/data", build)


@pytest.fixture(scope="session")
def plan_states(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The plan states of docs/next.md's table (tests/support/plan_states.py), each a git repo built with
    real `runbook next` runs, `running` aside. Read-only: copy one (plan_states.py `copy`) to change it."""
    import plan_states as states

    names = [name for name in states.STATES if name != "running"]
    return {name: built_once(tmp_path_factory, f"plan-states/{name}", lambda path, n=name: states.build(n, path))
            for name in names}


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A real single-node Slurm cluster of this test session (tests/support/slurm_cluster.py): installed with
    apt-get when missing, started in a private directory, stopped by its pid files at the end.
    Skips, with the reason, only where Slurm cannot be installed."""
    import slurm_cluster as helper
    why = helper.ensure_installed()
    if why is not None:
        pytest.skip(why)
    cluster = helper.Cluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def toy_drafter(toy_target: Path, toy_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A drafter trained by the `eagle train` command with its defaults on `toy_data` (bf16, no
    embedding, as the command writes it; ~10 s on the CPU). Read-only for tests (test_serve.py
    serves it, test_probe.py and test_drafter_layouts.py read it)."""
    import subprocess
    import sys

    def build(out: Path) -> None:
        proc = subprocess.run([sys.executable, "-m", "eagle.cli", "train", "--model", str(toy_target), "--data",
                               str(toy_data), "--out", str(out)], capture_output=True, text=True, timeout=1500,
                              cwd=REPO)  # the defaults
        assert proc.returncode == 0, proc.stderr[-3000:]

    return built_once(tmp_path_factory, "toy-drafter/draft", build)


@pytest.fixture(scope="session")
def toy_drafter_normed(toy_target: Path, toy_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`toy_drafter` trained with speculators 0.9's default norm flags (norm_before_fc with its
    input_norm, norm_output, norm_before_residual). Read-only for tests."""
    from eagle.train.config import TrainConfig
    from eagle.train.trainer import train

    return built_once(tmp_path_factory, "toy-drafter-normed/draft", lambda out: train(
        TrainConfig(model=str(toy_target), data=str(toy_data), out=str(out), norm_before_fc=True, norm_output=True,
                    norm_before_residual=True), echo=False))


@pytest.fixture(scope="session")
def arch_targets():
    """`arch_targets(arch)`: the toy target of an architecture (llama, qwen3, deepseek_v3, kimi_k25),
    trained once per machine like `toy_target` (kimi_k25 wraps the deepseek_v3 one: no training), for
    ARCH_TOY_STEPS[arch] steps where given (on a machine with no cached toy, their training is most of
    test_arch_e2e.py's time: the DeepSeek-V3 toy 165 s on 2 cores, its whole chain 7 s)."""
    from eagle.toy import ToyConfig, cached_target

    def target(arch: str) -> Path:
        steps = ARCH_TOY_STEPS.get(arch)
        return cached_target(ToyConfig(arch=arch) if steps is None else ToyConfig(arch=arch, steps=steps))

    return target
