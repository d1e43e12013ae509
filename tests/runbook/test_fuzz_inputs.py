"""Fuzzing everything else a user, a plan or a step hands runbook: criteria, metrics files, config
files and lock files. Zero tracebacks: each input is accepted or refused with runbook's own error.

- Criteria: random token soups and nesting up to 400 deep (parentheses, `not`), strings, huge and
  odd numbers. `parse_criterion` returns an expression or raises `CriterionError` with a column
  inside the text; a parsed expression renders to text that parses to the same rendering, and
  evaluates against random metrics (NaN, infinities, strings, bools, missing) to one of the three
  verdicts without raising.
- Metrics files: random JSON values (nested objects, lists, huge integers, NaN, long strings,
  nulls), random bytes, and special files (FIFO, /dev/zero, a directory, 2 MB of JSON).
  `read_metrics` returns numbers and strings only, or raises `MetricsError`, at once; what it
  returns survives the run record's JSON round trip.
- runbook.toml / pyproject.toml: random TOML-ish text and bytes. `load_config` returns a Config or
  raises `ConfigError`; a sample goes through the real `runbook status` (no traceback).
- state/lock: random JSON with odd field values. `read_lock` returns a valid LockInfo or raises
  `LockCorrupt`; nothing is signalled (read only).
- MCP tool arguments: random JSON values for every tool's arguments (of their type and of any,
  NUL bytes, huge strings, nesting, paths in, out of and around the root, a FIFO, a link out,
  unknown keys, unknown tools), sent by the SDK's own client to one real `runbook mcp` on a real
  repository: a result or a tool error with the command line's code, never `internal` nor a
  JSON-RPC error; nothing written beside the root; no step run for a refused call.

Budget: RUNBOOK_FUZZ_EXAMPLES scales every test here as in tests/runbook/plan/test_fuzz_parse.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
import time
from pathlib import Path

import helpers as H
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runbook.model import StepResult
from runbook.plan.criteria import CriterionError, evaluate, parse_criterion, render
from runbook.run.local import MetricsError, read_metrics
from runbook.store.lock import LockCorrupt, LockInfo, read_lock
from runbook.store.project import Config, ConfigError, load_config

SCRATCH = Path(tempfile.mkdtemp(prefix="runbook-fuzz-inputs-"))


# ---- criteria ---------------------------------------------------------------------------------

NAMES = ["a", "b", "accept_len", "step-2.loss", "cfg.lr", "x_1", "and", "or", "not", "nan", "inf"]
ATOMS = NAMES + ["1", "-3", "2e-4", "1e999", "-1e-999", "9" * 400, ".5", "5.", "0x10", "1_000", '"adamw"',
                 "'x'", '"', "'", "(", ")", "<", "<=", ">", ">=", "==", "!=", "=", "&&", "||", "!", "`", "``",
                 "\t", "\n", "\u00a0", "é", "{x}", ";", "__import__('os')"]


@st.composite
def criterion_text(draw) -> str:
    core = " ".join(draw(st.lists(st.sampled_from(ATOMS), min_size=0, max_size=12)))
    shape = draw(st.sampled_from(["plain", "parens", "nots", "mixed", "unbalanced"]))
    depth = draw(st.integers(0, 400))
    if shape == "parens":
        core = "(" * depth + core + ")" * depth
    elif shape == "nots":
        core = "not " * depth + core
    elif shape == "mixed":
        core = "(not " * depth + core + ")" * depth
    elif shape == "unbalanced":
        core = "(" * depth + core + ")" * draw(st.integers(0, 400))
    if draw(st.booleans()):
        core = f"`{core}`"
    return core


operand = st.one_of(st.sampled_from(["a", "b", "accept_len", "step-2.loss", "cfg.lr"]),
                    st.sampled_from(["1", "-3", "2e-4", "1e999", "0", '"adamw"', "'x'"]),
                    st.floats(allow_nan=False, allow_infinity=False).map(repr))
comparison = st.builds(lambda a, op, b: f"{a} {op} {b}", operand, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]),
                       operand)


@st.composite
def grammatical_criterion(draw) -> str:
    """A criterion from the grammar: comparisons joined by and/or, wrapped in parentheses and
    `not` up to 80 levels (past the limit of 64 too), sometimes with one token spliced in."""
    expr = st.recursive(
        comparison,
        lambda inner: st.one_of(
            st.builds(lambda x: f"({x})", inner), st.builds(lambda x: f"not {x}", inner),
            st.builds(lambda x, y, j: f"{x} {j} {y}", inner, inner, st.sampled_from(["and", "or"])),
        ),
        max_leaves=12,
    )
    text = draw(expr)
    for _ in range(draw(st.integers(0, 80))):
        text = draw(st.sampled_from(["({})", "not {}", "(not {})"])).format(text)
    if draw(st.integers(0, 4)) == 0:
        tokens = text.split(" ")
        tokens.insert(draw(st.integers(0, len(tokens))), draw(st.sampled_from(ATOMS)))
        text = " ".join(tokens)
    return f"`{text}`" if draw(st.booleans()) else text


metric_value = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**20), 10**20).map(float),
    st.text(max_size=20), st.booleans(), st.sampled_from(["adamw", "x", ""]),
)
metrics_dict = st.dictionaries(st.sampled_from(NAMES), metric_value, max_size=8)


@settings(max_examples=H.examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(grammatical_criterion(), grammatical_criterion(), criterion_text(), st.text(max_size=300)),
       metrics_dict)
def test_criteria_parse_or_refuse_and_evaluate_without_raising(counts, text: str, metrics: dict) -> None:
    try:
        expr = parse_criterion(text)
    except CriterionError as exc:
        assert 1 <= exc.col <= len(text) + 2, (exc.col, len(text))
        assert exc.message.strip()
        counts.add("fuzz_criteria_refused")
        return
    canonical = render(expr)
    assert render(parse_criterion(canonical)) == canonical
    judgement = evaluate(expr, metrics)
    assert judgement.verdict in ("pass", "fail", "inconclusive")
    for comparison in judgement.comparisons:
        assert comparison.held in (True, False, None)
    counts.add("fuzz_criteria_parsed")


# ---- metrics files ----------------------------------------------------------------------------

json_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-(10**30), 10**30), st.text(max_size=40), st.text(min_size=990, max_size=1100),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=6)),
    max_leaves=40,
)


def _check_metrics(path: Path) -> str:
    t0 = time.monotonic()
    try:
        got = read_metrics(path, "step-1")
    except MetricsError as exc:
        assert "step-1" in str(exc) and str(path) in str(exc)
        outcome = "refused"
    else:
        assert all(isinstance(v, (float, str)) for v in got.values()), got
        assert all(isinstance(k, str) for k in got)
        back = StepResult.model_validate_json(StepResult(step_id="s", command="", metrics=got).model_dump_json())
        for name, value in got.items():
            again = back.metrics[name]
            assert (isinstance(value, float) and math.isnan(value) and math.isnan(again)) or again == value
        outcome = "accepted"
    assert time.monotonic() - t0 < 10
    return outcome


@settings(max_examples=H.examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(json_values, st.dictionaries(st.text(max_size=12), json_values, max_size=8)),
       st.sampled_from(["json", "bigint", "junk-suffix", "bytes"]), st.binary(max_size=64))
def test_metrics_files_are_read_or_refused(counts, value, form: str, junk: bytes) -> None:
    path = SCRATCH / "metrics.json"
    text = json.dumps(value)
    if form == "bigint":
        text = text.replace("1", "1" * 350, 1)
    data = text.encode("utf-8", "surrogatepass")
    if form == "junk-suffix":
        data += junk
    elif form == "bytes":
        data = junk
    path.write_bytes(data)
    counts.add(f"fuzz_metrics_{_check_metrics(path)}")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "missing", "empty", "two-megabytes",
                                  "deep-list", "deep-object", "not-utf8", "many-metrics"])
def test_special_metrics_files_never_hang_or_crash(kind: str, counts) -> None:
    path = SCRATCH / f"special-{kind}.json"
    if path.is_symlink() or path.is_file():
        path.unlink()
    if kind in H.SPECIAL_KINDS:
        H.special_file(path, kind)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "two-megabytes":
        path.write_text('{"a": "' + "x" * 2_000_000 + '"}')
    elif kind == "deep-list":
        path.write_text("[" * 200_000 + "]" * 200_000)
    elif kind == "deep-object":
        path.write_text('{"a":' * 200_000 + "1" + "}" * 200_000)
    elif kind == "not-utf8":
        path.write_bytes(b'{"a": "\xff"}')
    elif kind == "many-metrics":
        path.write_text(json.dumps({f"m{i}": i for i in range(50_000)}))
    outcome = _check_metrics(path)
    assert outcome == ("accepted" if kind in ("missing", "empty") else "refused"), kind
    counts.add("fuzz_metrics_special")


# ---- config files -----------------------------------------------------------------------------

TOML_BITS = ['plans = ["plans/*.md"]', 'plans = "x/*.md"', "plans = 3", "plans = [1, 2]", 'state = "state"',
             'state = "../out"', "state = []", 'runbook_bin = "append"', 'runbook_bin = "sideways"',
             "runbook_bin = 1", "[tool.runbook]", "[tool]", "runbook = 5", "a = " + "9" * 5000,
             "a = " + "[" * 3000 + "]" * 3000, 'a = """', "a = 'x", "= 1", "[[x]]", "x.y.z = 1", "a = inf",
             "a = nan", "a = 1979-05-27T07:32:00Z", "\x00", "\ufeff", "é = 1", '"q" = 1']


@st.composite
def toml_text(draw) -> bytes:
    lines = draw(st.lists(st.one_of(st.sampled_from(TOML_BITS), st.text(max_size=30)), max_size=10))
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        data += draw(st.binary(max_size=20))
    return data


@settings(max_examples=H.examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(toml_text(), st.sampled_from(["runbook.toml", "pyproject.toml"]))
def test_config_files_load_or_are_refused(counts, data: bytes, name: str) -> None:
    root = Path(tempfile.mkdtemp(dir=SCRATCH))
    (root / name).write_bytes(data)
    try:
        config = load_config(root)
    except ConfigError as exc:
        assert name == "runbook.toml" or "[tool.runbook]" in str(exc), exc  # a broken pyproject is ignored
        assert str(root / name) in str(exc)
        counts.add("fuzz_config_refused")
        return
    assert isinstance(config, Config) and config.runbook_bin in ("append", "prepend", "off")
    counts.add("fuzz_config_loaded")


@pytest.mark.slow
@settings(max_examples=H.examples(4), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(toml_text(), min_size=5, max_size=5))
def test_runbook_status_with_fuzzed_config_never_tracebacks(counts, batch: list[bytes]) -> None:
    plan = "---\nrunbook: 1\n---\n\n## Phase 0: a\n\nSteps:\n- [ ] x: `true`\n"
    for i, data in enumerate(batch):
        repo = Path(tempfile.mkdtemp(dir=SCRATCH)) / f"r{i}"
        H.make_repo(repo, plan)
        (repo / ("runbook.toml" if i % 2 else "pyproject.toml")).write_bytes(data)
        result = subprocess.run([*H.RUNBOOK, "status"], cwd=repo, capture_output=True, text=True,
                                env=H.cli_env(), timeout=120, stdin=subprocess.DEVNULL)
        H.assert_no_traceback(result, "runbook status")
        assert result.returncode in (0, 2), result.stderr[-2000:]
    counts.add("fuzz_config_cli", len(batch))


# ---- lock files -------------------------------------------------------------------------------

odd = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                st.text(max_size=30), st.lists(st.integers(), max_size=3), st.sampled_from([0, 1, -1, 2, 2**22, 2**22 + 1]))
VALID_LOCK = {"pid": 12345, "host": "h", "started": "2026-01-01T00:00:00Z", "run_id": "20260101-000000-abcd",
              "step_pgid": 23456, "step_start": "1234", "pid_start": "99", "boot_id": "b"}
lock_fields = st.builds(
    lambda overrides: {**VALID_LOCK, **overrides},
    st.dictionaries(st.sampled_from(sorted(VALID_LOCK)), odd, max_size=2),
)


@settings(max_examples=H.examples(300), deadline=None)
@given(st.one_of(lock_fields, json_values), st.booleans())
def test_lock_files_are_read_or_refused(counts, value, as_bytes: bool) -> None:
    path = SCRATCH / "lock"
    path.write_bytes(json.dumps(value).encode("utf-8", "surrogatepass") if not as_bytes else os.urandom(40))
    try:
        info = read_lock(path)
    except LockCorrupt as exc:
        assert str(path) in str(exc) and "nothing was signalled" in str(exc) and "remove it" in str(exc)
        counts.add("fuzz_locks_refused")
        return
    assert isinstance(info, LockInfo) and info.pid >= 1 and (info.step_pgid is None or info.step_pgid >= 2)
    counts.add("fuzz_locks_accepted")


def test_a_fuzzed_run_record_keeps_valid_json(tmp_path: Path) -> None:
    """Metrics runbook accepted are written to the ledger as standard JSON (no NaN constants)."""
    path = tmp_path / "m.json"
    path.write_text('{"loss": NaN, "up": Infinity, "down": -Infinity, "s": "x", "b": true, "n": {"m": 1}}')
    metrics = read_metrics(path, "step-1")
    record = H.run_record(run_id="r", plan="p", plan_blob="0", phase="phase-0", phase_label="0", phase_text_hash="0",
                       started="2026-01-01T00:00:00Z", verdict="pass", metrics=metrics,
                       steps=[StepResult(step_id="step-1", command="", metrics=metrics)])

    def no_constants(name: str) -> None:
        raise AssertionError(name)

    data = json.loads(record.model_dump_json(), parse_constant=no_constants)
    assert data["metrics"]["loss"] == "NaN" and data["metrics"]["n.m"] == 1.0


# ---- MCP tool arguments -----------------------------------------------------------------------

MCP_PLAN = """\
---
runbook: 1
title: Fuzzed
notes: notes.md
vars:
  budget: "1"
---

## Phase 0: Score

Steps:
- [ ] Score: `echo ran >> ran.txt; echo '{"score": 3}' > "$RUNBOOK_METRICS"`

Pass: `score >= 2`
On pass: Phase 1

## Phase 1: Again

Steps:
- [ ] Again: `echo ran >> ran.txt; echo '{"score": 1}' > "$RUNBOOK_METRICS"`

Pass: `score >= 2`
On fail: stop
"""


def _mcp_values(root: Path, outside: Path) -> tuple[st.SearchStrategy, dict[object, st.SearchStrategy]]:
    """Any JSON value a host could send, and for each argument type values of that type, weighted
    toward what the tools take: paths in, out of and around the root, phase labels, run refs, NUL
    bytes, huge strings, nesting, odd numbers."""
    paths = st.sampled_from([
        "plans/plan.md", "plans/notes.md", "plans", "fifo.md", "missing.md", "state/lock", "./plans/../plans/plan.md",
        str(outside / "plans" / "plan.md"), "../outside/plans/plan.md", "plans/../../outside/plans/plan.md",
        str(root / "link-out.md"), "link-out.md", "/etc/passwd", "/dev/zero", "/proc/self/fd/0", "~/x.md", "-",
        "--help", "--plan=x", "plans/plan.md\x00", "\x00", "", " ", "plans/plan.md\n", "é/ü.md", "a" * 300])
    labels = st.sampled_from(["0", "1", "2", "phase-0", "Phase 1", "-1", "last", "last~1", "last~99999999999999999999",
                              "20260101-000000-abcd", "step-1", "1", "*", "budget", "budget=2", "score", "2026-11-29",
                              "2026-11-29T14:30", "-score", "phase-0.score", "nan", "1e999"])
    huge = st.sampled_from(["x" * 100_000, "é" * 300_000, "\x00" * 1000, "line\n" * 20_000])
    texts = st.one_of(paths, labels, st.text(max_size=30), huge)
    numbers = st.one_of(st.integers(-3, 300), st.sampled_from([-(2**63), 2**63, 10**30, -(10**30), 0]),
                        st.floats(allow_nan=False, allow_infinity=False))
    leaves = st.one_of(st.none(), st.booleans(), numbers, texts)
    anything = st.recursive(leaves, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=8), labels), inner, max_size=4)),
        max_leaves=12)
    keys = st.one_of(labels, st.text(max_size=8), st.just("a=b"), st.just(" x"))
    typed = {bool: st.booleans(), int: numbers, float: numbers, str: texts, str | None: texts,
             int | None: numbers, list[str]: st.lists(texts, max_size=3),
             dict[str, str]: st.dictionaries(keys, texts, max_size=3),
             dict[str, float]: st.dictionaries(keys, numbers, max_size=3)}
    return anything, typed


def _mcp_calls(root: Path, outside: Path) -> st.SearchStrategy:
    """(tool, arguments): mostly the tool's own argument names with values of their type or any
    value, also other tools' names and unknown keys."""
    from runbook.mcp_server import TOOLS

    names = sorted({name for tool in TOOLS for name in tool.args.model_fields})
    anything, typed = _mcp_values(root, outside)

    @st.composite
    def call(draw) -> tuple[str, dict]:
        tool = draw(st.sampled_from(TOOLS))
        if not draw(st.integers(0, 30)):  # no such tool
            return draw(st.one_of(st.text(max_size=12), st.sampled_from(["init", "plot", "brief\x00", ""]))), {}
        fields = tool.args.model_fields
        keys = draw(st.lists(st.sampled_from(sorted(fields)), max_size=5, unique=True))
        keys += [key for key, field in fields.items() if field.is_required() and key not in keys
                 and draw(st.integers(0, 3))]  # a required argument, mostly there
        if not draw(st.integers(0, 3)):  # now and then an argument of another tool's, or of none
            keys.append(draw(st.one_of(st.sampled_from(names), st.text(max_size=10))))
        arguments = {}
        for key in keys:
            of_type = typed.get(fields[key].annotation) if key in fields else None
            arguments[key] = draw(of_type if of_type is not None and draw(st.integers(0, 3)) else anything)
        return tool.name, arguments

    return call()


def test_mcp_tool_arguments_are_a_result_or_a_tool_error(tmp_path: Path, counts) -> None:
    """Random JSON values for every tool's arguments (wrong types, NUL bytes, huge strings, nesting,
    paths out of the root, unknown keys), sent by the SDK's own client to a real `runbook mcp` on a
    real repository: every reply is a result or a tool error with one of the command line's codes
    (never `internal`, never a JSON-RPC error), the server answers the next call, nothing is written
    outside the root, and no step runs for a refused call."""
    import anyio.from_thread
    from mcp import Client, StdioServerParameters

    from runbook.errors import EXIT_CODES

    root = H.make_repo(tmp_path / "root", MCP_PLAN, notes="# Notes\n", ignore=("ran.txt", "fifo.md", "link-out.md"))
    outside = H.make_repo(tmp_path / "outside", MCP_PLAN.replace("echo ran >> ran.txt", "touch RAN"), notes="# B\n")
    os.mkfifo(root / "fifo.md")
    (root / "link-out.md").symlink_to(outside / "plans" / "plan.md")
    cache = tmp_path / "cache"
    env = H.cli_env({"XDG_CACHE_HOME": str(cache)})
    server = StdioServerParameters(command=H.RUNBOOK[0], args=[*H.RUNBOOK[1:], "mcp"], cwd=str(root), env=env)

    def around() -> dict[str, bytes]:  # every file beside the root (the cache is runbook's own, by design)
        return {name: data for name, data in H.tree_snapshot(tmp_path).items()
                if not name.startswith(("root/", "cache/"))}

    def steps_run() -> int:
        ran = root / "ran.txt"
        return len(ran.read_text().splitlines()) if ran.exists() else 0

    before = around()
    seen: dict[str, int] = {}
    with anyio.from_thread.start_blocking_portal() as portal, \
            portal.wrap_async_context_manager(Client(server, read_timeout_seconds=120)) as client:

        @settings(max_examples=H.examples(40), deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
        @given(_mcp_calls(root, outside))
        def one_call(call: tuple[str, dict]) -> None:
            name, arguments = call
            ran = steps_run()
            result = portal.call(client.call_tool, name, arguments)  # a JSON-RPC error raises here
            envelope = result.structured_content
            assert envelope is not None and envelope["ok"] is not result.is_error, (name, arguments, result)
            if result.is_error:
                code = envelope["error"]["code"]
                assert code in EXIT_CODES and code != "internal", (name, arguments, envelope["error"])
                assert steps_run() == ran, f"{name} was refused ({code}) but a step ran"
                seen[f"refused:{code}"] = seen.get(f"refused:{code}", 0) + 1
            else:
                seen[f"answered:{name}"] = seen.get(f"answered:{name}", 0) + 1
                if name == "next" and (envelope["result"] or {}).get("detached"):  # let the run end before the next call
                    ended = portal.call(client.call_tool, "wait", {"timeout": 60})
                    assert ended.structured_content["result"]["state"] != "running", ended

        one_call()
        status = portal.call(client.call_tool, "status", {})
    assert not status.is_error, status
    assert around() == before, "a tool call wrote outside the server's root"
    assert not (outside / "RAN").exists()
    print(f"reliability detail: mcp tool calls {sorted(seen.items())}")
    for key, n in seen.items():
        counts.add(f"fuzz_mcp_{key.split(':')[0]}", n)
