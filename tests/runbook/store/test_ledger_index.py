"""The ledger's index (runbook/store/index.py) never disagrees with the JSON records.

Every check compares what the index answers with what reading every record gives
(`ledger.load_runs`, the reference): after records are added by hand, deleted, edited in place
(same size, mtime set back), changed by a `git checkout` of an older commit, written by two
processes at once, and after the index file itself is damaged in every way a file can be.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import threading
import time
from pathlib import Path

import helpers as H
import pytest

from runbook.contract import top_metrics
from runbook.formatting import parse_utc
from runbook.model import RunRecord
from runbook.store import index as ledger_index
from runbook.store.index import LedgerIndex, index_path
from runbook.store.ledger import load_runs, run_path, save_run

PLAN_REL = "plans/plan.md"
PLAN = """\
---
runbook: 1
title: Index
---

# Game plan: index

## Phase 0: Probe (~1 min)

Steps:
- [ ] Probe: `if [ -f work/hold ]; then while [ ! -f work/go ]; do sleep 0.05; done; fi; echo '{"score": 3}' > "$RUNBOOK_METRICS"`

Pass: `score >= 2`
On pass: Phase 1

## Phase 1: Train (~2 min)

Steps:
- [ ] Train: `echo '{"acc": 0.9}' > "$RUNBOOK_METRICS"`

Pass: `acc >= 0.5`
On pass: stop
"""


def record(n: int, phase: str = "phase-0", verdict: str = "pass", plan: str = PLAN_REL, **metrics: float) -> RunRecord:
    second = f"{n % 60:02d}"
    return H.run_record(
        run_id=f"20250101-10{n // 60 % 60:02d}{second}-{n:04x}", plan=plan, plan_blob="0" * 40, phase=phase,
        phase_label=phase.removeprefix("phase-"), phase_text_hash="h",
        started=f"2025-01-01T10:{n // 60 % 60:02d}:{second}.000000Z",
        finished=f"2025-01-01T10:{n // 60 % 60:02d}:{second}.500000Z", verdict=verdict,
        metrics=metrics or {"score": float(n)}, reason=f"run {n}",
    )


def reference(state: Path) -> dict:
    """What reading every record says: rows in order, problems, each plan's latest per phase, metrics."""
    problems: list[str] = []
    runs = load_runs(state, problems=problems)
    latest: dict[str, dict[str, RunRecord]] = {}
    metrics: dict[str, dict] = {}
    for run in runs:
        latest.setdefault(run.plan, {})[run.phase] = run
        metrics.setdefault(run.plan, {}).update(top_metrics(run.metrics))
    order = {run.run_id: i for i, run in enumerate(runs)}
    return {
        "ids": [r.run_id for r in runs],
        "problems": problems,
        "latest": {p: sorted((r.run_id for r in by.values()), key=order.__getitem__) for p, by in latest.items()},
        "metrics": metrics,
        "verdicts": [r.verdict for r in runs],
    }


def answered(index: LedgerIndex) -> dict:
    rows = index.rows()
    plans = {r.plan for r in rows}
    return {
        "ids": [r.run_id for r in rows],
        "problems": index.problems,
        "latest": {p: [r.run_id for r in index.latest_rows(p)] for p in plans},
        "metrics": {p: index.latest_metrics(p) for p in plans},
        "verdicts": [r.verdict for r in rows],
    }


def agree(state: Path) -> LedgerIndex:
    """Open the index and check it against the records; also check that a rebuild from nothing agrees."""
    index = LedgerIndex.open(state)
    want = reference(state)
    assert answered(index) == want
    assert answered(LedgerIndex.open(state, save=False)) == want  # the saved file, read back
    scratch = LedgerIndex._rebuild(state, state / "runs", ledger_index._scan(state / "runs"), None, time.time_ns(),
                                   save=False)
    assert answered(scratch) == want
    return index


# ---- by hand --------------------------------------------------------------------------------------


def test_records_added_deleted_and_edited_by_hand_are_noticed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    for n in range(5):
        save_run(state, record(n, "phase-0" if n % 2 else "phase-1"))
    first = agree(state)
    assert first.saved and index_path(state).is_file()
    assert not LedgerIndex.open(state).saved  # nothing changed: the saved index is used as it is

    save_run(state, record(7, "phase-1", "fail", acc=0.1))  # added
    (state / "runs" / "stray.json").write_text("{not json")  # added, unreadable
    index = agree(state)
    assert index.saved and index.latest_rows(PLAN_REL)[-1].run_id == record(7).run_id
    assert len(index.problems) == 1 and "stray.json: skipped, not a readable run record" in index.problems[0]

    run_path(state, record(7).run_id).unlink()  # deleted
    index = agree(state)
    assert record(7).run_id not in index.run_ids()

    # edited in place: same size, mtime set back to what it was (an editor that keeps times)
    path = run_path(state, record(3).run_id)
    before = path.stat()
    text = path.read_text()
    assert '"verdict": "pass"' in text
    with open(path, "r+", encoding="utf-8") as handle:
        handle.write(text.replace('"verdict": "pass"', '"verdict": "fail"'))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
    index = agree(state)
    assert index.rows(PLAN_REL, "phase-0")[-1].verdict == "fail"


def test_an_edit_the_clock_cannot_see_is_caught_while_racy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system whose clock did not tick between two writes of the same size leaves the
    signature as it was: a file that recent is hashed again on every open."""
    state = tmp_path / "state"
    save_run(state, record(1))
    LedgerIndex.open(state)
    stored = ledger_index._Stored.read(index_path(state))
    assert stored is not None and list(stored.head["racy"]) == [run_path(state, record(1).run_id).name]
    path = run_path(state, record(1).run_id)
    path.write_text(path.read_text().replace('"verdict": "pass"', '"verdict": "fail"'))
    same_clock = stored.head["sigs"]
    monkeypatch.setattr(ledger_index, "_scan", lambda folder, dirs=None: dict(same_clock))  # as if nothing had moved
    assert [r.verdict for r in LedgerIndex.open(state).rows()] == ["fail"]
    # the control: the same invisible edit on a file the index trusts (old enough) goes unseen,
    # which is why recent files are hashed
    LedgerIndex.open(state)
    trusted = ledger_index._Stored.read(index_path(state))
    path.write_text(path.read_text().replace('"verdict": "fail"', '"verdict": "pass"'))
    monkeypatch.setattr(ledger_index, "_scan", lambda folder, dirs=None: dict(trusted.head["sigs"]))
    monkeypatch.setattr(ledger_index, "RACY_NS", 0)
    raw = trusted.head | {"racy": {}}
    index_path(state).write_bytes(ledger_index._encode(raw, trusted.rows, trusted.metrics))
    assert [r.verdict for r in LedgerIndex.open(state).rows()] == ["fail"]


def test_odd_entries_are_problems_as_load_runs_words_them(tmp_path: Path) -> None:
    state = tmp_path / "state"
    save_run(state, record(1))
    runs = state / "runs"
    (runs / "dir.json").mkdir()
    (runs / "bad-utf8.json").write_bytes(b'{"run_id": "\xff"}')
    (runs / "deep.json").write_text("[" * 100_000)
    (runs / "dangling.json").symlink_to(runs / "nowhere.json")
    (runs / "link.json").symlink_to(run_path(state, record(1).run_id))  # a readable duplicate
    (runs / "schema.json").write_text(json.dumps({"run_id": "x"}))
    (runs / "notes.txt").write_text("not a record")
    index = agree(state)
    assert len(index.problems) == 5
    assert [r.name for r in index.rows()] == [run_path(state, record(1).run_id).name, "link.json"]
    assert not LedgerIndex.open(state).saved  # the unreadable ones are remembered, or tried again, unchanged
    (runs / "nowhere.json").write_text(run_path(state, record(1).run_id).read_text())  # the dangling link heals
    assert len(agree(state).problems) == 4


# ---- git ------------------------------------------------------------------------------------------


def test_git_checkout_of_an_older_commit_is_noticed(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN)
    state = repo / "state"
    save_run(state, record(1))
    save_run(state, record(2, "phase-1", "fail", acc=0.2))
    H.git(repo, "add", "state")
    H.git(repo, "commit", "-qm", "two runs")
    older = H.git(repo, "rev-parse", "HEAD").strip()
    save_run(state, record(3, "phase-1", "pass", acc=0.8))
    path = run_path(state, record(2).run_id)
    path.write_text(path.read_text().replace('"verdict": "fail"', '"verdict": "pass"'))  # same size
    H.git(repo, "add", "state")
    H.git(repo, "commit", "-qm", "a third run, the second rewritten")
    assert agree(state).latest_metrics(PLAN_REL)["acc"] == 0.8
    H.git(repo, "checkout", "-q", older)  # the third run goes, the second comes back as it was
    index = agree(state)
    assert index.run_ids() == {record(1).run_id, record(2).run_id}
    assert index.rows()[-1].verdict == "fail" and index.latest_metrics(PLAN_REL)["acc"] == 0.2
    H.git(repo, "checkout", "-q", "main")
    assert len(agree(state).rows()) == 3
    # the CLI reads through the same index: history and status see the checkout too
    H.git(repo, "checkout", "-q", older)
    history = json.loads(H.runbook_inproc(repo, "history", "--json").stdout)["result"]
    assert [r["run_id"] for r in history["runs"]] == [record(1).run_id, record(2).run_id]
    status = json.loads(H.runbook_inproc(repo, "status", "--json").stdout)["result"]
    assert [p["verdict"] for p in status["phases"]] == ["pass", "fail"]


def test_the_index_is_gitignored_even_without_an_entry(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN)  # a .gitignore written before the index existed
    save_run(repo / "state", record(1))
    H.git(repo, "add", "state")
    H.git(repo, "commit", "-qm", "a run")
    assert H.runbook_inproc(repo, "status").returncode == 0
    assert index_path(repo / "state").is_file()
    assert H.git(repo, "status", "--porcelain", "--untracked-files=all") == ""


# ---- damage ---------------------------------------------------------------------------------------


def _flip(offset_of):
    def damage(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[offset_of(data)] ^= 0x01
        path.write_bytes(bytes(data))

    return damage


def _section_start(k: int):
    def offset(data: bytearray) -> int:
        import struct

        start = len(ledger_index._MAGIC) + ledger_index._HEADER.size
        fields = ledger_index._HEADER.unpack_from(bytes(data), len(ledger_index._MAGIC))
        for i in range(k):
            start += fields[2 * i]
        assert struct.calcsize("<Q") == 8
        return start + fields[2 * k] // 2

    return offset


DAMAGE = {
    "garbage": lambda p: p.write_bytes(os.urandom(4096)),
    "empty": lambda p: p.write_bytes(b""),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
    "other version": lambda p: p.write_bytes(b"RBLEDGR\x00" + p.read_bytes()[8:]),
    "flipped head": _flip(_section_start(0)),
    "flipped rows": _flip(_section_start(1)),
    "flipped metrics": _flip(_section_start(2)),
    "another ledger's index": None,
}


@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_damaged_index_is_rebuilt_never_trusted(tmp_path: Path, how: str) -> None:
    state = tmp_path / "state"
    for n in range(6):
        save_run(state, record(n, f"phase-{n % 2}", "pass" if n % 3 else "fail"))
    LedgerIndex.open(state)
    path = index_path(state)
    if how == "another ledger's index":
        other = tmp_path / "other"
        save_run(other, record(40, "phase-0", "error"))
        LedgerIndex.open(other)
        shutil.copy(index_path(other), path)
    else:
        DAMAGE[how](path)
    index = LedgerIndex.open(state)
    assert answered(index) == reference(state)
    assert index.saved or how in ("flipped rows", "flipped metrics")  # those are found when read
    assert answered(agree(state)) == reference(state)
    assert not LedgerIndex.open(state).saved  # rewritten whole: trusted again


def test_an_index_runbook_did_not_write_here_is_not_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An index file that lies (a verdict changed, checksums recomputed) but was sealed with another
    key (someone else's cache, a file committed or crafted) is rebuilt, never unmarshalled."""
    state = tmp_path / "state"
    save_run(state, record(1, verdict="fail"))
    LedgerIndex.open(state)
    stored = ledger_index._Stored.read(index_path(state))
    lying, metrics = [row[:7] + ("pass",) + row[8:] for row in stored.rows], stored.metrics
    monkeypatch.setattr(ledger_index, "_KEY", b"k" * 32)  # another user's secret
    index_path(state).write_bytes(ledger_index._encode(stored.head, lying, metrics))
    monkeypatch.undo()
    index = LedgerIndex.open(state)
    assert index.saved and [r.verdict for r in index.rows()] == ["fail"]


def test_an_unwritable_index_place_still_answers(tmp_path: Path) -> None:
    state = tmp_path / "state"
    save_run(state, record(1))
    index_path(state).mkdir(parents=True)  # something that is not a file where the index goes
    index = LedgerIndex.open(state)
    assert not index.saved and answered(index) == reference(state)


# ---- concurrency ----------------------------------------------------------------------------------


def _writer(state: str, offset: int, count: int) -> None:
    for n in range(offset, offset + count):
        save_run(state, record(n, f"phase-{n % 3}", ("pass", "fail", "error")[n % 3]))
        if n % 5 == 4:  # and take one back
            run_path(state, record(n - 2).run_id).unlink(missing_ok=True)
        LedgerIndex.open(state)


def _reader(state: str, stop_at: float) -> None:
    while time.monotonic() < stop_at:
        index = LedgerIndex.open(state)
        ids = index.run_ids()
        assert len(ids) == len(index.rows())


def test_two_writers_and_readers_at_once_leave_it_consistent(tmp_path: Path) -> None:
    state = tmp_path / "state"
    save_run(state, record(0))
    ctx = multiprocessing.get_context("fork")
    stop_at = time.monotonic() + 8
    procs = [ctx.Process(target=_writer, args=(str(state), 1, 40)), ctx.Process(target=_writer, args=(str(state), 100, 40)),
             ctx.Process(target=_reader, args=(str(state), stop_at)), ctx.Process(target=_reader, args=(str(state), stop_at))]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    assert [proc.exitcode for proc in procs] == [0, 0, 0, 0]
    index = agree(state)
    assert len(index.rows()) == len(list((state / "runs").glob("*.json")))
    assert not list((state / ledger_index.INDEX_DIR).glob(".*.tmp"))  # no temp file left behind


def test_a_run_recorded_while_commands_read_leaves_the_index_consistent(tmp_path: Path) -> None:
    """`runbook next` records a run while `status` and `history` read (and refresh) the index."""
    repo = H.make_repo(tmp_path / "repo", PLAN)
    (repo / "work").mkdir()
    (repo / "work" / "hold").write_text("1")
    for n in range(30):  # some history, so that the readers' refresh has work to do
        save_run(repo / "state", record(n, "phase-1"))
    H.git(repo, "add", "state")
    H.git(repo, "commit", "-qm", "history")
    running = H.popen_runbook(repo, "next", "--yes")
    seen: list[int] = []
    errors: list[str] = []

    def read(args: tuple[str, ...]) -> None:
        while running.poll() is None:
            done = H.runbook(repo, *args, "--json")
            try:
                result = json.loads(done.stdout)["result"]
            except (ValueError, KeyError):
                errors.append(done.stdout[-500:] + done.stderr[-500:])
                return
            if args[0] == "history":
                seen.append(len(result["runs"]) + result["omitted"])

    readers = [threading.Thread(target=read, args=(a,)) for a in (("status",), ("history", "--limit", "0"))]
    for reader in readers:
        reader.start()
    time.sleep(1.5)
    (repo / "work" / "go").write_text("1")
    out, err = running.communicate(timeout=120)
    for reader in readers:
        reader.join(120)
    assert running.returncode == 0, out[-2000:] + err[-2000:]
    assert not errors and set(seen) <= {30, 31}, (errors, seen)
    index = agree(repo / "state")
    assert len(index.rows()) == 31 and not LedgerIndex.open(repo / "state").saved
    history = json.loads(H.runbook_inproc(repo, "history", "--json").stdout)["result"]
    assert len(history["runs"]) == 31 and history["runs"][-1]["phase"] == "phase-0"


# ---- what readers ask -----------------------------------------------------------------------------


def test_pages_and_since_and_last_since(tmp_path: Path) -> None:
    state = tmp_path / "state"
    for n in range(12):
        save_run(state, record(n, f"phase-{n % 2}"))
    index = LedgerIndex.open(state)
    runs, omitted = index.runs(PLAN_REL, limit=5)
    assert [r.run_id for r in runs] == [record(n).run_id for n in range(7, 12)] and omitted == 7
    runs, omitted = index.runs(PLAN_REL, "phase-1", since=int(parse_utc(record(6).started).timestamp()))
    assert [r.run_id for r in runs] == [record(n).run_id for n in (7, 9, 11)] and omitted == 3
    moment = int(parse_utc(record(8).finished).timestamp())
    assert index.last_since(PLAN_REL, "phase-0", moment).run_id == record(10).run_id
    assert index.last_since(PLAN_REL, "phase-0", moment + 100) is None
    assert index.find("last").run_id == record(11).run_id
    assert index.find(record(3).run_id[:-1]).run_id == record(3).run_id


def test_history_lists_a_page_and_counts_the_rest(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN)
    for n in range(60):
        save_run(repo / "state", record(n, f"phase-{n % 2}"))
    text = H.runbook_inproc(repo, "history").stdout.splitlines()
    assert text[0] == "(10 earlier runs not listed: --limit N shows the last N, --limit 0 all of them)"
    assert len(text) == 1 + 1 + 50 and text[-1].startswith(record(59).run_id)
    env = json.loads(H.runbook_inproc(repo, "history", "1", "--limit", "3", "--json").stdout)
    assert [r["run_id"] for r in env["result"]["runs"]] == [record(n).run_id for n in (55, 57, 59)]
    assert env["result"]["omitted"] == 27
    every = json.loads(H.runbook_inproc(repo, "history", "--limit", "0", "--json").stdout)["result"]
    assert len(every["runs"]) == 60 and every["omitted"] == 0
    since = json.loads(H.runbook_inproc(repo, "history", "--since", record(58).run_id, "--json").stdout)["result"]
    assert [r["run_id"] for r in since["runs"]] == [record(58).run_id, record(59).run_id]
    bad = H.runbook_inproc(repo, "history", "--since", "last tuesday")
    assert bad.returncode == 2 and "--since" in bad.stderr and "Traceback" not in bad.stderr


def test_the_results_table_after_many_runs_is_the_last_twenty(tmp_path: Path) -> None:
    repo = H.make_repo(tmp_path / "repo", PLAN)
    for n in range(25):
        save_run(repo / "state", record(n, "phase-1"))
    H.git(repo, "add", "state")
    H.git(repo, "commit", "-qm", "history")
    assert H.runbook_inproc(repo, "next", "--yes").returncode == 0  # Phase 0: its first run
    done = H.runbook_inproc(repo, "next", "--yes", "--phase", "1")
    assert done.returncode == 0, done.stderr
    text = (repo / "plans" / "plan.md").read_text()
    table = text[text.index("<!-- runbook:results", text.index("## Phase 1")):]
    assert "The last 20 runs; 6 earlier runs in the ledger (`runbook history phase-1 --limit 0`)." in table
    assert table.count(f"| {record(0).run_id[:8]}") == 19  # 19 of the hand-made runs, then the new one


def test_run_folders_without_a_record_are_where_live_runs_are_looked_for(tmp_path: Path) -> None:
    """status looks for the live state of a run in progress only in run folders without a record,
    not in 10,000 folders of finished runs (that a dead run's live state is found there and shown
    as not yet recorded: tests/runbook/run/test_detach.py, tests/runbook/run/test_planstate.py)."""
    from runbook.store.live import orphans

    state = tmp_path / "state"
    for n in range(3):
        save_run(state, record(n))
        (state / "runs" / record(n).run_id).mkdir()  # its logs
    (state / "runs" / "20250101-120000-beef").mkdir()  # a run in progress: no record yet
    (state / "runs" / f"{record(0).run_id}.series.jsonl").write_text("")  # a file, not a folder
    index = LedgerIndex.open(state)
    assert index.unrecorded_dirs() == ["20250101-120000-beef"]
    live = state / "runs" / "20250101-120000-beef" / "live.json"
    live.write_text(json.dumps({"run_id": "not a live state"}))
    assert orphans(state, None, index.run_ids(), among=index.unrecorded_dirs()) == []  # unreadable: not ours
    assert orphans(state, None, index.run_ids(), among=[]) == []
