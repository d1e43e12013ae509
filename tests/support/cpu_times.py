"""Opt-in pytest plugin: the CPU time of each test (this process and the children it waited for),
written as JSON lines to $RUNBOOK_CPU_TIMES, for docs/benchmarks.md's per-lane figures:

    RUNBOOK_CPU_TIMES=/tmp/cpu.jsonl .venv/bin/python -m pytest -p cpu_times ...

Each line: {"nodeid", "worker", "wall_s", "cpu_s", "end"} (setup, call and teardown together; `end` the
Unix time it finished, for each worker's idle gaps; a child's CPU
counts once it was reaped, so a server a module fixture starts is charged to the test that stops it).
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator

import pytest


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    path = os.environ.get("RUNBOOK_CPU_TIMES")
    if not path:
        yield
        return
    wall, cpu = time.monotonic(), _cpu()
    yield
    line = {"nodeid": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "wall_s": round(time.monotonic() - wall, 3), "cpu_s": round(_cpu() - cpu, 3), "end": round(time.time(), 3)}
    with open(path, "a") as out:
        out.write(json.dumps(line) + "\n")
