"""Special files at every path eagle reads: a FIFO nobody writes, a link to /dev/zero, a directory.

The twin of tests/runbook/test_fuzz_special_files.py for eagle (issue 51). A copy of the session's toy
target, its prepared and extracted data, and its drafter (with the last epoch's training state), plus a
prompts file, a conversations file, a serve-bench report and a $RUNBOOK_METRICS file, has one path
replaced; the eagle verb that reads it (the cheapest one, and a second where another reader opens the
same file) runs in process (helpers.eagle_inproc). Each must answer at once: exit 1 or 2 with
`error: ...` naming the path and what is there, never a hang, an endless read, a traceback or eagle's
"did not expect this" internal error. A hang fails its case, not the session: the FIFO is opened by a
writer after TIMEOUT seconds (a FIFO's open blocked safetensors, pyarrow and torch.load where no signal
reaches Python), and RLIMIT_DATA turns an endless read of /dev/zero into a MemoryError.

Where eagle writes a file (`eagle vocab`'s vocab.safetensors and vocab.json), a FIFO or a link is
replaced by the new file, never opened; a directory is refused naming it.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import helpers as H
import pytest

pytestmark = pytest.mark.slow  # the toy target, data and drafter are training fixtures

KINDS = {"fifo": "a FIFO", "dev-zero": "a character device", "directory": "a directory"}
TIMEOUT = 60  # seconds a verb may take to refuse; a hang fails the case, not the session
HEADROOM = 4 << 30  # bytes a verb may grow the test process by (an endless read of /dev/zero: MemoryError)


def _verb(verb: str, c: dict[str, Path]) -> list[str]:
    """The command line of `verb` on the case's copies: small settings, so a verb that read past the
    replaced file would still end soon."""
    decode = ["--prompts", str(c["prompts"]), "--limit", "1", "--max-new-tokens", "4", "-k", "1", "--device", "cpu"]
    train = ["train", "--model", str(c["target"]), "--data", str(c["data"]), "--device", "cpu", "--no-tensorboard"]
    return {
        "check-checkpoint": ["check-checkpoint", str(c["draft"]), "--model", str(c["target"])],
        "import-drafter": ["import-drafter", str(c["draft"]), "--out", str(c["out"]), "--model", str(c["target"])],
        "evaluate": ["evaluate", "--model", str(c["target"]), "--draft", str(c["draft"]), *decode],
        "probe": ["probe", "--model", str(c["target"]), "--other", str(c["target"]), *decode],
        "prepare": ["prepare", "--model", str(c["target"]), "--data", str(c["conversations"]), "--out", str(c["out"])],
        "vocab": ["vocab", "--data", str(c["data"]), "--draft-vocab", "64"],
        "extract": ["extract", "--model", str(c["target"]), "--data", str(c["data"]), "--device", "cpu"],
        "train": [*train, "--out", str(c["out"]), "--epochs", "1"],
        "train --resume": [*train, "--out", str(c["draft"]), "--epochs", "99", "--resume"],  # past its last epoch
        "serve-config": ["serve-config", "--from-bench", str(c["bench"])],
    }[verb]


# (path in the case's copy, the verbs run on it): every path eagle reads there
READS: list[tuple[str, list[str]]] = [
    ("target/config.json", ["evaluate"]),
    ("target/tokenizer.json", ["prepare"]),
    ("target/tokenizer_config.json", ["prepare"]),
    ("target/chat_template.jinja", ["prepare"]),
    ("target/generation_config.json", ["evaluate"]),
    ("target/model.safetensors", ["extract", "train"]),
    ("draft/config.json", ["check-checkpoint", "import-drafter"]),
    ("draft/model.safetensors", ["check-checkpoint", "evaluate"]),
    ("draft/checkpoints/epoch-LAST/state.pt", ["train --resume"]),
    ("data/eagle_data.json", ["vocab"]),
    ("data/state.json", ["vocab"]),
    ("data/dataset_info.json", ["vocab"]),
    ("data/data-00000-of-00001.arrow", ["vocab", "train"]),
    ("data/hidden_states/hs_0.safetensors", ["train", "extract"]),
    ("data/vocab.safetensors", ["train"]),
    ("prompts.jsonl", ["evaluate", "probe"]),  # --prompts
    ("conversations.jsonl", ["prepare"]),  # prepare --data
    ("bench.json", ["serve-config"]),  # serve-config --from-bench (a serve-bench --json report)
    ("metrics.json", ["vocab"]),  # $RUNBOOK_METRICS, merged into by every command that has metrics
]
WRITES = ["data/vocab.safetensors", "data/vocab.json"]  # what `eagle vocab` writes
# The exit code: 2 (a bad input path), but 1 where the verb's refusals of that input were already 1: any
# unreadable --prompts file (evaluate, probe) and prepare --data (docs/reliability.md row 46)
EXIT = {"prompts.jsonl": 1, "conversations.jsonl": 1}


@pytest.fixture(scope="module")
def inputs(toy_target: Path, toy_data: Path, toy_drafter: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What a case copies: the toy target, data and drafter (its last epoch's state only), a prompts file,
    a conversations file, a serve-bench report and a metrics file."""
    base = tmp_path_factory.mktemp("special-inputs")
    shutil.copytree(toy_target, base / "target")
    shutil.copytree(toy_data, base / "data")
    last = max((toy_drafter / "checkpoints").glob("epoch-*"), key=lambda p: int(p.name.split("-")[1]))
    shutil.copytree(toy_drafter, base / "draft", ignore=shutil.ignore_patterns("checkpoints", "tensorboard"))
    shutil.copytree(last, base / "draft" / "checkpoints" / last.name)
    prompts = (H.REPO / "plans" / "data" / "prompts.jsonl").read_text().splitlines()[:2]
    (base / "prompts.jsonl").write_text("\n".join(prompts) + "\n")
    (base / "conversations.jsonl").write_text("".join(
        json.dumps({"messages": [{"role": "user", "content": f"question {i}"},
                                 {"role": "assistant", "content": f"answer {i}"}]}) + "\n" for i in range(2)))
    (base / "bench.json").write_text(json.dumps({"deploy": {"vllm": ["vllm", "serve", "target"], "sglang": []}}) + "\n")
    (base / "metrics.json").write_text("{}\n")
    return base


def _case(inputs: Path, root: Path) -> dict[str, Path]:
    shutil.copytree(inputs, root)
    return {"target": root / "target", "draft": root / "draft", "data": root / "data", "prompts": root / "prompts.jsonl",
            "conversations": root / "conversations.jsonl", "bench": root / "bench.json", "out": root / "out"}


def _path(root: Path, rel: str) -> Path:
    if "epoch-LAST" in rel:
        (last,) = (root / "draft" / "checkpoints").glob("epoch-*")
        rel = rel.replace("epoch-LAST", last.name)
    return root / rel


def _replace(path: Path, kind: str) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()


def _data_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    return 0


# The watchdog: after argv[2] seconds, open the FIFO for writing and close it again, every 0.2 s, until killed.
_LET_GO = """
import os, sys, time
time.sleep(float(sys.argv[2]))
while True:
    try:
        os.close(os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK))  # ENXIO while no reader has it open
    except OSError:
        pass
    time.sleep(0.2)
"""


@contextlib.contextmanager
def _bounded(path: Path) -> Iterator[None]:
    """While a verb runs in this process, what would stop the whole session ends the case instead: a reader
    still blocked in the open of the FIFO at `path` after TIMEOUT seconds is let go by a writer that opens
    the FIFO and closes it (a process of its own: safetensors blocks in its open holding the GIL, where
    neither a thread of this process nor a signal handler would run), and the process may grow by
    HEADROOM bytes at most (RLIMIT_DATA: reading /dev/zero for ever becomes a MemoryError, not the OOM
    killer's choice)."""
    watchdog = (subprocess.Popen([sys.executable, "-S", "-c", _LET_GO, str(path), str(TIMEOUT)])
                if path.is_fifo() else None)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = _data_bytes() + HEADROOM
    resource.setrlimit(resource.RLIMIT_DATA, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()


def _eagle(args: list[str], path: Path, what: str) -> subprocess.CompletedProcess:
    env = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if path.name == "metrics.json":
        env["RUNBOOK_METRICS"] = str(path)
    started = time.monotonic()
    try:
        with _bounded(path):
            result = H.eagle_inproc(*args, timeout=TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what}: no answer in {TIMEOUT} s (it hangs)")
    took = time.monotonic() - started
    assert took < TIMEOUT, f"{what}: answered only after {took:.0f} s, when its FIFO was opened by a writer (it hangs)"
    return result


def _cases() -> list[tuple[str, str, str]]:
    return [(rel, verb, kind) for rel, verbs in READS for verb in verbs for kind in KINDS]


@pytest.mark.timeout(TIMEOUT + 30, func_only=True)  # under pytest-timeout's SIGALRM, eagle_inproc's own is off
@pytest.mark.parametrize(("rel", "verb", "kind"), _cases(), ids=lambda v: str(v))
def test_a_special_file_at_a_path_eagle_reads_is_refused_at_once_naming_it(
        inputs: Path, tmp_path: Path, counts: H.Counts, rel: str, verb: str, kind: str) -> None:
    case = _case(inputs, tmp_path / "case")
    path = _path(tmp_path / "case", rel)
    _replace(path, kind)
    what = f"{rel} as {KINDS[kind]}: eagle {verb}"
    result = _eagle(_verb(verb, case), path, what)
    text = result.stdout + result.stderr
    H.assert_no_traceback(result, what)
    assert "did not expect" not in text, (what, text[-2000:])
    assert result.returncode == EXIT.get(rel, 2), (what, result.returncode, text[-2000:])
    # `error: ...` (click's usage errors: `Error: ...`); check-checkpoint lists its problems
    said = "error: " in result.stderr.lower() or "problem(s) in" in result.stderr
    assert said and str(path) in text and KINDS[kind] in text, (what, text[-2000:])
    shutil.rmtree(tmp_path / "case")
    counts.add("eagle_special_file_reads")


@pytest.mark.timeout(TIMEOUT + 30, func_only=True)
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("rel", WRITES)
def test_a_special_file_where_eagle_writes_is_replaced_or_refused(inputs: Path, tmp_path: Path, counts: H.Counts,
                                                                  rel: str, kind: str) -> None:
    """A FIFO or a link where `eagle vocab` writes is replaced by the new file (os.replace, never an open);
    a directory there is refused, naming it, and left as it was (it was "did not expect" IsADirectoryError)."""
    case = _case(inputs, tmp_path / "case")
    path = _path(tmp_path / "case", rel)
    _replace(path, kind)
    what = f"{rel} as {KINDS[kind]}: eagle vocab"
    result = _eagle(_verb("vocab", case), path, what)
    text = result.stdout + result.stderr
    H.assert_no_traceback(result, what)
    assert "did not expect" not in text, (what, text[-2000:])
    if kind == "directory":
        assert result.returncode == 2, (what, result.returncode, text[-2000:])
        assert f"error: {path}: a directory" in result.stderr, (what, text[-2000:])
        assert path.is_dir() and not path.is_symlink()
    else:
        assert result.returncode == 0, (what, text[-2000:])
        assert path.is_file() and not path.is_symlink(), what
    shutil.rmtree(tmp_path / "case")
    counts.add("eagle_special_file_writes")
