"""The environment fingerprint recorded with each run.

Python and platform come from this process; torch, CUDA and the GPUs are probed in a subprocess
of runbook's own interpreter with a short timeout, so runbook never imports torch and a broken or
slow torch cannot hang a run. A few environment variables that change results (CUDA_VISIBLE_DEVICES,
thread counts, NCCL/vLLM/HF settings) are kept; names that look like secrets (*TOKEN*, *KEY*,
*SECRET*, *PASSWORD*, ...) are never recorded, whatever their prefix; bytes that are not UTF-8 in a kept
name or value are recorded written out (`\\xff`). Passwords inside URLs
(`https://user:secret@host`) are replaced by `***` wherever runbook records text a user or a step
wrote: env values here; step commands, log tails and vars in the run record (runbook/redact.py).

The probe's answer is cached per host, interpreter, torch install and CUDA_VISIBLE_DEVICES in
`$XDG_CACHE_HOME/runbook/envprobe.json` (importing torch can take many seconds on a busy machine).
`RUNBOOK_ENV_PROBE=0` skips the probe (torch/CUDA/GPU stay unknown).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runbook.files import whole_text
from runbook.model import EnvFingerprint
from runbook.redact import redact_credentials

PROBE_TIMEOUT_S = 20.0

_SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
_KEPT_NAMES = {
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "WORLD_SIZE",
    "VIRTUAL_ENV",
    "CONDA_DEFAULT_ENV",
}
_KEPT_PREFIXES = ("CUDA_", "NCCL_", "PYTORCH_", "TORCH_", "VLLM_", "HF_", "TRANSFORMERS_", "NVIDIA_")

_PROBE = r"""
import importlib.util, json
out = {}
if importlib.util.find_spec("torch") is not None:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    try:
        if torch.cuda.is_available():
            out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:
        pass
print(json.dumps(out))
"""


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in _SECRET_WORDS)


def selected_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables worth recording, never a secret-looking one."""
    kept = {}
    for name, value in environ.items():
        if is_secret_name(name):
            continue
        if name in _KEPT_NAMES or name.startswith(_KEPT_PREFIXES):  # bytes that are not UTF-8 written \xff
            kept[whole_text(name)] = redact_credentials(whole_text(value))
    return dict(sorted(kept.items()))


def probe_torch(timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """torch / CUDA / GPU names from a subprocess; {} when torch is missing, broken or slow."""
    env = {k: v for k, v in os.environ.items() if not is_secret_name(k)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except (subprocess.TimeoutExpired, OSError):
        return {}
    if done.returncode != 0:
        return {}
    try:
        lines = done.stdout.strip().splitlines()
        found = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        return {}
    return found if isinstance(found, dict) else {}


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "runbook" / "envprobe.json"


def _cache_key() -> str | None:
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec is not None else None
    stamp = os.stat(origin).st_mtime_ns if origin and os.path.exists(origin) else 0
    parts = [socket.gethostname(), sys.executable, str(origin), str(stamp), os.environ.get("CUDA_VISIBLE_DEVICES", "")]
    return "|".join(parts)


def probe_torch_cached(timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """`probe_torch`, remembered while the host, interpreter and torch install stay the same."""
    key = _cache_key()
    path = _cache_file()
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
        if key is not None and isinstance(cached, dict) and isinstance(cached.get(key), dict):
            found: dict[str, Any] = cached[key]
            return found
    except (OSError, json.JSONDecodeError):
        cached = {}
    found = probe_torch(timeout_s)
    if key is not None and found:
        try:
            from runbook.files import atomic_write_text

            path.parent.mkdir(parents=True, exist_ok=True)
            keep = cached if isinstance(cached, dict) else {}
            keep = dict(list(keep.items())[-20:])
            keep[key] = found
            atomic_write_text(path, json.dumps(keep, indent=1) + "\n")
        except OSError:
            pass
    return found


def fingerprint(environ: Mapping[str, str] | None = None, probe: bool | None = None) -> EnvFingerprint:
    env = os.environ if environ is None else environ
    if probe is None:
        probe = env.get("RUNBOOK_ENV_PROBE", "1") != "0"
    found = probe_torch_cached() if probe else {}
    gpus = found.get("gpus") or []
    return EnvFingerprint(
        python=platform.python_version(),
        platform=platform.platform(),
        host=socket.gethostname(),
        torch=found.get("torch"),
        cuda=found.get("cuda"),
        gpus=[str(g) for g in gpus] if isinstance(gpus, list) else [],
        env=selected_env(env),
    )
