"""Atomic writes: the one way eagle puts a file or a directory in place.

A reader (another rank, `eagle train --resume`, vLLM, a crashed run's successor) sees either the old
content or the new, never half of it: everything is written under a temporary name in the same
directory (same filesystem, so the rename is atomic), flushed to disk, then renamed over the target.
A failure or an interrupt removes the temporary and leaves the target as it was.

- `atomic_path(path)`: a context manager yielding the temporary path to write (for writers that
  want a path: safetensors' `save_file`, `torch.save`, ...).
- `atomic_write_text(path, text)` / `atomic_write_json(path, obj)`: the common cases.
- `atomic_dir(path)`: the same for a whole directory (a dataset, a toy target, an epoch state); an
  existing directory is swapped out and removed only after the new one is in place.

Temporary names are `.tmp-NAME-PID-THREAD` (hidden, unique per writer, so concurrent writers never
share one). Imports nothing heavy: eagle/metrics.py uses it in every command.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def temp_name(path: Path) -> Path:
    """The temporary sibling of `path` this process and thread writes before renaming."""
    return path.with_name(f".tmp-{path.name}-{os.getpid()}-{threading.get_ident()}")


def fsync_file(path: Path) -> None:
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, fsync: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block ends normally, fsync it (unless `fsync`
    is false: data that is cheap to redo, written at disk speed) and rename it over `path`.
    On any exception the temporary is removed and `path` is untouched."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        yield tmp
        if fsync:
            fsync_file(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, fsync: bool = True) -> Path:
    """Write `text` (UTF-8) to `path` atomically; returns the path."""
    path = Path(path)
    with atomic_path(path, fsync=fsync) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int = 1, sort_keys: bool = False,
                      fsync: bool = True) -> Path:
    """`obj` as JSON with a final newline, written atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n", fsync=fsync)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty temporary directory beside `path`; when the block ends normally, it becomes
    `path` (an existing `path` is renamed away first and deleted after). On an exception the
    temporary directory is removed and `path` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".old-{path.name}-{os.getpid()}-{threading.get_ident()}")
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
