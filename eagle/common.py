"""Small helpers every `eagle` command shares: failing clearly, tables, progress, device/dtype.

Kept free of torch at import time; `pick_device` / `pick_dtype` import it when called.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import click

if TYPE_CHECKING:
    import torch


class EagleError(Exception):
    """A problem with the user's input or environment, reported as `error: ...`; exits with `code`
    (1 by default; 2 for a bad argument such as a target without a text model or a layer id out
    of range)."""

    def __init__(self, msg: str, code: int = 1) -> None:
        super().__init__(msg)
        self.code = code


def fail(msg: str | BaseException, code: int | None = None) -> NoReturn:
    """Print `error: msg` to stderr and exit with `code` (never a traceback). Given an exception,
    its message and, for an EagleError, its exit code."""
    if code is None:
        code = getattr(msg, "code", 1) if isinstance(msg, EagleError) else 1
    click.echo(f"error: {msg}", err=True)
    sys.exit(code)


def check_file(path: Any, what: str = "file", fix: str = "replace it with a regular file",
               error: type[EagleError] = EagleError) -> bool:
    """eagle.fsutil.regular_file, its refusal an `error` (exit 2): True for a regular file at `path`, False
    when nothing is there; a FIFO, a device (a link to /dev/zero), a directory or a socket is refused
    at once, naming the path, before anything opens it (where a reader would hang or read for ever)."""
    from eagle.fsutil import SpecialFileError, regular_file

    try:
        return regular_file(path, what, fix)
    except SpecialFileError as exc:
        raise error(str(exc), code=2) from None


def check_dir_files(directory: Any, reader: str) -> None:
    """eagle.fsutil.check_dir_files as an exit-2 EagleError: before `reader` (transformers, datasets) reads
    `directory` as a whole."""
    from eagle.fsutil import SpecialFileError
    from eagle.fsutil import check_dir_files as check

    try:
        check(directory, reader)
    except SpecialFileError as exc:
        raise EagleError(str(exc), code=2) from None


def load_safetensors(path: Any, device: Any = "cpu", what: str = "safetensors file") -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file; EagleError naming the file when it is truncated, not a
    safetensors file at all, or unreadable (safetensors' own errors do not name it), or no regular file
    (a FIFO would block safetensors' open for ever: check_file)."""
    from safetensors.torch import load_file

    check_file(path, what)
    try:
        return load_file(str(path), device=str(device))
    except Exception as e:  # SafetensorError (truncated, random bytes), OSError
        raise EagleError(f"{path}: unreadable {what} ({e}); the file is damaged or incomplete: "
                         "re-create or re-copy it") from None


@contextlib.contextmanager
def open_safetensors(path: Any, device: Any = "cpu", what: str = "safetensors file") -> Iterator[Any]:
    """`safetensors.safe_open` for reading headers or single tensors; EagleError naming the file
    when it cannot be read (truncated, random bytes) or is no regular file (check_file)."""
    from safetensors import safe_open

    check_file(path, what)
    try:
        handle = safe_open(str(path), framework="pt", device=str(device))
    except Exception as e:  # SafetensorError, OSError
        raise EagleError(f"{path}: unreadable {what} ({e}); the file is damaged or incomplete: "
                         "re-create or re-copy it") from None
    with handle as fh:
        yield fh


def warn(msg: str) -> None:
    click.echo(f"warning: {msg}", err=True)


def note(msg: str) -> None:
    """A progress line on stderr (what a long step is doing); stdout stays the command's result."""
    click.echo(msg, err=True)


def say(msg: str) -> None:
    """A line of a command's human view on stdout."""
    click.echo(msg)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 1000 else f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def format_table(rows: Sequence[Sequence[Any]], headers: Sequence[str] | None = None) -> str:
    """Render rows as a plain aligned text table (left column left-aligned, others right)."""
    text_rows = [[_fmt(c) for c in row] for row in rows]
    all_rows = ([list(headers)] if headers else []) + text_rows
    if not all_rows:
        return ""
    widths = [max(len(r[i]) for r in all_rows if i < len(r)) for i in range(max(map(len, all_rows)))]

    def line(r: list[str]) -> str:
        cells = [c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)]
        return "  ".join(cells).rstrip()

    out = []
    if headers:
        out.append(line(all_rows[0]))
        out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in text_rows)
    return "\n".join(out)


def print_table(rows: Sequence[Sequence[Any]], headers: Sequence[str] | None = None) -> None:
    click.echo(format_table(rows, headers))


def print_kv(pairs: dict[str, Any]) -> None:
    """A two-column `name  value` table."""
    print_table([(k, v) for k, v in pairs.items()])


def progress(iterable: Iterable[Any] | None = None, total: int | None = None, desc: str = "",
             unit: str = "it", disable: bool | None = None) -> Any:
    """A tqdm progress bar on stderr; silent when stderr is not a terminal unless forced."""
    from tqdm.auto import tqdm

    if disable is None:
        disable = not sys.stderr.isatty()
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=disable, file=sys.stderr,
                dynamic_ncols=True, leave=False)


def pick_device(name: str = "auto") -> torch.device:
    """`auto` -> cuda when available else cpu; `cuda` without a GPU is an EagleError."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise EagleError(f"--device {name} asked for, but torch sees no CUDA device; use --device cpu")
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise EagleError(f"unknown device {name!r}; use auto, cpu or cuda[:N]")
    return torch.device(name)


def concrete_device(device: str | torch.device) -> torch.device:
    """The device with its index: "cuda" becomes the current CUDA device ("cuda:N"), as
    `torch.cuda.set_device`, streams and events need; cpu and indexed devices are returned as given."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


DTYPES = ("auto", "float32", "bfloat16", "float16")

# The fast decoder's attention kernels (eagle/decode/llama_ops.py dispatches on them; `--attention`):
# torch's SDPA over the whole static cache, or eagle/decode/triton_attention.py's split-KV kernels with
# eagle/decode/triton_ops.py's fused rope/norm/SwiGLU/accept kernels. `--attention auto` (the default,
# decode.resolve_attention): triton for the fast decoder on CUDA where triton is installed, else sdpa.
ATTENTION_KERNELS = ("sdpa", "triton")
ATTENTION_CHOICES = ("auto", *ATTENTION_KERNELS)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` -> bfloat16 on GPU, float32 on CPU (bf16 matmuls are slow on most CPUs)."""
    import torch

    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in table:
        raise EagleError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}")
    return table[name]


def split_layer_ids(spec: str) -> list[int]:
    """`--layer-ids 2,4,5` -> [2, 4, 5] (range and order are checked by the caller)."""
    try:
        return [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise EagleError(f"--layer-ids {spec!r}: expected comma-separated integers like 2,4,5", code=2) from None


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


# Python's cyclic collector runs a young-generation pass after every 700 net allocations of container
# objects by default, (700, 10, 10). Raised, see collect_less.
GC_THRESHOLDS = (20_000, 10, 10)


def collect_less() -> None:
    """Let Python's cyclic garbage collector run less often in this process (thresholds GC_THRESHOLDS for
    (700, 10, 10)), unless it was set already to collect at least as rarely.

    Starting an eagle command or vLLM server imports torch, transformers, speculators or vLLM: millions of
    objects that live as long as the process, which the default thresholds have the collector walk again
    and again while they are made, 10-15% of a start's CPU (about 0.8 s of the 7 s that importing
    transformers' Llama and speculators' EAGLE-3 takes on the 2-core machine; docs/benchmarks.md,
    2026-12-05 ninth session). Reference counting frees what it always frees; reference cycles are still
    collected, young ones after 20,000 allocations instead of 700, the oldest after 2 million instead of
    70,000 (and as before only when a quarter of the old objects are new since the last full pass)."""
    import gc

    if gc.get_threshold()[0] < GC_THRESHOLDS[0]:
        gc.set_threshold(*GC_THRESHOLDS)


def quiet_hf() -> None:
    """Silence transformers' and datasets' own progress bars ("Loading weights", "Saving the dataset")
    and transformers' warnings below errors.

    Neither library is imported for it: importing transformers costs a second of CPU (it scans its own
    model folders and every installed distribution) and datasets a third, wasted in the commands that
    never use them (vocab, check-checkpoint, the refusals of every verb). Where this process has not
    imported one yet, the variables it reads on import say the same (TRANSFORMERS_VERBOSITY;
    HF_HUB_DISABLE_PROGRESS_BARS, which transformers' bars follow; HF_DATASETS_DISABLE_PROGRESS_BARS),
    unless the user set them; an imported one is told at once. Set as variables, they reach the processes
    the command starts too (a vLLM server's log, DDP ranks): no bars and no transformers warnings there
    either; errors still show. Set one to another value to have it back."""
    if "transformers" in sys.modules:
        logging = sys.modules["transformers"].utils.logging
        logging.disable_progress_bar()
        logging.set_verbosity_error()
    else:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        if "huggingface_hub" in sys.modules:  # it read the variable already; transformers asks it on import
            from huggingface_hub.utils import disable_progress_bars

            disable_progress_bars()
        else:
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    else:
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
