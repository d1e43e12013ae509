"""The guard behind `make test-fast` (tests/support/training_guard.py) notices what it promises to notice:
a drafter trained past a few optimizer steps or vLLM started, in the test's process or in a child
that only inherits the environment, and stays silent for a few steps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import training_guard

SITE = Path(training_guard.__file__).resolve().parent / "site"
STEPS = """
import torch
from eagle.train.steps import optimizer_step
w = torch.nn.Parameter(torch.zeros(2))
opt = torch.optim.SGD([w], lr=0.1)
for _ in range({n}):
    w.sum().backward()
    optimizer_step(opt, None, [w])
"""


def _child(code: str, guard: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, training_guard.ENV: str(guard), "PYTHONPATH": str(SITE), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_a_child_process_training_past_the_limit_is_noticed(tmp_path: Path) -> None:
    few, many = tmp_path / "few.log", tmp_path / "many.log"
    assert _child(STEPS.format(n=training_guard.MAX_STEPS), few).returncode == 0
    done = _child(STEPS.format(n=training_guard.MAX_STEPS + 5), many)
    assert done.returncode == 0, done.stderr
    assert not few.exists()  # a few steps of a test of the training code's mechanics are allowed
    assert "trained a drafter past 20 optimizer steps" in many.read_text()


def test_in_process_training_and_a_vllm_engine_are_noticed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from eagle.train import steps as train

    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([w], lr=0.1)
    for test in ("one", "two"):  # steps are counted per test: two tests of a few steps each pass
        monkeypatch.setenv(training_guard.ENV, str(tmp_path / f"{test}.log"))
        for _ in range(training_guard.MAX_STEPS):
            w.sum().backward()
            train.optimizer_step(opt, None, [w])
    assert not list(tmp_path.glob("*.log"))
    guard = tmp_path / "guard.log"
    monkeypatch.setenv(training_guard.ENV, str(guard))
    for _ in range(training_guard.MAX_STEPS + 1):
        w.sum().backward()
        train.optimizer_step(opt, None, [w])
    assert "trained a drafter" in guard.read_text()
    guard.unlink()
    training_guard._Watch().find_spec("vllm.entrypoints.openai", None)  # what `import vllm...api_server` asks
    assert "started vLLM" in guard.read_text()


def test_a_toy_target_trained_for_many_steps_is_noticed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eagle import toy

    assert "_toy_train" in toy.train.__qualname__  # the guard wrapped the real one when eagle.toy was imported
    guard = tmp_path / "guard.log"
    monkeypatch.setenv(training_guard.ENV, str(guard))
    calls = []
    monkeypatch.setattr(toy, "train", training_guard._toy_train(lambda *a, **k: calls.append(k["steps"])))
    toy.train(None, None, None, None, seed=0, steps=5)
    assert calls == [5] and not guard.exists()
    toy.train(None, None, None, None, seed=0, steps=300)
    assert calls == [5, 300] and "trained a toy target for 300 steps" in guard.read_text()


PROBE = '''
import subprocess, sys

import pytest

STEPS = {steps!r}


def test_fast_in_process():
    exec(STEPS)


def test_fast_in_a_child():
    subprocess.run([sys.executable, "-c", STEPS], check=True)


def test_fast_and_small():
    exec(STEPS.replace("range(25)", "range(3)"))


@pytest.mark.slow
def test_slow_may_train():
    exec(STEPS)
    subprocess.run([sys.executable, "-c", STEPS], check=True)
'''


def test_conftest_fails_the_fast_tests_that_train_and_passes_the_rest(tmp_path: Path) -> None:
    """A pytest session with this conftest: the two fast tests that train 25 steps (one in its own
    process, one in a child) fail, naming the guard; a fast test of 3 steps and a slow one pass."""
    here = Path(__file__).resolve().parent
    tests = tmp_path / "tests"
    (tests / "site").mkdir(parents=True)
    for name in ("conftest.py", "helpers.py", "training_guard.py", "site/sitecustomize.py"):
        source = here / name if name == "conftest.py" else here / "support" / name
        (tests / name).write_text(source.read_text())
    (tests / "test_probe.py").write_text(PROBE.format(steps=STEPS.format(n=25)))
    env = {k: v for k, v in os.environ.items() if k not in (training_guard.ENV, "PYTHONPATH")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-W", "ignore::pytest.PytestUnknownMarkWarning", "--rootdir", str(tmp_path), str(tests)],
                          cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "ERROR tests/test_probe.py::test_fast_in_process - Failed" in out
    assert "ERROR tests/test_probe.py::test_fast_in_a_child - Failed" in out
    # counted in the failures' own "E   " lines: the short summary repeats the message only where pytest
    # does not truncate it (CI=1, a wide terminal), which is how these counts once differed on CI
    failure_lines = "\n".join(line for line in out.splitlines() if line.startswith("E "))
    assert failure_lines.count("Failed: a test not marked slow trains a model or starts vLLM; mark it @pytest.mark.slow") == 2, out
    assert failure_lines.count("trained a drafter past 20 optimizer steps (pid") == 2, out
    assert "4 passed, 2 errors" in out, out
