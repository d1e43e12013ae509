"""The `eagle` command line: the EAGLE-3 drafter pipeline.

Each verb's click command is the `command` object of the module named below (eagle/commands/VERB.py;
`train` stays in eagle/train/trainer.py until its verb moves there too); modules are imported only
when their verb runs, so `eagle --help` is instant.
"""

from __future__ import annotations

import importlib
import importlib.util

import click

# verb -> (module holding `command`, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "toy-target": ("eagle.commands.toy_target", "Make a tiny trained target (Llama, Qwen3, DeepSeek-V3, Kimi-K2.5 layout) or its successor locally."),
    "prepare": ("eagle.commands.prepare", "Conversations -> token ids + assistant-only loss mask."),
    "extract": ("eagle.commands.extract", "Target hidden states in speculators' offline format."),
    "vocab": ("eagle.commands.vocab", "Draft vocabulary: d2t / t2d from token frequencies."),
    "train": ("eagle.commands.train", "Train (or fine-tune) the EAGLE-3 drafter."),
    "evaluate": ("eagle.commands.evaluate", "Greedy speculative decoding: acceptance length, exactness."),
    "bench": ("eagle.commands.bench", "tok/s of plain vs speculative decoding, Leviathan bound."),
    "check-engines": ("eagle.commands.check_engines", "transformers vs vLLM hidden states on the same tokens, against bf16 rounding."),
    "probe": ("eagle.commands.probe", "How alike two targets are; does a drafter carry over?"),
    "serve-bench": ("eagle.commands.serve_bench", "vLLM: the target alone and with the drafter; speedup, acceptance."),
    "serve-config": ("eagle.commands.serve_config", "The vLLM and SGLang command lines that serve the drafter."),
    "check-checkpoint": ("eagle.commands.check_checkpoint", "Static checks of a drafter checkpoint against its target."),
    "import-drafter": ("eagle.commands.import_drafter", "A drafter of any published EAGLE-3 layout, written in ours."),
    "export": ("eagle.commands.export", "A drafter written in a published layout: speculators, SGLang / SpecForge."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if importlib.util.find_spec(COMMANDS[name][0]) is not None]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.list_commands(ctx):
            return None
        return importlib.import_module(COMMANDS[name][0]).command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="runbook-eagle")
def cli() -> None:
    """EAGLE-3 drafter pipeline: toy-target -> prepare -> extract -> vocab -> train -> evaluate.

    Every command prints a short table and, when $RUNBOOK_METRICS names a file, merges its summary
    metrics into it as a flat JSON object (that is how `runbook next` judges a phase).
    """
    quiet_library_logs()


def quiet_library_logs() -> None:
    """Drop loguru's handlers: speculators logs every file it opens at INFO, and our commands print
    their own tables. The command line owns its process, so it may; eagle's modules imported into
    another program leave that program's handlers alone."""
    from loguru import logger

    logger.remove()


def main() -> None:
    """Run the CLI. An exception no command turned into `error: ...` still ends as one line on
    stderr and exit 1 (set EAGLE_TRACEBACK=1 to see the traceback): no traceback reaches a user."""
    import os

    from eagle.common import EagleError, collect_less, fail
    from eagle.fsutil import SpecialFileError

    collect_less()  # before any command imports torch or transformers
    try:
        cli()
    except EagleError as exc:
        fail(str(exc))
    except SpecialFileError as exc:  # a directory where a command writes a file (eagle.fsutil.atomic_path)
        fail(str(exc), code=2)
    except KeyboardInterrupt:
        fail("interrupted", code=130)
    except Exception as exc:
        if os.environ.get("EAGLE_TRACEBACK"):
            raise
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        fail(f"{type(exc).__name__}: {detail[:500]} -- eagle did not expect this; rerun with EAGLE_TRACEBACK=1 "
             "for the traceback, and report it if the inputs look right")


if __name__ == "__main__":
    main()
