"""The files a phase declares it makes (`Outputs:`): what each run left there, kept copies, and
whether what a later phase reads (`Inputs:`) is what the phase's deciding run made.

Identity of an output (`OutputInfo` in the run record):
- a file: size, mtime and `xxh128:<hex>`, the xxHash XXH3-128 of its bytes (xxhash, a dependency
  of runbook; ~10 GB/s on one core, so hashing costs little beside writing the file);
- a file over LARGE_BYTES (8 GiB): `sampled:<hex>`, the XXH3-128 of its size, its mtime in ns and
  three 16 MiB windows (start, middle, end): reading a checkpoint of hundreds of GB whole at
  every run would cost minutes; a change that keeps size and mtime and touches none of the
  windows goes unseen (stated in docs/experiments.md);
- a folder: its files (symlinks not followed) in path order, each `path size hash`, hashed
  together as `xxh128:`; size the sum, mtime the newest, `files` how many;
- `missing` when the run left nothing there.

Kept outputs (`keep_outputs = "FOLDER"` in runbook.toml): after each run its outputs are copied
under `FOLDER/<run-id>/<path>`, so that `runbook choose RUN` puts the chosen run's outputs back in
place (copied back, so the kept copy stays as it was). Copies, not hard links: a link shares its
bytes with the file, and a step that rewrites an output in place (`torch.save(path)` opens it for
writing, the same inode) would change the kept one too. A restore checks the kept copy against
the run's recorded hash first and refuses a copy that changed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Protocol

from runbook.model import OutputInfo, Phase, Plan, RunRecord
from runbook.plan.outputs import output_paths

__all__ = ["LARGE_BYTES", "identity", "keep", "restore", "snapshot"]

LARGE_BYTES = 8 << 30
WINDOW = 16 << 20
CHUNK = 8 << 20


class _Hasher(Protocol):
    def update(self, data: bytes) -> None: ...
    def hexdigest(self) -> str: ...


def _hasher() -> _Hasher:
    import xxhash  # imported when an output is hashed: `runbook status` never loads it

    hasher: _Hasher = xxhash.xxh3_128()
    return hasher


def _file_hash(path: Path, size: int, mtime_ns: int) -> str:
    h = _hasher()
    with open(path, "rb") as handle:
        if size > LARGE_BYTES:
            h.update(f"{size} {mtime_ns}".encode())
            for start in (0, size // 2 - WINDOW // 2, size - WINDOW):
                handle.seek(start)
                h.update(handle.read(WINDOW))
            return "sampled:" + h.hexdigest()
        while chunk := handle.read(CHUNK):
            h.update(chunk)
    return "xxh128:" + h.hexdigest()


def _iso_ns(ns: int) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def identity(root: Path, rel: str, with_hash: bool = True) -> OutputInfo:
    """What is at `root/rel` now; `with_hash=False`: kind, size, mtime and file count only (a stat
    walk, no byte read: `runbook status` compares those first and hashes only on a difference)."""
    path = root / rel
    try:
        st = path.stat()
    except OSError:
        return OutputInfo(path=rel, kind="missing")
    if path.is_file():
        return OutputInfo(path=rel, kind="file", size=st.st_size, mtime=_iso_ns(st.st_mtime_ns), files=1,
                          hash=_file_hash(path, st.st_size, st.st_mtime_ns) if with_hash else None)
    if not path.is_dir():
        return OutputInfo(path=rel, kind="missing")
    lines, size, newest, count = [], 0, st.st_mtime_ns, 0
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for name in sorted(filenames):
            file = Path(dirpath) / name
            try:
                fst = file.lstat()
            except OSError:
                continue
            if not file.is_file() or file.is_symlink():
                continue
            size += fst.st_size
            newest = max(newest, fst.st_mtime_ns)
            count += 1
            if with_hash:
                lines.append(f"{file.relative_to(path).as_posix()} {fst.st_size} "
                             f"{_file_hash(file, fst.st_size, fst.st_mtime_ns)}")
    if not with_hash:
        return OutputInfo(path=rel, kind="dir", size=size, mtime=_iso_ns(newest), files=count)
    h = _hasher()
    h.update("\n".join(lines).encode())
    return OutputInfo(path=rel, kind="dir", size=size, mtime=_iso_ns(newest), files=count, hash="xxh128:" + h.hexdigest())


def snapshot(root: Path, plan: Plan, phase: Phase) -> list[OutputInfo]:
    """The identity of each of the phase's `Outputs:` (vars of `plan`, the plan as the run ran it)."""
    return [identity(root, rel) for rel in output_paths(phase.outputs, plan.vars)]


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)  # mtime kept: the copy has the identity the run recorded


def keep(root: Path, folder: str, run_id: str, outputs: list[OutputInfo]) -> None:
    """Copy each output under `root/folder/<run_id>/<path>`; set `kept`."""
    for info in outputs:
        if info.kind == "missing":
            continue
        src, dst = root / info.path, root / folder / run_id / info.path
        if info.kind == "file":
            _copy(src, dst)
        else:
            for dirpath, _dirs, files in os.walk(src):
                for name in files:
                    file = Path(dirpath) / name
                    if file.is_file() and not file.is_symlink():
                        _copy(file, dst / file.relative_to(src))
        info.kept = (PurePosixPath(folder) / run_id / info.path).as_posix()


def restore(root: Path, run: RunRecord) -> list[str]:
    """Put `run`'s kept outputs back in place (each replaced whole); the paths restored. Raises
    ValueError naming an output that was not kept, or whose kept copy no longer has the run's hash."""
    todo = []
    for info in run.outputs:
        if info.kind == "missing":
            continue
        if not info.kept or not (root / info.kept).exists():
            raise ValueError(f"{info.path}: run {run.run_id} kept no copy of it (keep_outputs in runbook.toml)")
        kept = identity(root, info.kept)
        if kept.hash != info.hash:
            raise ValueError(f"{info.path}: the copy run {run.run_id} kept ({info.kept}) changed since (its bytes "
                             "were rewritten in place)")
        todo.append(info)
    done = []
    for info in todo:
        src, dst = root / (info.kept or ""), root / info.path
        tmp = dst.with_name(dst.name + ".runbook-restore")
        if tmp.exists() or tmp.is_symlink():
            shutil.rmtree(tmp) if tmp.is_dir() and not tmp.is_symlink() else tmp.unlink()
        if info.kind == "file":
            _copy(src, tmp)
        else:
            shutil.copytree(src, tmp, copy_function=lambda a, b: _copy(Path(a), Path(b)))
        if dst.is_dir() and not dst.is_symlink():
            shutil.rmtree(dst)
        os.replace(tmp, dst)
        done.append(info.path)
    return done
