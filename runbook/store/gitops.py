"""Git, the only module that imports gitpython (and only when it talks to a repository).

`commit_paths` commits exactly the files runbook wrote, through a temporary index built from HEAD
(GIT_INDEX_FILE), so the user's other staged and unstaged changes stay exactly as they were. The
real index is then updated for those paths only, so `git status` shows them clean. Commits are made
with plumbing (`write-tree`, `commit-tree`, `update-ref`): commit hooks do not run (a
`reference-transaction` hook that refuses the update does stop it), a detached HEAD stays detached
(and moves), a repository with no commits gets its first one, and `commit.gpgsign` is honoured
(`commit-tree -S`: signed with the user's key and `gpg.format`, or refused when signing fails). In
the middle of a merge, rebase, cherry-pick, revert or bisect, or for a file git ignores, it refuses
with `GitStateError`.

Side branch (`run_branch = "runbook/{branch}"` in runbook.toml; default: off): runbook's commits go
onto that branch instead of HEAD's (`{branch}` is the checked-out branch, `detached` on a detached
HEAD). It always descends from HEAD (`_side_base`: its first commit and one after HEAD merged it
start from HEAD; one after the user committed on HEAD merges HEAD in), so it holds every run in
order, none of them lands on the shared branch until the user merges it, and that merge is a
fast-forward (`git merge runbook/main`, or `git merge --squash runbook/main && git commit`). The
files are staged in the real index as usual, which is what lets that merge go through: `git status`
shows runbook's files as staged changes meanwhile, and a commit of the user's own takes them too.
What "committed" means for runbook's own bookkeeping (`is_dirty`, `dirty_paths`, `record_ref`) is
then the side branch's tip, not HEAD.

Every git command of a commit runs through `_git_waited`, in a process group of its own (its hooks
with it: `reference-transaction`, `post-index-change`, `pre-auto-gc`): one that does not finish in
`RUNBOOK_GIT_TIMEOUT_S` seconds (default 120), or that is still running a few seconds after runbook
was interrupted, is killed with its whole group (which runbook made) and the commit is refused with
`GitStateError`; the run stays recorded on disk and the next `runbook next` commits it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import git

_IN_PROGRESS = (
    ("MERGE_HEAD", "a merge", "git merge --continue / git merge --abort"),
    ("rebase-merge", "a rebase", "git rebase --continue / git rebase --abort"),
    ("rebase-apply", "a rebase or `git am`", "git rebase --continue / git rebase --abort"),
    ("CHERRY_PICK_HEAD", "a cherry-pick", "git cherry-pick --continue / git cherry-pick --abort"),
    ("REVERT_HEAD", "a revert", "git revert --continue / git revert --abort"),
    ("BISECT_LOG", "a bisect", "git bisect reset"),
)


class GitStateError(Exception):
    """The repository is in a state where runbook will not commit; the message says what to do."""


GIT_TIMEOUT_ENV = "RUNBOOK_GIT_TIMEOUT_S"
GIT_TIMEOUT_S = 120.0  # the longest one git command of a commit may take (hooks included)
STOP_GRACE_S = 3.0  # after an interrupt, git gets this long to finish before it is killed
KILL_GRACE_S = 2.0  # after SIGTERM, before SIGKILL
_POLL_S = 0.1


def _git_timeout() -> float:
    text = os.environ.get(GIT_TIMEOUT_ENV, "")
    try:
        value = float(text)
    except ValueError:
        return GIT_TIMEOUT_S
    return value if value > 0 else GIT_TIMEOUT_S


class _GitFailed(Exception):
    """git exited non-zero; `stderr` holds what it said."""

    def __init__(self, stderr: str) -> None:
        super().__init__(stderr)
        self.stderr = stderr


def _exited(pid: int) -> bool:
    """Whether our child `pid` has exited, without reaping it (it stays a zombie holding its pid)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _git_waited(root: str | os.PathLike[str], args: list[str], *, env: dict[str, str] | None = None,
                stop: Callable[[], bool] | None = None, own_group: bool = True) -> str:
    """`git ARGS` in `root`: its stdout (stripped of the last newline), `_GitFailed` when it exits
    non-zero, `GitStateError` when it outlives the timeout or `stop()` turns true (an interrupt)
    and does not finish within STOP_GRACE_S. Output goes to temp files, so a hook's leftover child
    cannot keep a pipe open. `own_group`: git and its hooks get a process group of their own, which
    is killed whole (runbook made that group; nothing else is signalled); off for `commit-tree`,
    whose signing program may ask for a passphrase on the terminal."""
    timeout = _git_timeout()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(["git", *args], cwd=root, env={**os.environ, **(env or {})},
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                process_group=0 if own_group else None)
        deadline = time.monotonic() + timeout
        stopped_at: float | None = None

        def kill() -> None:
            """SIGTERM (git then removes its lock files, e.g. HEAD.lock), then SIGKILL to whatever is
            left. git is not reaped until the end, so its pid, and the group named by it, stay ours."""
            send = (lambda signum: os.killpg(proc.pid, signum)) if own_group else proc.send_signal
            with contextlib.suppress(ProcessLookupError):
                send(signal.SIGTERM)
            until = time.monotonic() + KILL_GRACE_S
            while time.monotonic() < until and not _exited(proc.pid):
                time.sleep(_POLL_S / 2)
            with contextlib.suppress(ProcessLookupError):
                send(signal.SIGKILL)  # a hook's children that outlived git go too
            proc.wait()

        try:
            while True:
                try:
                    code = proc.wait(timeout=_POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if stopped_at is None and stop is not None and stop():
                    stopped_at = now
                why = (f"did not finish in {timeout:g} s" if now >= deadline
                       else "was stopped: runbook was interrupted" if stopped_at is not None
                       and now - stopped_at >= STOP_GRACE_S else None)
                if why is not None:
                    kill()
                    raise GitStateError(
                        f"`git {args[0]}` {why} and was killed (a git hook that hangs? see "
                        f"`git config core.hooksPath`, else .git/hooks/; {GIT_TIMEOUT_ENV} sets the limit)")
        except BaseException:  # Ctrl-C (KeyboardInterrupt) while it runs: git and its hooks go too
            if proc.returncode is None:
                kill()
            raise
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
    if code != 0:
        raise _GitFailed(stderr or f"git {args[0]} exited with {code}")
    return stdout.removesuffix("\n")


def blob_hash(data: bytes) -> str:
    """The git blob id (SHA-1) of `data`, as `git hash-object` prints it."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def git_dir(root: str | os.PathLike[str]) -> Path | None:
    """The git directory of a work tree root (follows a `.git` file of a linked worktree)."""
    dot = Path(root) / ".git"
    if dot.is_dir():
        return dot
    if dot.is_file():
        text = dot.read_text(encoding="utf-8", errors="replace").strip()
        if text.startswith("gitdir:"):
            target = Path(text[len("gitdir:") :].strip())
            return target if target.is_absolute() else (Path(root) / target).resolve()
    return None


def _repo(root: str | os.PathLike[str]) -> git.Repo:
    import git  # imported only when runbook talks to git

    try:
        return git.Repo(str(root))
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise GitStateError(f"{root} is not a git repository") from exc


def _git_error() -> type[git.GitCommandError]:
    import git

    return git.GitCommandError


def head_commit(root: str | os.PathLike[str]) -> str | None:
    """The commit HEAD points at; None in a repository with no commits yet."""
    repo = _repo(root)
    try:
        head: str = repo.git.rev_parse("--verify", "-q", "HEAD")
    except _git_error():
        return None
    return head


def in_progress(root: str | os.PathLike[str]) -> str | None:
    """A sentence naming the operation in progress (merge, rebase, ...) and the way out, or None."""
    gdir = git_dir(root)
    if gdir is None:
        return None
    for name, what, way_out in _IN_PROGRESS:
        if (gdir / name).exists():
            return f"{what} is in progress in {root}; finish it or abort it ({way_out}), or pass --no-commit"
    return None


def check_can_commit(root: str | os.PathLike[str], paths: list[str] | None = None) -> None:
    """Raise GitStateError when a commit would fail: operation in progress, no identity, one of
    `paths` (repo-relative) ignored by git."""
    busy = in_progress(root)
    if busy:
        raise GitStateError(busy)
    repo = _repo(root)
    _refuse_ignored(repo, paths or [])
    try:
        repo.git.var("GIT_COMMITTER_IDENT")
        repo.git.var("GIT_AUTHOR_IDENT")
    except _git_error() as exc:
        raise GitStateError(
            "git does not know who you are: set it with `git config user.name NAME` and "
            "`git config user.email EMAIL`, or pass --no-commit"
        ) from exc


def _refuse_ignored(repo: git.Repo, paths: list[str]) -> None:
    """GitStateError naming the paths git ignores (untracked and matched by an ignore rule)."""
    if not paths:
        return
    try:
        out = repo.git.check_ignore("-v", "--", *paths)
    except _git_error() as exc:
        if getattr(exc, "status", None) == 1:
            return  # none is ignored
        raise GitStateError(f"git check-ignore failed: {_detail(exc)}") from exc
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines:
        return
    shown = []
    for line in lines[:5]:
        source, _, path = line.partition("\t")
        shown.append(f"{path} (ignored by {source.rsplit(':', 1)[0]})")
    raise GitStateError(
        f"{'; '.join(shown)}: runbook commits only files git would commit; stop ignoring "
        f"{'it' if len(lines) == 1 else 'them'} (change the ignore rule, or `git add -f` once), or pass --no-commit"
    )


def _status(root: str | os.PathLike[str], *args: str) -> str:
    """`git status ARGS` as a reader: GIT_OPTIONAL_LOCKS=0, so git does not refresh and write the
    index (which runs the post-index-change hook: a hook that hung there used to hang `runbook next`
    before its first step), and bounded like every git command runbook waits on. GitStateError when
    git fails or outlives the timeout."""
    top = _repo(root).working_tree_dir or root
    try:
        return _git_waited(top, ["status", *args], env={"GIT_OPTIONAL_LOCKS": "0"})
    except _GitFailed as exc:
        raise GitStateError(f"`git status` failed: {_detail(exc)}") from exc


def changed_tracked(root: str | os.PathLike[str], limit: int = 100) -> list[str]:
    """Tracked files whose work-tree or index content differs from HEAD (repo-relative, at most `limit`)."""
    try:
        out = _status(root, "--porcelain=v1", "-z", "--untracked-files=no")
    except GitStateError:
        return []
    paths: list[str] = []
    entries = out.split("\0")
    i = 0
    while i < len(entries) and len(paths) < limit:
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        status, path = entry[:2], entry[3:]
        if "R" in status or "C" in status:
            i += 1  # the next entry is the rename's source
        paths.append(path)
    return paths


def _sign_args(repo: git.Repo) -> list[str]:
    """`-S` when the user asked git to sign commits (commit.gpgsign), else nothing."""
    try:
        value = repo.git.config("--bool", "--get", "commit.gpgsign")
    except _git_error():
        return []
    return ["-S"] if value.strip() == "true" else []


def is_dirty(root: str | os.PathLike[str], path: str) -> bool:
    """True when `path` (repo-relative) differs from HEAD in the index or work tree, or is untracked."""
    ref = record_ref(root)
    if ref != "HEAD":
        return bool(_changed_vs(root, ref, path))
    out = _status(root, "--porcelain", "--untracked-files=all", "--", path)
    return bool(out.strip())


def dirty_paths(root: str | os.PathLike[str], path: str) -> set[str]:
    """Paths under `path` (repo-relative) that differ from HEAD in the index or work tree, or are
    untracked: one `git status` for a whole directory (`is_dirty` asks about one path). With a side
    branch (`run_branch`), against its tip instead of HEAD."""
    ref = record_ref(root)
    if ref != "HEAD":
        return _changed_vs(root, ref, path)
    out = _status(root, "--porcelain=v1", "-z", "--untracked-files=all", "--", path)
    found: set[str] = set()
    entries = out.split("\0")
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        found.add(entry[3:])
        if "R" in entry[:2] or "C" in entry[:2]:
            if i < len(entries) and entries[i]:
                found.add(entries[i])  # the rename's source
            i += 1
    return found


def show_blob(root: str | os.PathLike[str], blob: str) -> str | None:
    """The text of a blob by id, None if the repository does not have it."""
    try:
        repo = _repo(root)
        text: str = repo.git.cat_file("-p", blob, strip_newline_in_stdout=False)
    except (GitStateError, _git_error()):
        return None
    return text


def changed_files(root: str | os.PathLike[str], commit: str, other: str | None = None) -> list[str] | None:
    """Tracked paths (repo-relative) that differ between `commit` and the work tree (or commit
    `other`); None when git cannot tell (no such commit). Runs the git binary, so readers stay free
    of gitpython."""
    import subprocess

    try:
        done = subprocess.run(
            ["git", "diff", "--name-only", "--no-renames", "-z", commit, *([other] if other else []), "--"],
            cwd=root, capture_output=True, timeout=30, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [p for p in done.stdout.decode("utf-8", "replace").split("\0") if p]


def short(commit: str | None) -> str:
    return commit[:7] if commit else ""


def commit_paths(root: str | os.PathLike[str], paths: list[str], message: str, *,
                 stop: Callable[[], bool] | None = None, contents: Mapping[str, bytes] | None = None) -> str | None:
    """Commit exactly `paths` (repo-relative) as they are in the work tree; returns the new commit.

    `contents`: some of `paths` committed with these bytes instead of the work tree's (a person's
    plan edits without the write-back of a run committed next); the real index gets the same
    blob, so what the work tree holds beyond it shows as an unstaged change.
    Returns None when they are unchanged since HEAD. Raises GitStateError during a merge, rebase,
    cherry-pick, revert or bisect, when git refuses, or when a git command (a hook) hangs past the
    timeout or past `stop()` turning true (runbook interrupted meanwhile).
    """
    given = dict(contents or {})
    busy = in_progress(root)
    if busy:
        raise GitStateError(busy)
    repo = _repo(root)
    error = _git_error()
    head = head_commit(root)
    gdir = Path(repo.git_dir)
    index_lock = gdir / "index.lock"
    if index_lock.exists():
        # Refuse before committing: a commit whose index refresh then fails leaves the user's
        # index holding the old blobs of our files.
        raise GitStateError(
            f"{index_lock} exists: another git command is running in this repository; wait for it "
            "to finish, or remove the file if no git process is running"
        )
    _remove_dead_temp_indexes(gdir)
    _refuse_ignored(repo, [p for p in paths if (Path(root) / p).exists()])
    side = side_ref(root)
    base, parents_of, overlay = head, [head] if head else [], None
    if side is not None:
        base, parents_of, overlay = _side_base(top_of(repo, root), side, head)
    tmp_index = gdir / f"index.runbook.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp_index.unlink()
    env = {"GIT_INDEX_FILE": str(tmp_index)}
    top = repo.working_tree_dir or root

    def waited(*args: str, **kw: object) -> str:
        return _git_waited(top, list(args), stop=stop, **kw)  # type: ignore[arg-type]

    try:
        try:
            waited("read-tree", base or "--empty", env=env)
            if overlay:
                for info in overlay:  # the side branch's own files over HEAD's tree
                    waited("update-index", "--add", "--cacheinfo", info, env=env)
            tracked = set(repo.git.ls_files("--", *paths, env=env).splitlines()) if paths else set()
            present = [p for p in paths if (Path(root) / p).exists() or p in tracked or p in given]
            from_tree = [p for p in present if p not in given]
            if from_tree:
                waited("update-index", "--add", "--remove", "--", *from_tree, env=env)
            blobs = [_cache_info(repo, path, data, waited, env) for path, data in given.items()]
            for info in blobs:
                waited("update-index", "--add", "--cacheinfo", info, env=env)
            tree = waited("write-tree", env=env)
            if parents_of and tree == repo.git.rev_parse(f"{parents_of[0]}^{{tree}}"):
                commit = None  # nothing new; still refresh the index below (a killed run may have left it stale)
            else:
                parents = [arg for parent in parents_of for arg in ("-p", parent)]
                commit = waited("commit-tree", tree, *parents, *_sign_args(repo), "-m", message, own_group=False)
                if side is None:
                    waited("update-ref", "-m", message, "HEAD", commit, head or "")
                else:
                    old_tip = _rev(top, side)
                    waited("update-ref", "-m", message, side, commit, old_tip or "")
        except (error, _GitFailed) as exc:
            raise GitStateError(f"git refused the commit: {_detail(exc)}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp_index.unlink()
    # keep `git status` clean for our paths; the user's other index entries are untouched
    if present:
        try:
            if from_tree:
                waited("update-index", "--add", "--remove", "--", *from_tree)
            for info in blobs:
                waited("update-index", "--add", "--cacheinfo", info)
        except (error, _GitFailed, GitStateError) as exc:
            # Only a git process that started after the check above gets here. The commit is made,
            # but the real index still holds the old blobs: a plain `git commit` would revert them.
            raise GitStateError(
                f"the commit {short(commit)} is made, but git's index could not be updated for "
                f"{', '.join(present)}: {_detail(exc)}; run `git reset -q -- {' '.join(present)}`"
            ) from exc
    if commit:
        _gc_auto(top, stop)
    return commit


def top_of(repo: git.Repo, root: str | os.PathLike[str]) -> str | os.PathLike[str]:
    return repo.working_tree_dir or root


def _rev(root: str | os.PathLike[str], ref: str) -> str | None:
    try:
        return _git_waited(root, ["rev-parse", "--verify", "-q", ref + "^{commit}"]) or None
    except (_GitFailed, GitStateError):
        return None


def _is_ancestor(root: str | os.PathLike[str], a: str, b: str) -> bool:
    try:
        _git_waited(root, ["merge-base", "--is-ancestor", a, b])
    except (_GitFailed, GitStateError):
        return False
    return True


def _side_base(top: str | os.PathLike[str], side: str, head: str | None) -> tuple[str | None, list[str], list[str]]:
    """Where a commit on the side branch starts: (the tree to read, its parents, `--cacheinfo`
    entries laid over that tree). The side branch always descends from HEAD, so merging it is a
    fast-forward (or a squash of one): its first commit, and one after HEAD merged it, starts from
    HEAD; one after HEAD moved on (the user's own commits) is a merge of HEAD into it, HEAD's tree
    with the files the side branch changed since their merge base taken from its tip."""
    tip = _rev(top, side)
    if tip is None or head is None or _is_ancestor(top, tip, head):
        return head, [head] if head else [], []
    if _is_ancestor(top, head, tip):
        return tip, [tip], []
    try:
        base = _git_waited(top, ["merge-base", head, tip])
        changed = [p for p in _git_waited(top, ["diff", "--name-only", "-z", "--no-renames", base, tip]).split("\0") if p]
        listed = _git_waited(top, ["ls-tree", "-z", tip, "--", *changed]) if changed else ""
    except _GitFailed as exc:
        raise GitStateError(f"cannot bring {side} up to HEAD: {_detail(exc)}") from exc
    overlay = []
    for entry in filter(None, listed.split("\0")):
        meta, path = entry.split("\t", 1)
        mode, _kind, blob = meta.split()
        overlay.append(f"{mode},{blob},{path}")
    return head, [tip, head], overlay


def side_ref(root: str | os.PathLike[str]) -> str | None:
    """`refs/heads/<run_branch>` when runbook.toml asks for a side branch, else None."""
    from runbook.store.project import ConfigError, load_config

    try:
        template = load_config(root).run_branch
    except ConfigError:
        return None
    if not template:
        return None
    try:
        branch = _git_waited(root, ["symbolic-ref", "--short", "-q", "HEAD"]) or "detached"
    except (_GitFailed, GitStateError):
        branch = "detached"
    return "refs/heads/" + template.replace("{branch}", branch)


def record_ref(root: str | os.PathLike[str]) -> str:
    """What runbook's commits are on: the side branch's tip while HEAD has not merged it, else HEAD."""
    side = side_ref(root)
    if side is None:
        return "HEAD"
    tip = _rev(root, side)
    head = _rev(root, "HEAD")
    if tip is None or (head is not None and _is_ancestor(root, tip, head)):
        return "HEAD"
    return side


def _changed_vs(root: str | os.PathLike[str], ref: str, path: str) -> set[str]:
    """Paths under `path` whose work-tree content differs from commit `ref`, or that are untracked."""
    top = _repo(root).working_tree_dir or root
    try:
        diff = _git_waited(top, ["diff", "--name-only", "-z", "--no-renames", ref, "--", path],
                           env={"GIT_OPTIONAL_LOCKS": "0"})
        others = _git_waited(top, ["ls-files", "--others", "--exclude-standard", "-z", "--", path])
    except _GitFailed as exc:
        raise GitStateError(f"`git diff {ref}` failed: {_detail(exc)}") from exc
    return {p for p in (diff + "\0" + others).split("\0") if p}


def _cache_info(repo: git.Repo, path: str, data: bytes, waited: Callable[..., str], env: dict[str, str]) -> str:
    """`MODE,BLOB,PATH` for `update-index --cacheinfo`: `data` stored as the blob of `path` (through
    the path's filters, as `git add` would), with the mode the index (`env`'s) gives it, else 100644."""
    fd, name = tempfile.mkstemp(prefix="runbook-blob.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        blob = waited("hash-object", "-w", f"--path={path}", "--", name, env=env)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
    staged = repo.git.ls_files("-s", "--", path, env=env).split()
    mode = staged[0] if staged and staged[0] in ("100644", "100755") else "100644"
    return f"{mode},{blob},{path}"


def _gc_auto(root: str | os.PathLike[str], stop: Callable[[], bool] | None = None) -> None:
    """`git gc --auto`, as `git commit` runs after each commit (plumbing commits skip it).

    Without it every run leaves a new `state/runs` tree object loose, and a long project's `.git`
    grows by a third of a megabyte a run until some other git command packs it. Run in the
    foreground (no detached gc left behind) and best-effort: the commit is already made.
    """
    with contextlib.suppress(Exception):
        _git_waited(root, ["-c", "gc.autoDetach=false", "gc", "--auto", "--quiet"], stop=stop)


def _remove_dead_temp_indexes(gdir: Path) -> None:
    """Delete temporary indexes (`index.runbook.<pid>`) left by runbook processes that were killed."""
    from runbook.store.procs import pid_alive

    for leftover in gdir.glob("index.runbook.*"):
        pid = leftover.name.rsplit(".", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()


def _detail(exc: Exception) -> str:
    """git's own `fatal:` / `error:` line (it names the file, e.g. a stale index.lock), else its last line."""
    raw = str(getattr(exc, "stderr", "") or exc)
    lines = [line.strip().removeprefix("stderr: ").strip("'") for line in raw.splitlines() if line.strip()]
    for line in lines:
        if line.lower().startswith(("fatal:", "error:")):
            return line
    return lines[-1] if lines else str(exc)
