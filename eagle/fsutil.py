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

- `read_json_file(path)`: the one way eagle reads a JSON file the user hands it (config.json,
  `--draft-config`): checked to be a regular file of bounded size before it is read (a FIFO, a
  device or a directory is refused at once, naming the path, never a hang), UTF-8, and nested at
  most `JSON_MAX_DEPTH` deep (a RecursionError never escapes).

- `open_stream(path)`: a data file read once from start to end (`eagle prepare --data`): a regular
  file, or a pipe that has a writer (`--data <(zcat data.jsonl.gz)`, a FIFO another process writes);
  a FIFO with no writer, a directory or a device is refused at once (`StreamError`), never a hang.

- `regular_file(path, what)`: the check before any other reader (safetensors, torch.load, a JSONL
  read, a JSON one) opens a file eagle is handed: True for a regular file, False when nothing is
  there, `SpecialFileError` naming the path for a FIFO, a device (a link to /dev/zero), a directory or
  a socket. It only stat()s: opening a FIFO nobody writes blocks (in safetensors' Rust, in pyarrow's C++,
  beyond any signal), and reading /dev/zero never ends.
- `check_dir_files(dir, reader)`: the same for a directory a library reads as a whole, opening files
  whose names eagle does not choose (transformers' loaders): no FIFO, device or socket in it, and no
  directory named like a file (`tokenizer.json/`); transformers took a FIFO or a directory for a missing
  file (prepare and evaluate ran with a tokenizer without its tokenizer_config.json, evaluate without
  the target's generation_config.json).
- `atomic_path` refuses to write over a directory (`SpecialFileError`, exit 2 in eagle.cli), naming it;
  a FIFO or a link there is replaced, never opened.

Temporary names are `.tmp-NAME-HOST-PID-THREAD` (hidden, unique per writer, so concurrent writers never
share one); `remove_dead_temps(dir)` removes those a killed writer of this host left (extract calls it). Imports nothing heavy: eagle/metrics.py uses it in every command.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO


def _host() -> str:
    return os.uname().nodename


def temp_name(path: Path) -> Path:
    """The temporary sibling of `path` this process and thread writes before renaming."""
    return path.with_name(f".tmp-{path.name}-{_host()}-{os.getpid()}-{threading.get_ident()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_dead_temps(directory: str | os.PathLike[str]) -> int:
    """Remove the temporaries (temp_name) in `directory` whose writer was a process of this host that is gone
    (an `eagle extract` killed mid-write leaves one per file in flight); a live process's, and any of another
    host's (shards of one run on several nodes share the directory), stay. Returns how many were removed."""
    removed = 0
    try:
        candidates = list(Path(directory).glob(".tmp-*"))
    except OSError:
        return 0
    host = _host()
    for tmp in candidates:
        rest, _, thread = tmp.name.rpartition("-")
        writer, _, pid = rest.rpartition("-")
        if not (pid.isdigit() and thread.isdigit() and writer.endswith(f"-{host}")) or _alive(int(pid)):
            continue
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        removed += 1
    return removed


def fsync_file(path: Path) -> None:
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, fsync: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block ends normally, fsync it (unless `fsync`
    is false: data that is cheap to redo, written at disk speed) and rename it over `path`.
    On any exception the temporary is removed and `path` is untouched."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():  # os.replace would fail with a bare IsADirectoryError
        raise SpecialFileError(f"{path}: a directory, where eagle writes a file; remove it or choose another path")
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


JSON_MAX_BYTES = 64 << 20  # a config.json is KBs, a safetensors index a few MB
JSON_MAX_DEPTH = 100  # transformers configs nest 3-4 levels


class JsonFileError(ValueError):
    """A JSON file that cannot be read as one; the message names the file and the reason."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


class SpecialFileError(ValueError):
    """Something other than a regular file where eagle reads (or writes) one: a FIFO, a device, a directory,
    a socket. The message names the path, what is there and what to do."""


# Names a library opens as files in a directory it reads (a directory of such a name is no file).
FILE_SUFFIXES = frozenset({".json", ".jsonl", ".jinja", ".safetensors", ".bin", ".pt", ".pth", ".arrow", ".model",
                           ".txt", ".tiktoken", ".py", ".msgpack", ".h5"})


def regular_file(path: str | os.PathLike[str], what: str = "file", fix: str = "replace it with a regular file") -> bool:
    """Whether a regular file is at `path` (a link followed): False when nothing is there (a dangling link
    too: the caller's own "not found"); SpecialFileError, naming the path, what is there and `fix`, for a
    FIFO, a device, a directory or a socket. Nothing is opened (a FIFO's open blocks until a writer comes)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise SpecialFileError(f"{path}: cannot read it ({exc.strerror})") from None
    if stat.S_ISREG(mode):
        return True
    raise SpecialFileError(f"{path}: {_kind(mode)}, not a {what}; {fix}")


def check_dir_files(directory: str | os.PathLike[str], reader: str = "a loader") -> None:
    """Before a library reads `directory` as a whole (transformers' from_pretrained): SpecialFileError
    naming the first entry that is neither a regular file nor a directory (a FIFO, a device, a socket,
    whatever its name: such a library opens what it finds), or a directory named like a file
    (`config.json/`, FILE_SUFFIXES). A missing or unreadable directory is left to the reader's own message."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        try:
            mode = os.stat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue  # a dangling link: the reader's own "not found" if it wants it
        except OSError as exc:
            raise SpecialFileError(f"{path}: cannot read it ({exc.strerror})") from None
        if stat.S_ISREG(mode) or (stat.S_ISDIR(mode) and Path(name).suffix.lower() not in FILE_SUFFIXES):
            continue
        raise SpecialFileError(f"{path}: {_kind(mode)} in {directory}, whose files {reader} reads; replace it with "
                               "a regular file, or remove it")


class StreamError(ValueError):
    """A data path that cannot be read as a stream; the message says why (without the path)."""


class _PrefixedPipe(io.RawIOBase):
    """A pipe's fd, with the bytes already read from it (to see whether it had a writer) served first."""

    def __init__(self, prefix: bytes, fd: int) -> None:
        self._prefix, self._fd = prefix, fd

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._prefix:
            n = min(len(view), len(self._prefix))
            view[:n], self._prefix = self._prefix[:n], self._prefix[n:]
            return n
        data = os.read(self._fd, len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def open_stream(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` opened for reading once through: a regular file, or a pipe with a writer. The open never
    blocks: a FIFO with no writer (or whose writer wrote nothing and left) is `StreamError`, as is a
    directory, a device or a socket; a missing path is FileNotFoundError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode) or stat.S_ISFIFO(mode):
            prefix = b""
            if stat.S_ISFIFO(mode):
                with contextlib.suppress(BlockingIOError):  # a writer is there and has not written yet
                    prefix = os.read(fd, 1 << 16)
                    if not prefix:
                        raise StreamError("a FIFO (named pipe) with no writer, or whose writer wrote nothing: "
                                          "start the writer first (e.g. `zcat data.jsonl.gz > FIFO &`), or pass "
                                          "a regular file")
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
            if not prefix:  # a regular file, or a pipe whose writer has not written yet
                return os.fdopen(fd, "rb")
            return io.BufferedReader(_PrefixedPipe(prefix, fd))
        raise StreamError(f"not a regular file or a pipe ({_kind(mode)})")
    except BaseException:
        os.close(fd)
        raise


def _depth_over(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def read_json_file(path: str | os.PathLike[str], *, max_bytes: int = JSON_MAX_BYTES) -> Any:
    """The decoded content of the JSON file `path`.

    Raises JsonFileError (naming the path) for a missing or unreadable file, anything but a regular
    file, a file over `max_bytes`, text that is not UTF-8 and JSON nested deeper than
    `JSON_MAX_DEPTH`; json.JSONDecodeError (with its line and column) for a syntax error."""
    path = Path(path)
    try:  # O_NONBLOCK: opening a FIFO returns at once, and fstat then names it
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise JsonFileError(f"{path}: not found") from None
    except OSError as exc:
        raise JsonFileError(f"{path}: cannot read it ({exc.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise JsonFileError(f"{path}: {_kind(info.st_mode)}, not a JSON file; give the path of a regular file")
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > max_bytes:
            raise JsonFileError(f"{path}: {info.st_size:,} bytes, more than the {max_bytes:,} a JSON file here may "
                                "hold; is it the right file?")
        try:
            os.set_blocking(fd, True)
            raw = handle.read(max_bytes + 1)
        except OSError as exc:
            raise JsonFileError(f"{path}: cannot read it ({exc.strerror})") from None
    if len(raw) > max_bytes:
        raise JsonFileError(f"{path}: more than the {max_bytes:,} bytes a JSON file here may hold")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise JsonFileError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                            "save it as UTF-8") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise JsonFileError(f"{path}: JSON nested too deeply (more than {JSON_MAX_DEPTH} levels)") from None
    if _depth_over(data, JSON_MAX_DEPTH):
        raise JsonFileError(f"{path}: JSON nested too deeply (more than {JSON_MAX_DEPTH} levels)")
    return data
