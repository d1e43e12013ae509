"""eagle/decode/probe_vllm.py's bookkeeping: how many targets were resident at once, whether a group is gone."""

from __future__ import annotations

import os
import subprocess
import sys

from eagle.decode.probe_vllm import ServerRun, group_alive, max_resident


def run(role: str, started: float, stopped: float) -> ServerRun:
    return ServerRun(role=role, model=role, pid=1, started=started, stopped=stopped, gone=True)


def test_max_resident_counts_overlapping_lives_only() -> None:
    assert max_resident([]) == 0
    assert max_resident([run("a", 0, 5), run("b", 5, 9), run("c", 9.5, 12)]) == 1  # one stops as the next starts
    assert max_resident([run("a", 0, 5), run("b", 4, 9), run("c", 4.5, 12)]) == 3


def test_group_alive_sees_a_live_group_and_not_a_finished_one() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        assert group_alive(proc.pid, wait_s=0)
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
    assert not group_alive(proc.pid, wait_s=1)
