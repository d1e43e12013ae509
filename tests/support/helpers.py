"""The one home of what tests share: `import helpers as H` (pyproject puts tests/ on sys.path).

- `git`, `init_repo`, `make_repo`, `commit_files`: real git repositories in temp dirs (one git helper,
  one factory).
- `runbook`, `popen_runbook`, `cli_env`, `RUNBOOK`, `EAGLE`: the real console scripts.
- `runbook_inproc`, `eagle_inproc`: the same CLIs (their `main`, real argv) run in this process, for tests
  that only read the output, exit code and files (~0.6 s less per runbook call than the subprocess, 3-4 s
  of CPU less per eagle call: torch is imported once); `runbook` stays for signals, locks, crashes,
  process groups, detach, concurrency, stdin/tty, import-lightness and tracebacks, and for the console
  script itself.
- `run_record(**fields)`: a RunRecord with every required field filled (the one run-record factory).
- `wait_for(what)`: poll until a condition holds, or fail saying what never happened.
- `special_file(path, kind)`: a FIFO nobody writes, a link to /dev/zero or a directory at `path`
  (`SPECIAL_KINDS`), for the tests of readers that must refuse them at once.
- `python_snippet(code)`: a few lines in a fresh interpreter with a bare environment.
- `assert_no_traceback`, `tree_snapshot`, `committed_runs`: what the reliability tests check.
- `Counts` (the `counts` fixture in conftest.py): how many inputs were fuzzed, kills survived,
  concurrent runs made. Every test adds to a JSON file (under the pytest session's base temp dir,
  and also to $RUNBOOK_RELIABILITY_COUNTS when set) and prints the running total, so
  docs/reliability.md quotes figures from a real run.
- `examples(n)`, `kill_rounds(n)`: the fuzzing budgets, scaled by $RUNBOOK_FUZZ_EXAMPLES and
  $RUNBOOK_KILL_ROUNDS.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runbook.model import RunRecord

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RUNBOOK = [str(BIN / "runbook")] if (BIN / "runbook").exists() else [sys.executable, "-m", "runbook.cli"]
# what a next action's argv[0] is: the runbook beside the interpreter running it, by its absolute path
RUNBOOK_EXE = str((Path(sys.executable).with_name("runbook")).absolute())
EAGLE = [str(BIN / "eagle")] if (BIN / "eagle").exists() else [sys.executable, "-m", "eagle.cli"]

DEFAULT_FUZZ_EXAMPLES = 200


def examples(default: int) -> int:
    """Hypothesis max_examples: `default`, scaled so that RUNBOOK_FUZZ_EXAMPLES=N gives the
    biggest fuzzing test N examples (and the others proportionally)."""
    raw = os.environ.get("RUNBOOK_FUZZ_EXAMPLES")
    if not raw:
        return default
    try:
        wanted = int(raw)
    except ValueError:
        return default
    return max(1, default * wanted // DEFAULT_FUZZ_EXAMPLES)


def kill_rounds(default: int) -> int:
    """How many kill -9 rounds per crash test: RUNBOOK_KILL_ROUNDS overrides."""
    raw = os.environ.get("RUNBOOK_KILL_ROUNDS")
    return int(raw) if raw and raw.isdigit() else default


class Counts:
    """Add-only counters in a JSON file, safe across processes (flock)."""

    def __init__(self, path: Path) -> None:
        self.paths = [path]
        extra = os.environ.get("RUNBOOK_RELIABILITY_COUNTS")
        if extra:
            self.paths.append(Path(extra))

    def add(self, key: str, n: int = 1) -> int:
        total = 0
        for path in self.paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a+", encoding="utf-8") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                handle.seek(0)
                raw = handle.read()
                try:
                    data = json.loads(raw) if raw.strip() else {}
                except json.JSONDecodeError:
                    data = {}
                data[key] = data.get(key, 0) + n
                handle.seek(0)
                handle.truncate()
                handle.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
                total = max(total, data[key])
        return total

    def report(self, key: str, n: int) -> None:
        total = self.add(key, n)
        print(f"reliability count: {key} +{n} (total {total}) -> {self.paths[-1]}")


# ---- git repos and the real CLI ----------------------------------------------------------------


def git(repo: Path, *args: str, check: bool = True) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=check, capture_output=True, text=True).stdout


def init_repo(path: Path, identity: bool = True) -> Path:
    """An empty git repository at `path` (branch main), with a committer identity unless told not."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    if identity:  # what three `git config` calls write, in one append (the suite makes ~1,000 repositories)
        with open(path / ".git" / "config", "a") as config:
            config.write("[user]\n\tname = Tester\n\temail = t@example.com\n[commit]\n\tgpgsign = false\n")
    return path


def make_repo(path: Path, plan: str, notes: str | bytes | None = None, plan_name: str = "plan.md",
              ignore: tuple[str, ...] = ()) -> Path:
    """A git repo at `path` with plans/<plan_name> (and plans/notes.md), runbook's .gitignore entries
    (plus `ignore`, e.g. files a test's steps write), all in one first commit."""
    init_repo(path)
    (path / "plans").mkdir()
    (path / ".gitignore").write_text("".join(f"{line}\n" for line in ("state/lock", "state/write.lock",
                                                                       "state/runs/*/", *ignore)))
    (path / "plans" / plan_name).write_text(plan)
    if notes is not None:
        (path / "plans" / "notes.md").write_bytes(notes.encode() if isinstance(notes, str) else notes)
    git(path, "add", ".")
    git(path, "commit", "-qm", "init")
    return path


def commit_files(repo: Path, files: dict[str, str], message: str) -> str:
    """Write `files` (path in `repo` -> text), stage everything and commit; the new HEAD's sha."""
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD").strip()


def run_record(**fields: Any) -> RunRecord:
    """A RunRecord with every required field filled with a plain default; `fields` override them
    (phase_label follows `phase`: phase-1 -> 1)."""
    from runbook.model import RunRecord

    phase = fields.get("phase", "phase-0")
    base: dict[str, Any] = dict(run_id="20261129-143012-7f3a", plan="plans/plan.md", plan_blob="0" * 40, phase=phase,
                                phase_label=phase.removeprefix("phase-"), phase_text_hash="0" * 64,
                                started="2026-11-29T14:30:12.000000Z", verdict="pass")
    return RunRecord(**{**base, **fields})


def poll(what: Callable[[], Any], timeout: float = 60, every: float = 0.05) -> Any:
    """Call `what` every `every` seconds until it returns something truthy, and return that; after
    `timeout` seconds return its last (falsy) value."""
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(every)


SPECIAL_KINDS = ("fifo", "dev-zero", "directory")


def special_file(path: Path, kind: str) -> Path:
    """Put a special file at `path` (what was there goes first): a FIFO nobody writes ("fifo"), a
    link to /dev/zero ("dev-zero") or a directory ("directory"). The one home for the readers'
    special-file tests."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:
        raise ValueError(f"no special file kind {kind!r}: one of {', '.join(SPECIAL_KINDS)}")
    return path


def wait_for(what: Callable[[], Any], timeout: float = 60, every: float = 0.05, message: str | None = None) -> Any:
    """`poll`, failing after `timeout` seconds with what never happened (`message`, else `what`'s
    docstring or repr)."""
    value = poll(what, timeout, every)
    assert value, f"timed out after {timeout:g}s waiting for {message or what.__doc__ or what}"
    return value


def wait_for_file(path: Path, timeout: float = 60, nonempty: bool = False) -> None:
    """Wait until `path` exists (and, with `nonempty`, holds more than whitespace)."""
    def there() -> bool:
        try:
            return path.exists() and (not nonempty or bool(path.read_text().strip()))
        except OSError:
            return False

    wait_for(there, timeout, 0.02, message=f"{path} to appear")


def alive(pid: int) -> bool:
    """The process runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def gone(pid: int, timeout: float = 10) -> bool:
    """The process is gone within `timeout` seconds."""
    return bool(poll(lambda: not alive(pid), timeout))


_HOLDER = """
import sys, time
from runbook.store.lock import run_lock
state, run_id, plan, phase, step = sys.argv[1:6]
with run_lock(state, run_id=run_id) as lock:
    lock.note(plan=plan, phase=phase, step=step)
    print("holding", flush=True)
    time.sleep(600)
"""


def hold_run_lock(state: Path, run_id: str, plan: str = "plans/plan.md", phase: str = "phase-1",
                  step: str = "step-1") -> subprocess.Popen:
    """A live process that really holds `state`'s run lock (as `runbook next` does, naming the run,
    plan, phase and step) until it is killed; a lock file written by hand is no run in progress."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(state), run_id, plan, phase, step],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
    return proc


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "RUNBOOK_ENV_PROBE": "0", "GIT_TERMINAL_PROMPT": "0"}
    env.pop("RUNBOOK_RELIABILITY_COUNTS", None)
    env.update(extra or {})
    return env


def runbook(repo: Path, *args: str, timeout: float = 120, env: dict[str, str] | None = None,
            input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*RUNBOOK, *args], cwd=repo, capture_output=True, text=True, env=cli_env(env), timeout=timeout,
        input=input, stdin=None if input is not None else subprocess.DEVNULL,
    )


@functools.cache
def _child_codec() -> tuple[str, tuple[str, str]]:
    """The encoding of a child interpreter's stdout, and its stdout's and stderr's error handlers, in
    this environment (asked once: they follow the locale, PYTHONIOENCODING, UTF-8 mode)."""
    probe = "import sys; print(sys.stdout.encoding, sys.stdout.errors, sys.stderr.errors)"
    encoding, out, err = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                        check=True, env=cli_env()).stdout.split()
    return encoding, (out, err)


@contextlib.contextmanager
def _as_child(cwd: Path, env: dict[str, str], input: str | None):
    """This process made to look like `subprocess.run`'s child for a while: cwd, the whole environment,
    stdin (`input`, else /dev/null), and fds 1 and 2 (and sys.stdout/sys.stderr) on temp files; yields
    a function that reads back (stdout, stderr) as `text=True` would (the locale's codec, strict, and
    universal newlines).
    Everything is restored afterwards, as are the signal handlers a verb might leave set."""
    import io
    import locale
    import signal
    import tempfile

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_streams = (sys.stdin, sys.stdout, sys.stderr)
    saved_argv = sys.argv
    saved_signals = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    encoding, errors = _child_codec()
    ours = locale.getpreferredencoding(False)  # how subprocess.run(text=True) encodes input, decodes output
    files = [tempfile.TemporaryFile() for _ in range(2)]
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved_fds = [os.dup(1), os.dup(2)]
    streams: list[io.TextIOWrapper] = []
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        os.dup2(files[0].fileno(), 1)
        os.dup2(files[1].fileno(), 2)
        # what a Python child gets on pipes: its codec and error handlers, a line-buffered stderr
        streams = [io.TextIOWrapper(open(fd, "wb", closefd=False), encoding=encoding, errors=errors[fd - 1],  # noqa: SIM115
                                    line_buffering=fd == 2, write_through=fd == 2) for fd in (1, 2)]
        sys.stdout, sys.stderr = streams
        # `input` as subprocess.run(text=True) sends it (the locale's codec), read as the child reads stdin
        sys.stdin = (io.TextIOWrapper(io.BytesIO(input.encode(ours)), encoding=encoding, errors=errors[0])
                     if input is not None else open(os.devnull))  # noqa: SIM115

        def read() -> tuple[str, str]:
            for stream in streams:
                stream.flush()
            out = []
            for handle in files:
                handle.seek(0)
                out.append(io.TextIOWrapper(io.BytesIO(handle.read()), encoding=ours, newline=None).read())
            return out[0], out[1]

        yield read
    finally:
        for stream in streams:
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdin.close()
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        sys.argv = saved_argv
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        for fd in saved_fds:
            os.close(fd)
        for handle in files:
            handle.close()
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for sig, handler in saved_signals.items():
            if handler is not None:
                signal.signal(sig, handler)


def _forget_process_state(package: str) -> None:
    """What a fresh process would not know: `package`'s per-process caches (runbook's index key read from
    $XDG_CACHE_HOME, its template environment; every functools cache of the package's own functions), so
    that each in-process call starts as a new process."""
    for name, module in list(sys.modules.items()):
        if name == package or name.startswith(f"{package}."):
            if getattr(module, "_KEY", None) is not None:
                module._KEY = None  # type: ignore[attr-defined]
            for value in list(vars(module).values()):
                if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", None) == name:
                    value.cache_clear()


def _cli_inproc(package: str, script: list[str], cwd: Path, args: tuple[str, ...], timeout: float,
                env: dict[str, str] | None, input: str | None) -> subprocess.CompletedProcess:
    """`package.cli.main` run as the console script `script` would run it, in this process (see runbook_inproc)."""
    import importlib

    main = importlib.import_module(f"{package}.cli").main
    return _main_inproc(main, [*script, *args], script[0] if len(script) == 1 else package, (package,), cwd, args,
                        timeout, env, input)


def _main_inproc(main: Callable[[], object], argv: list[str], argv0: str, packages: tuple[str, ...], cwd: Path,
                 args: tuple[str, ...], timeout: float, env: dict[str, str] | None,
                 input: str | None) -> subprocess.CompletedProcess:
    """`main()` run in this process as a child would run it, with sys.argv `[argv0, *args]` after
    `packages`' per-process state is forgotten; `argv` names the command in a TimeoutExpired. An int that
    `main` returns is the exit status, as `sys.exit(main())` makes it."""
    import signal

    class _Overran(BaseException):  # past the verbs' `except Exception`, as a kill would be
        pass

    def overran(_signum: int, _frame: object) -> None:
        raise _Overran

    code: int | str | None = 0
    for package in packages:
        _forget_process_state(package)
    with _as_child(cwd, cli_env(env), input) as read:
        sys.argv = [argv0, *args]
        alarm = signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
        if alarm:
            signal.signal(signal.SIGALRM, overran)
            # then every half second: a hang in a verb's own cleanup after the first alarm ends too
            signal.setitimer(signal.ITIMER_REAL, timeout, 0.5)
        try:
            returned = main()
            if isinstance(returned, int):
                code = returned
        except SystemExit as exc:  # the console script's exit
            code = exc.code
        except _Overran:
            signal.setitimer(signal.ITIMER_REAL, 0)
            stdout, stderr = read()
            raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr) from None
        finally:
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
        stdout, stderr = read()
    if code is None:
        returncode = 0
    elif isinstance(code, int):
        returncode = code
    else:  # sys.exit("message"): printed on stderr, status 1
        stderr += f"{code}\n"
        returncode = 1
    return subprocess.CompletedProcess(argv, returncode, stdout, stderr)


def runbook_inproc(repo: Path, *args: str, timeout: float = 120, env: dict[str, str] | None = None,
                   input: str | None = None) -> subprocess.CompletedProcess:
    """`runbook(repo, *args)` without the subprocess: the CLI's `main` (as the console script calls it,
    argv and all) in this process, with the child's cwd, environment, stdin and output streams; the same
    CompletedProcess back. Never from a thread (cwd, environment and fds are the process's). Past
    `timeout` seconds it fails like `subprocess.run` (TimeoutExpired; SIGALRM, where no one else uses
    it: under pytest-timeout's signal method its own limit applies instead)."""
    return _cli_inproc("runbook", RUNBOOK, repo, args, timeout, env, input)


def eagle_inproc(*args: str, cwd: Path = REPO, timeout: float = 600, env: dict[str, str] | None = None,
                 input: str | None = None) -> subprocess.CompletedProcess:
    """`eagle ARGS` as runbook_inproc runs runbook: eagle.cli's `main` in this process, with a child's cwd,
    environment, stdin and fds 1 and 2, the CompletedProcess a subprocess gives back. For tests that read
    only the output, exit code and files (torch, transformers and safetensors are imported once per test
    process instead of once per call, ~3-4 s of CPU each); a subprocess stays for signals, torchrun, vLLM's
    own processes and the console script itself."""
    return _cli_inproc("eagle", EAGLE, cwd, args, timeout, env, input)


def module_inproc(module: str, *args: str, cwd: Path = REPO, timeout: float = 600, env: dict[str, str] | None = None,
                  input: str | None = None) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` for a module whose `__main__` block is `sys.exit(main())` (bench.step_times),
    run as eagle_inproc runs eagle: its `main` in this process, with a child's cwd, environment, stdin and
    fds 1 and 2, and eagle's and the module's package's per-process caches forgotten first."""
    import importlib

    main = importlib.import_module(module).main
    return _main_inproc(main, [sys.executable, "-m", module, *args], module, (module.split(".")[0], "eagle"), cwd,
                        args, timeout, env, input)


def popen_runbook(repo: Path, *args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [*RUNBOOK, *args], cwd=repo, env=cli_env(env), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )


def kill_9_once(repo: Path, args: tuple[str, ...], env: dict[str, str] | None, until: Callable[[], object],
                message: str, timeout: float = 60) -> None:
    """Start `runbook ARGS` in `repo`, wait until `until()` is true, then SIGKILL it: the process this
    call started, nothing else (its pipes are drained and it is reaped)."""
    import signal

    proc = popen_runbook(repo, *args, env=env)
    try:
        wait_for(until, timeout=timeout, message=message)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def python_snippet(code: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`code` (dedented) run by a fresh interpreter with a bare environment (PATH, one OpenMP thread): what a
    process starting clean does on import, output captured as text."""
    import textwrap

    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})


def assert_no_traceback(result: subprocess.CompletedProcess | tuple[str, str], what: str = "") -> None:
    out, err = (result.stdout, result.stderr) if not isinstance(result, tuple) else result
    for stream in (out or "", err or ""):
        assert "Traceback (most recent call last)" not in stream, f"{what}: traceback:\n{stream[-3000:]}"


def assert_criterion_error(text: str, col: int, fragment: str) -> None:
    """parse_criterion(text) refuses it with a message holding `fragment`, pointing at column `col`."""
    import pytest

    from runbook.plan.criteria import CriterionError, parse_criterion

    with pytest.raises(CriterionError) as info:
        parse_criterion(text)
    assert fragment in info.value.message
    assert info.value.col == col


def tree_snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file under `root` (relative path -> bytes); .git is included."""
    snap: dict[str, bytes] = {}
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                snap[path.relative_to(root).as_posix()] = path.read_bytes()
    return snap


def committed_runs(repo: Path) -> dict[str, dict]:
    """run id -> the run JSON as committed at HEAD (state/runs/*.json)."""
    out = git(repo, "ls-tree", "-r", "--name-only", "HEAD", "--", "state/runs", check=False)
    runs: dict[str, dict] = {}
    for name in out.split():
        if name.endswith(".json"):
            data = json.loads(git(repo, "show", f"HEAD:{name}"))
            runs[data["run_id"]] = data
    return runs


def load_test_module(path: str):
    """The test module at `tests/<path>`, imported by its file (tests that reuse another module's
    plan or cases: test modules are not on sys.path, only tests/support/ is)."""
    import importlib.util

    name = "tests_" + path.removesuffix(".py").replace("/", "_")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "tests" / path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
