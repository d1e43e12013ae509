"""A phase's `Resources:` line: what a cluster job asks for, as `key=value` words.

    Resources: nodes=2 gpus-per-node=8 time=48:00:00 partition=gpu

Each word becomes one `sbatch` option (`--nodes=2 --gpus-per-node=8 --time=48:00:00
--partition=gpu`); nothing passes through a shell. Only the keys in `KEYS` are accepted, so a typo
is an error at `file:line:col` instead of a job that waits forever in the wrong queue; sbatch
options outside this list go into runbook.toml's `[slurm] sbatch_args`. `runbook.toml`'s
`[slurm] resources` line (same syntax) gives defaults that a phase's own words override.

Pure functions; no I/O.
"""

from __future__ import annotations

import re

__all__ = ["KEYS", "ResourcesError", "merge", "parse_resources", "sbatch_args"]

# key -> what its value must look like (a regex over the whole value) and a word for messages
_INT = (r"[1-9][0-9]{0,6}", "a whole number such as 2")
_RANGE = (r"[1-9][0-9]{0,6}(-[1-9][0-9]{0,6})?", "a number or a range such as 2 or 2-4")
_MEM = (r"[0-9]{1,9}[KMGT]?", "a size such as 64G or 500M")
_WORD = (r"[A-Za-z0-9_.,:+\-/=@\[\]|&*()!]{1,200}", "a word without spaces or quotes")
# Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_TIME = (r"[0-9]{1,7}(:[0-9]{1,2}){0,2}|[0-9]{1,4}-[0-9]{1,2}(:[0-9]{1,2}){0,2}|UNLIMITED|INFINITE",
         "a Slurm time such as 30 (minutes), 2:00:00 or 2-00:00:00")

KEYS: dict[str, tuple[str, str]] = {
    "nodes": _RANGE,
    "ntasks": _INT,
    "ntasks-per-node": _INT,
    "cpus-per-task": _INT,
    "gpus": _WORD,
    "gpus-per-node": _WORD,
    "gpus-per-task": _WORD,
    "gres": _WORD,
    "mem": _MEM,
    "mem-per-cpu": _MEM,
    "mem-per-gpu": _MEM,
    "time": _TIME,
    "partition": _WORD,
    "account": _WORD,
    "qos": _WORD,
    "constraint": _WORD,
    "reservation": _WORD,
}


class ResourcesError(ValueError):
    """A `Resources:` word that cannot be used; `col` is its 0-based offset in the text."""

    def __init__(self, message: str, col: int = 0) -> None:
        super().__init__(message)
        self.col = col


def parse_resources(text: str) -> dict[str, str]:
    """`"nodes=2 time=1:00:00"` -> `{"nodes": "2", "time": "1:00:00"}` (in the order written).

    Raises ResourcesError naming the first bad word and the fix."""
    out: dict[str, str] = {}
    cleaned = text.strip().strip("`")
    offset = text.find(cleaned) if cleaned else 0
    for m in re.finditer(r"\S+", cleaned):
        word, col = m.group(), offset + m.start()
        key, sep, value = word.partition("=")
        key = key.strip().lower()
        if not sep or not key or not value:
            raise ResourcesError(f"`{word}` is not key=value: write e.g. `nodes=2 time=2:00:00`", col)
        if key not in KEYS:
            raise ResourcesError(
                f"unknown resource `{key}`; known: {', '.join(KEYS)} (other sbatch options go into "
                "runbook.toml's [slurm] sbatch_args)", col)
        pattern, what = KEYS[key]
        if not re.fullmatch(pattern, value):
            raise ResourcesError(f"`{key}={value}`: expected {what}", col)
        if key in out:
            raise ResourcesError(f"`{key}` is given twice; keep one", col)
        out[key] = value
    return out


def merge(defaults: dict[str, str], own: dict[str, str]) -> dict[str, str]:
    """The phase's own resources over the defaults."""
    return {**defaults, **own}


def sbatch_args(resources: dict[str, str]) -> list[str]:
    """`{"nodes": "2"}` -> `["--nodes=2"]`, in order."""
    return [f"--{key}={value}" for key, value in resources.items()]
