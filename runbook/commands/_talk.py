"""How a long-running verb talks to the terminal (`next`, `sweep`): one `Talk` for the CLI.

Under --json, stdout carries only the envelope: what the run says and the steps' output go to stderr.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from runbook.errors import warning

if TYPE_CHECKING:
    from runbook.run.session import Talk


def cli_talk(as_json: bool) -> Talk:
    """The terminal's Talk: confirmations on the tty, step output on stdout (stderr under --json)."""
    from runbook.run.session import Talk

    return Talk(
        say=lambda msg: click.echo(msg, err=as_json),
        warn=warning,
        note=lambda msg: click.echo(msg, err=True),
        confirm=lambda question: click.confirm(question, default=True),
        interactive=lambda: sys.stdin.isatty() and sys.stdout.isatty(),
        echo=lambda: (sys.stderr if as_json else sys.stdout).buffer,
    )
