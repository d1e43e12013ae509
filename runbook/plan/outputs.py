"""`Outputs:` and `Inputs:` paths as a plan writes them: pure checks and resolution (the files
themselves are runbook/store/outputs.py's)."""

from __future__ import annotations

from pathlib import PurePosixPath

__all__ = ["check_path", "output_paths"]


def check_path(path: str) -> str | None:
    """Why `path` (as written in `Outputs:` / `Inputs:`) is not a repo-relative path, or None."""
    if not path:
        return "an empty path"
    if path.startswith("/") or path.startswith("~"):
        return f"{path!r} is not relative to the repository root"
    if ".." in PurePosixPath(path).parts:
        return f"{path!r} leaves the repository (`..`)"
    return None


def output_paths(paths: list[str], vars: dict[str, str]) -> list[str]:
    """Declared paths with `{var}` replaced by the run's values, normalised (`work/./x/` -> `work/x`)."""
    out = []
    for path in paths:
        for name, value in vars.items():
            path = path.replace("{" + name + "}", value)
        out.append(str(PurePosixPath(path)))
    return out
