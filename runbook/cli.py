"""The `runbook` command line.

Each verb lives in its own module under `runbook/commands/` and is imported only when it is
invoked, so `runbook --help` starts without loading anything heavy (no torch, no git).

This is the one place where outcomes become output and exit codes. A verb returns an `Output`
(runbook/commands/_output.py: its result model, its exit code, its text) or raises `RunbookError`; click's own usage errors,
Ctrl-C and unexpected exceptions are mapped here too. Under `--json` stdout carries exactly one
JSON document, the envelope of runbook/contract.py, whatever happens; without it the text goes to
stdout and refusals to stderr. No traceback reaches a user.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from runbook.commands._output import Output
from runbook.plan.mdtext import ends_with_newline

if TYPE_CHECKING:
    from runbook.contract import ErrorInfo
    from runbook.errors import RunbookError

# verb -> (module, one-line help shown by `runbook --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("runbook.commands.init", "Scaffold plans/, notes, state/ and runbook.toml."),
    "validate": ("runbook.commands.validate", "Check plans; print every problem as file:line:col."),
    "status": ("runbook.commands.status", "Show the phase table: state of each phase, and what runs next."),
    "show": ("runbook.commands.show", "Print one phase as written, with resolved commands."),
    "next": ("runbook.commands.next", "Run the current phase, judge it, write back, commit."),
    "logs": ("runbook.commands.logs", "Print or follow a step's output (the run in progress by default)."),
    "cancel": ("runbook.commands.cancel", "Stop the run in progress; it is recorded as interrupted."),
    "wait": ("runbook.commands.wait", "Wait for a run to end (at most --timeout s); print its state."),
    "sweep": ("runbook.commands.sweep", "Run a phase over a grid of var values as trials; --pick one."),
    "choose": ("runbook.commands.choose", "Make one run (a sweep's trial) its phase's verdict."),
    "history": ("runbook.commands.history", "List past runs with verdicts and metrics."),
    "diff": ("runbook.commands.diff", "Compare two runs: vars, commands, metrics, verdicts, code, environment."),
    "plot": ("runbook.commands.plot", "Draw a metric's series or its values across runs as PNG and SVG."),
    "record": ("runbook.commands.record", "Write a milestone and lessons into the notes."),
    "brief": ("runbook.commands.brief", "Print the handoff for a new agent or engineer."),
    "forget": ("runbook.commands.forget", "Drop a run from the ledger and the plan's results."),
    "reset": ("runbook.commands.reset", "Drop every run of a phase: it becomes not run."),
    "mcp": ("runbook.commands.mcp", "Serve these verbs to an agent host over MCP (stdio)."),
}

EXIT_CODES_HELP = """\b
Exit codes:
  0  pass (or the plan ran to its end)   3  inconclusive
  1  fail                                4  error / timeout / interrupted
  2  usage or plan errors, refusals      5  lock held by another run
With --json, stdout holds exactly one JSON document: {"schema_version", "command", "ok",
"exit_code", "result"} or {..., "ok": false, "error": {"code", "message", ...}} (docs/json.md).
"""


class LazyGroup(click.Group):
    """A click group that imports a command's module only when the command runs, and maps every
    outcome to output and an exit code (see the module docstring)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if _available(name)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS or not _available(name):
            return None
        command: click.Command = importlib.import_module(COMMANDS[name][0]).command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        code = run(self, argv, prog_name or "runbook", complete_var, **extra)
        if standalone_mode:
            sys.exit(code)
        return code


def _available(name: str) -> bool:
    return importlib.util.find_spec(COMMANDS[name][0]) is not None


def json_requested(argv: list[str]) -> bool:
    options = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in options


def command_name(argv: list[str]) -> str:
    for token in argv:
        if not token.startswith("-"):
            return token if token in COMMANDS else "runbook"
    return "runbook"


def with_json_after_the_verb(argv: list[str], environ: Mapping[str, str] = os.environ) -> list[str]:
    """`argv` with `--json` where the verb takes it: `runbook --json status` is `runbook status --json`,
    and RUNBOOK_JSON=1 in the environment adds it to every verb that has one (not `mcp`, not --help)."""
    end = argv.index("--") if "--" in argv else len(argv)
    verb = next((i for i in range(end) if not argv[i].startswith("-")), None)
    early = "--json" in argv[: end if verb is None else verb]
    asked = environ.get("RUNBOOK_JSON", "").strip().lower() in ("1", "true", "yes")
    helping = any(t in ("-h", "--help") for t in argv[:end])
    if verb is None or argv[verb] not in COMMANDS:
        return [t for t in argv if t != "--json"] if early and helping else argv
    head = [t for t in argv[:verb] if t != "--json"]
    if not (early or asked) or argv[verb] == "mcp" or helping or "--json" in argv[verb:end]:
        return head + argv[verb:] if early else argv
    return [*head, *argv[verb:end], "--json", *argv[end:]]


def _refuse_half_characters(argv: list[str]) -> None:
    """An argument runbook could not write into its UTF-8 records (the plan, the notes, the ledger) is a
    usage error: bytes that are not UTF-8 on the command line (Python keeps each as a lone surrogate,
    `\\udcff` for 0xff) or a lone `\\ud83d` escape in an MCP tool's JSON."""
    from runbook.files import half_character

    for n, token in enumerate(argv, 1):
        half = half_character(token)
        if half is not None:
            raise click.UsageError(f"argument {n} ({token!r}) holds {half!r}, which is not UTF-8 text (a byte that "
                                   "is not UTF-8, or half of a \\u escape); runbook keeps its records in UTF-8: "
                                   "pass the text in UTF-8")


def run(group: click.Group, argv: list[str], prog_name: str, complete_var: str | None = None, **extra: Any) -> int:
    """Run the CLI on `argv`; print the outcome; return the exit code."""
    from runbook.errors import take_warnings

    argv = with_json_after_the_verb(argv)
    as_json = json_requested(argv)
    name = command_name(argv)
    take_warnings()  # a fresh list for this command (the MCP server runs many in one process)
    try:
        _refuse_half_characters(argv)
        outcome = click.Group.main(group, argv, prog_name, complete_var, standalone_mode=False, **extra)
    except click.ClickException as exc:
        if not as_json:
            exc.show()
            return exc.exit_code
        return _refuse(refusal(exc, name), name, as_json)
    except (KeyboardInterrupt, Exception) as exc:
        error = refusal(exc, name)
        if error is not exc and error.code == "internal" and os.environ.get("RUNBOOK_DEBUG"):
            raise
        return _refuse(error, name, as_json)
    if isinstance(outcome, Output):
        _emit(outcome, name, as_json)
        return outcome.exit_code
    return outcome if isinstance(outcome, int) else 0


def refusal(exc: BaseException, name: str) -> RunbookError:
    """What verb `name` raising `exc` means for its user, as a RunbookError: the RunbookError itself,
    click's usage errors, Ctrl-C, a file that could not be read or written, or a bug. One mapping
    for the command line and the MCP server (runbook/mcp_server.py)."""
    from runbook.errors import RunbookError

    if isinstance(exc, RunbookError):
        return exc
    if isinstance(exc, click.ClickException):
        hint = f"see `runbook {name} --help`" if name != "runbook" else "see `runbook --help`"
        return RunbookError(exc.format_message(), "usage", hint=hint)
    if isinstance(exc, (click.exceptions.Abort, KeyboardInterrupt, EOFError)):
        return RunbookError("interrupted: nothing more was done", "interrupted")
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return RunbookError(f"runbook {name}: {where}{exc.strerror or exc}", "io",
                            file=str(exc.filename) if exc.filename else None)
    # a bug: say so plainly, with the traceback only on request
    detail = f"{type(exc).__name__}: {exc}"
    return RunbookError(f"runbook {name}: internal error ({detail})", "internal",
                        hint="rerun with RUNBOOK_DEBUG=1 for the traceback, and report it")


def error_info(exc: RunbookError) -> ErrorInfo:
    """The `error` of the --json envelope for a refusal."""
    from runbook.contract import ErrorInfo, ProblemView

    return ErrorInfo(
        code=exc.code, message=exc.message, file=exc.file, line=exc.line, col=exc.col, hint=exc.hint,
        problems=[ProblemView.of(p) for p in exc.problems], lock=exc.lock,
    )


def _emit(out: Output, name: str, as_json: bool) -> None:
    if as_json:
        from runbook.contract import envelope_json
        from runbook.errors import take_warnings

        click.echo(envelope_json(name, out.exit_code, out.result, warnings=take_warnings()))
    elif out.text is not None:
        click.echo(out.text, nl=not ends_with_newline(out.text))


def _refuse(exc: RunbookError, name: str, as_json: bool) -> int:
    """A RunbookError as output: text on stderr, or the error envelope on stdout under --json."""
    if as_json:
        from runbook.contract import envelope_json
        from runbook.errors import take_warnings

        click.echo(envelope_json(name, exc.exit_code, error=error_info(exc), warnings=take_warnings()))
    else:
        click.echo(exc.text(), err=True)
    return exc.exit_code


@click.group(cls=LazyGroup, epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="runbook-eagle")
def cli() -> None:
    """Markdown game plans that run their steps, judge their criteria and record the results.

    A plan is a Markdown file with `runbook: 1` front matter and `## Phase N: title` sections.
    `runbook next` runs the current phase, checks its `Pass:` criterion against the metrics its
    steps wrote, writes the verdict back into the plan and commits it to git.
    """


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
