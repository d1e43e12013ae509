"""The `runbook` command line.

Each verb lives in its own module under `runbook/commands/` and is imported only when it is
invoked, so `runbook --help` starts without loading anything heavy (no torch, no git).
"""

from __future__ import annotations

import importlib
import importlib.util

import click

# verb -> (module, one-line help shown by `runbook --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("runbook.commands.init", "Scaffold plans/, notes, state/ and runbook.toml."),
    "validate": ("runbook.commands.validate", "Check plans; print every problem as file:line:col."),
    "status": ("runbook.commands.status", "Show the phase table: status and last verdict."),
    "show": ("runbook.commands.show", "Print one phase as written, with resolved commands."),
    "next": ("runbook.commands.next", "Run the current phase, judge it, write back, commit."),
    "history": ("runbook.commands.history", "List past runs with verdicts and metrics."),
    "record": ("runbook.commands.record", "Write a milestone and lessons into the notes."),
    "brief": ("runbook.commands.brief", "Print the handoff for a new agent or engineer."),
}

EXIT_CODES_HELP = """\b
Exit codes:
  0  pass (or the plan ran to its end)   3  inconclusive
  1  fail                                4  error / timeout / interrupted
  2  usage or plan errors                5  lock held by another run
"""


class LazyGroup(click.Group):
    """A click group that imports a command's module only when the command runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if _available(name)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS or not _available(name):
            return None
        module = importlib.import_module(COMMANDS[name][0])
        return module.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _available(name: str) -> bool:
    return importlib.util.find_spec(COMMANDS[name][0]) is not None


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
