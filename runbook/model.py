"""Typed plan, phase, step, criterion and run-record models.

Everything that crosses a file or process boundary is a pydantic model defined here. Parsed parts
carry the `Span` they came from so that write-back can edit the plan in place and error messages
can name `file:line:col`.

Conventions:
- lines are 1-based and inclusive; columns are 1-based;
- `start` / `end` are offsets into the decoded text of the file (Python `str` indices, `end`
  exclusive). The parser decodes UTF-8 without newline translation, so `\\r\\n` and a BOM survive
  and `text[span.start:span.end]` is exactly the source of the part.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, field_validator

from runbook.redact import redact_credentials

FORMAT_VERSION = 1
RUN_SCHEMA_VERSION = 1

Verdict = Literal["pass", "fail", "inconclusive", "error", "timeout", "interrupted"]
VERDICTS: tuple[str, ...] = ("pass", "fail", "inconclusive", "error", "timeout", "interrupted")
# Verdicts that hand over to On pass / On fail; the others leave the phase to be resumed.
JUDGED: frozenset[str] = frozenset({"pass", "fail"})
# Exit codes of `runbook next` (docs/next.md, "Exit codes").
EXIT_CODES: dict[str, int] = {
    "pass": 0,
    "fail": 1,
    "usage": 2,
    "inconclusive": 3,
    "error": 4,
    "timeout": 4,
    "interrupted": 4,
    "locked": 5,
}


class Span(BaseModel):
    model_config = ConfigDict(frozen=True)

    start_line: int
    end_line: int
    start: int
    end: int


class Problem(BaseModel):
    """One thing wrong with an input file, printed as `file:line:col: message`."""

    file: str
    line: int
    col: int = 1
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        prefix = "warning: " if self.severity == "warning" else ""
        return f"{self.file}:{self.line}:{self.col}: {prefix}{self.message}"


# ---- the Pass: expression tree -------------------------------------------------------------

CompareOp = Literal["<", "<=", ">", ">=", "==", "!="]


class MetricRef(BaseModel):
    kind: Literal["metric"] = "metric"
    name: str


class Number(BaseModel):
    kind: Literal["number"] = "number"
    value: float
    text: str | None = None  # the literal as written ("4.0"), for messages; None when built in code


class Text(BaseModel):
    """A string literal in a criterion (`optimizer == "adamw"`), compared with string metrics."""

    kind: Literal["text"] = "text"
    value: str


ArithOp = Literal["+", "-", "*", "/"]


class Arith(BaseModel):
    """`items[0] ops[0] items[1] ops[1] items[2] ...`, evaluated left to right, all of one precedence
    level (`+ -` or `* /`): a long sum is one flat node, so no chain of terms can nest deeply."""

    kind: Literal["arith"] = "arith"
    items: list[Operand]
    ops: list[ArithOp]  # len(items) - 1


class Neg(BaseModel):
    """Unary minus of a value that is not a number literal (`-x`; `-3` is a Number)."""

    kind: Literal["neg"] = "neg"
    item: Operand


# A value: a metric (of this run, or `phase-0.name` of another phase's latest run), a literal, or
# arithmetic over them.
Operand = Annotated[MetricRef | Number | Text | Arith | Neg, Field(discriminator="kind")]
Arith.model_rebuild()
Neg.model_rebuild()


class Compare(BaseModel):
    kind: Literal["compare"] = "compare"
    left: Operand
    op: CompareOp
    right: Operand


class BoolOp(BaseModel):
    kind: Literal["and", "or"]
    items: list[Expr]


class Not(BaseModel):
    kind: Literal["not"] = "not"
    item: Expr


Expr = Annotated[Compare | BoolOp | Not, Field(discriminator="kind")]
BoolOp.model_rebuild()
Not.model_rebuild()


def criterion_display(text: str) -> str:
    """A `Pass:` text as people read it (status lines, briefs, run records): without the
    backticks around it."""
    return text.strip().strip("`").strip()


class Criterion(BaseModel):
    """A parsed `Pass:` line: its text as written and its expression tree."""

    text: str
    expr: Expr
    span: Span

    @property
    def display(self) -> str:
        """The text without the backticks around it (`criterion_display`)."""
        return criterion_display(self.text)


# ---- plan structure --------------------------------------------------------------------------


class Block(BaseModel):
    """A tool-owned region `<!-- runbook:NAME -->` ... `<!-- /runbook:NAME -->`."""

    name: str
    span: Span  # from the first byte of the opening marker to the end of the closing marker's line
    inner: str  # the text between the markers
    attrs: dict[str, str] = {}  # `key=value` pairs written in the opening marker


class Step(BaseModel):
    id: str  # "step-1", "step-2", ... in document order within the phase
    text: str  # the task-list item's text as written (without "- [ ] ")
    command: str  # the command as written, `{vars}` unresolved; several lines run as one script
    done: bool
    span: Span  # the whole list item, nested fenced block included
    checkbox: int  # offset of the character between `[` and `]` (" " or "x"/"X")


class PhaseStatus(BaseModel):
    """What the status block of a phase says (parsed back from the plan)."""

    verdict: Verdict
    run_id: str | None = None
    when: str | None = None
    summary: str | None = None
    stale: bool = False  # `stale (was <verdict>)`: the run no longer speaks for the phase


class Phase(BaseModel):
    id: str  # explicit `{#id}` if given, else "phase-<label>"
    label: str  # "0", "1", "2b" ...
    explicit_id: str | None = None
    title: str
    heading: str  # the heading line's text without "## "
    estimate: str | None = None  # "~30 min" as written, without parentheses
    goal: str = ""  # prose between the heading and `Steps:`
    steps: list[Step] = []
    criterion: Criterion | None = None
    on_pass: str | None = None  # a phase reference as written, or "stop"; None -> default
    on_fail: str | None = None  # None -> "stop"
    needs: list[str] = []
    timeout_s: float | None = None
    executor: Literal["local", "slurm"] | None = None  # `Executor:`; None -> local
    resources: dict[str, str] = {}  # `Resources:` words (runbook/plan/resources.py), in order
    columns: list[str] = []  # `Columns:`: more metrics (or vars) for the results table than `Pass:` reads
    outputs: list[str] = []  # `Outputs:`: files / folders its runs make (repo-relative, `{var}` allowed)
    inputs: list[str] = []  # `Inputs:`: other phases' outputs it reads (checked against their deciding run)
    sweep: list[str] = []  # `Sweep:`: the grid's axes as `runbook sweep --set` items ("n=100,200"); `runbook next` runs them
    pick: str | None = None  # `Pick:` ("best:acc", "max:acc", "min:loss"): the trial that decides a `Sweep:` phase
    status: PhaseStatus | None = None
    blocks: dict[str, Block] = {}
    span: Span  # heading line to the byte before the next phase heading (or end of file)
    heading_span: Span
    field_lines: dict[str, int] = {}  # "pass", "on_pass", "on_fail", "needs", "timeout", "executor", "columns", ... -> line

    @property
    def display_name(self) -> str:
        return f"Phase {self.label}"


class Plan(BaseModel):
    path: str  # as given to the parser (used in messages)
    format_version: int
    title: str | None = None
    notes: str | None = None  # relative to the plan file
    vars: dict[str, str] = {}
    front_matter_span: Span
    phases: list[Phase] = []
    text: str = Field(default="", repr=False)  # the whole decoded source

    # find_phase's lookup tables, built once per phases list (a plan of 100,000 phases resolves every
    # On pass: / On fail: in a walk: one linear scan each made `validate` quadratic)
    _lookup: tuple[list[Phase], int, dict[str, int], dict[str, int], dict[str, int]] | None = PrivateAttr(default=None)

    def _tables(self) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        """(exact refs, lower-cased refs, id -> position), each the first phase that has it; made again
        when `phases` is another list or another length than when they were made."""
        if self._lookup is None or self._lookup[0] is not self.phases or self._lookup[1] != len(self.phases):
            exact: dict[str, int] = {}
            lowered: dict[str, int] = {}
            position: dict[str, int] = {}
            for i, phase in enumerate(self.phases):
                for ref in (phase.id, phase.explicit_id):
                    if ref is not None:
                        exact.setdefault(ref, i)
                for ref in (phase.id, f"phase {phase.label}", phase.label):
                    lowered.setdefault(ref.lower(), i)
                position.setdefault(phase.id, i)
            self._lookup = (self.phases, len(self.phases), exact, lowered, position)
        return self._lookup[2], self._lookup[3], self._lookup[4]

    def find_phase(self, ref: str) -> Phase | None:
        """Resolve a phase reference: label ("Phase 1", "1"), id ("phase-1") or explicit id: the first
        phase that answers to it (ids and explicit ids exactly or, ids and labels, in any case)."""
        exact, lowered, _ = self._tables()
        wanted = ref.strip()
        hits = [i for i in (exact.get(wanted), lowered.get(wanted.lower())) if i is not None]
        return self.phases[min(hits)] if hits else None

    def position(self, phase: Phase) -> int:
        """Where the first phase with `phase`'s id stands in the document (ValueError: none has it)."""
        found = self._tables()[2].get(phase.id)
        if found is None:
            raise ValueError(f"{phase.id} is not a phase of {self.path}")
        return found

    def phase_index(self) -> dict[str, Phase]:
        """Lower-cased phase references -> phase, as `find_phase` resolves them, in one dict."""
        index: dict[str, Phase] = {}
        for phase in self.phases:
            for key in (phase.id, phase.explicit_id, f"phase {phase.label}", phase.label):
                if key:
                    index.setdefault(key.lower(), phase)
        return index


# ---- the run ledger (state/runs/<run-id>.json) -----------------------------------------------

_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _metric_value(value: object) -> object:
    """Non-finite numbers are written to JSON as "NaN" / "Infinity" / "-Infinity" (valid JSON);
    read them back as floats. A bool counts as 1 / 0."""
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    if isinstance(value, bool):
        return float(value)
    return value


# A metric: a number (NaN and infinities included) or a short string (`"optimizer": "adamw"`).
MetricValue = Annotated[float | str, BeforeValidator(_metric_value)]
Metrics = dict[str, MetricValue]


class StepResult(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="strings")

    step_id: str
    command: str  # as run, vars resolved
    exit_code: int | None = None  # None: not started / killed before exit
    started: str | None = None  # ISO 8601 UTC
    finished: str | None = None
    duration_s: float | None = None
    metrics: Metrics = {}
    metrics_error: str | None = None  # its metrics file was rejected: the step is not done
    log_path: str | None = None  # repo-relative
    log_tail: list[str] = []
    skipped: bool = False  # already done in an earlier run of this phase (resume)
    job_id: str | None = None  # the cluster job that ran it (Executor: slurm)
    job_state: str | None = None  # that job's final state as the cluster said it (COMPLETED, TIMEOUT, ...)

    @field_validator("command")
    @classmethod
    def _no_url_password(cls, value: str) -> str:
        return redact_credentials(value)  # the record is committed

    @field_validator("log_tail")
    @classmethod
    def _no_url_passwords(cls, value: list[str]) -> list[str]:
        return [redact_credentials(line) for line in value]

    @property
    def completed(self) -> bool:
        """Done: exited 0 with usable metrics, or done in an earlier run. Only these are ticked."""
        return self.skipped or (self.exit_code == 0 and self.metrics_error is None)


def merge_metrics(results: list[StepResult]) -> Metrics:
    """Merge in step order: a later step's value wins; each is also kept as `<step-id>.<name>`."""
    merged: Metrics = {}
    qualified: Metrics = {}
    for result in results:
        for name, value in result.metrics.items():
            merged[name] = value
            qualified[f"{result.step_id}.{name}"] = value
    merged.update(qualified)
    return merged


class EnvFingerprint(BaseModel):
    python: str
    platform: str
    host: str
    torch: str | None = None
    cuda: str | None = None
    gpus: list[str] = []
    env: dict[str, str] = {}  # selected variables; secret-looking names never recorded


class SeriesInfo(BaseModel):
    """A metric series a step wrote to $RUNBOOK_SERIES, summarised (the points are in
    `state/runs/<run-id>.series.jsonl`, runbook/store/series.py)."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    name: str  # "train_loss"
    step_id: str  # the step that wrote it
    points: int  # points the step wrote
    kept: int  # points the ledger keeps (every k-th and the last, at most runbook.store.series.MAX_POINTS)
    first_x: float | None = None
    last_x: float | None = None
    last: float | None = None  # the last finite value
    min: float | None = None
    max: float | None = None


class Trial(BaseModel):
    """A run made as one point of a sweep (`runbook sweep`): recorded and committed like any run,
    shown in the phase's table, history, diff and plot, but never the phase's verdict by itself."""

    sweep: str  # the sweep's id (state/sweeps/<id>.json)
    point: dict[str, str]  # the values of this point (`--set` for this run)
    index: int  # 1-based position of the point in the sweep
    of: int  # how many points the sweep has


class Decision(BaseModel):
    """Why a record decides its phase although it did not run itself: it is the copy of a chosen
    trial (`runbook choose RUN`, or `runbook sweep --pick best:METRIC`)."""

    run: str  # the trial (or earlier run) chosen: the deciding run
    by: Literal["choose", "pick"]
    why: str  # one line: "runbook choose", "best:acc (max 0.99 of 6 trials)"
    sweep: str | None = None


class OutputInfo(BaseModel):
    """One declared output (`Outputs:`) as a run left it (runbook/store/outputs.py)."""

    path: str  # repo-relative, as declared
    kind: Literal["file", "dir", "missing"]
    size: int = 0  # bytes (a folder: of all its files)
    mtime: str | None = None  # ISO 8601 UTC, the newest file's
    files: int = 0  # files under a folder (1 for a file)
    hash: str | None = None  # "xxh128:<hex>" / "blake2b:<hex>"; "identity:<hex>" for very large files
    kept: str | None = None  # where a copy of it is kept for this run (per-trial outputs), repo-relative


class RunRecord(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="strings")

    schema_version: int = RUN_SCHEMA_VERSION
    run_id: str  # "20261129-143012-7f3a": UTC time + random suffix
    plan: str  # repo-relative path of the plan
    plan_blob: str  # git blob hash of the plan text that ran
    phase: str  # phase id
    phase_label: str
    phase_text_hash: str  # sha256 of the phase's source text when it ran (for "changed since")
    started: str
    finished: str | None = None
    duration_s: float | None = None
    steps: list[StepResult] = []
    metrics: Metrics = {}  # merged, plus "<step-id>.<name>" entries
    criterion: str | None = None
    verdict: Verdict
    reason: str = ""  # one line: why this verdict ("accept_len 2.41 >= 1.5", "step-2 exited 3")
    commit_before: str | None = None
    # tracked files (besides the plan and state/) that differed from commit_before when the run
    # started: the numbers come from code that is not exactly that commit. None: no git.
    dirty: bool | None = None
    dirty_files: list[str] = []
    commit: str | None = None  # the commit that recorded this run, when known
    env: EnvFingerprint | None = None
    executor: Literal["local", "slurm"] = "local"  # where its steps ran (runbook/run/executor.py)
    detached: bool = False  # run by a supervisor that outlived the `runbook next --detach` that started it
    # every var the phase's commands used, with the value they ran with (empty in records older
    # than this field); `overrides` names those set with `runbook next --set` for this run
    vars: dict[str, str] = {}  # URL passwords replaced by *** (the record is committed)
    overrides: list[str] = []

    @field_validator("vars")
    @classmethod
    def _no_url_passwords_in_vars(cls, value: dict[str, str]) -> dict[str, str]:
        return {k: redact_credentials(v) for k, v in value.items()}
    # other phases' metrics its criterion read (`phase-0.acc` -> value) and the runs they came from
    ref_metrics: Metrics = {}
    ref_runs: dict[str, str] = {}  # phase id -> run id
    series: list[SeriesInfo] = []  # metric series its steps wrote; points in <run-id>.series.jsonl
    trial: Trial | None = None  # a point of a sweep: never the phase's verdict by itself
    decision: Decision | None = None  # the copy of a chosen run, which makes it the phase's verdict
    outputs: list[OutputInfo] = []  # the phase's `Outputs:` as this run left them

    def deciding(self) -> tuple[str, str]:
        """(the run that decides its phase when this record is the phase's latest, why): a chosen
        trial names the trial, else this run itself ("last run")."""
        if self.decision is not None:
            how = "chosen by `runbook choose`" if self.decision.by == "choose" else f"picked by {self.decision.why}"
            return self.decision.run, how
        return self.run_id, "last run"
