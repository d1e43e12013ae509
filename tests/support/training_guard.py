"""`make test-fast` never trains a model or starts vLLM: the check behind that promise.

While a test not marked `slow` runs, conftest.py sets $RUNBOOK_TEST_GUARD to a file of its own. In
that test's process and in every Python process it starts (tests/support/site/sitecustomize.py installs
this module there, through PYTHONPATH: `eagle` commands, `runbook next` steps, their children),
these imports and calls append a line to that file:

- more than `MAX_STEPS` optimizer steps of the drafter (eagle/train/steps.py `optimizer_step`, which the Trainer calls through that module) in one process
  during one test;
- training a toy target for more than `MAX_STEPS` steps (eagle/toy.py `train`);
- starting vLLM (importing its engine or its OpenAI server).

conftest.py fails the test when the file is not empty, naming what happened. A few steps are
allowed: tests of the training code's mechanics on a tiny synthetic drafter take two or three.
Nothing here imports torch, eagle or vllm: it only watches them being imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

ENV = "RUNBOOK_TEST_GUARD"
MAX_STEPS = 20
VLLM_ENGINES = ("vllm.entrypoints.openai", "vllm.v1.engine", "vllm.engine")


def record(what: str) -> None:
    """Note `what` in the guard file of the test now running (none: not under a fast test)."""
    path = os.environ.get(ENV)
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{what} (pid {os.getpid()}: {' '.join(sys.argv)[:200]})\n")


def _count_steps(fn: Callable[..., Any]) -> Callable[..., Any]:
    # Counted per test: pytest runs many tests in one process, each with a guard file of its own.
    seen: dict[str, Any] = {"guard": None, "steps": 0}

    def optimizer_step(*args: Any, **kwargs: Any) -> Any:
        guard = os.environ.get(ENV)
        if guard != seen["guard"]:
            seen.update(guard=guard, steps=0)
        seen["steps"] += 1
        if seen["steps"] == MAX_STEPS + 1:
            record(f"trained a drafter past {MAX_STEPS} optimizer steps")
        return fn(*args, **kwargs)

    return optimizer_step


def _toy_train(fn: Callable[..., Any]) -> Callable[..., Any]:
    def train(*args: Any, **kwargs: Any) -> Any:
        steps = kwargs.get("steps", args[5] if len(args) > 5 else 0)
        if steps and steps > MAX_STEPS:
            record(f"trained a toy target for {steps} steps")
        return fn(*args, **kwargs)

    return train


def _patch(module: ModuleType) -> None:
    if module.__name__ == "eagle.train.steps" and hasattr(module, "optimizer_step"):
        module.optimizer_step = _count_steps(module.optimizer_step)
    elif module.__name__ == "eagle.toy" and hasattr(module, "train"):
        module.train = _toy_train(module.train)


class _Watch(importlib.abc.MetaPathFinder):
    """Patches eagle.train.steps / eagle.toy once they are loaded; notes vLLM's engine being imported."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name in VLLM_ENGINES:
            record(f"started vLLM (imported {name})")
        if name not in ("eagle.train.steps", "eagle.toy"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Watch this process (idempotent); modules already loaded are patched now."""
    if any(isinstance(f, _Watch) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Watch())
    for name in ("eagle.train.steps", "eagle.toy"):
        if name in sys.modules:
            _patch(sys.modules[name])
