"""eagle as a library leaves its host's logging alone; the `eagle` command line quiets loguru.

speculators logs every file it opens at INFO through loguru. Only the command line, which owns its
process, drops loguru's handlers (eagle/cli.py); importing eagle.drafter.model (the speculators importer)
into another program must not clear that program's handlers."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})


def test_importing_the_drafter_keeps_the_hosts_loguru_handlers() -> None:
    done = _python("""
        import sys
        from loguru import logger
        logger.add(sys.stdout, format="{message}")
        import eagle.drafter.model
        logger.info("the host still logs")
    """)
    assert done.returncode == 0, done.stderr
    assert "the host still logs" in done.stdout


def test_the_command_line_drops_loguru_handlers_before_a_verb_runs() -> None:
    done = _python("""
        import sys
        from loguru import logger
        logger.add(sys.stdout, format="{message}")
        logger.info("before the command")
        from eagle.cli import cli
        cli(["serve-config", "--help"], standalone_mode=False)
        logger.info("after the command")
    """)
    assert done.returncode == 0, done.stderr
    assert "before the command" in done.stdout and "after the command" not in done.stdout


def test_quiet_hf_silences_datasets_without_importing_it() -> None:
    """The verbs that never read a dataset do not pay for importing datasets to silence it: its progress
    bars are off through the variable it reads on import; transformers' are off at once."""
    done = _python("""
        import sys
        from eagle.common import quiet_hf
        quiet_hf()
        print("datasets" in sys.modules)
        import datasets, transformers
        print(datasets.utils.are_progress_bars_disabled(), transformers.utils.logging.is_progress_bar_enabled())
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "False"]


def test_quiet_hf_silences_an_imported_datasets_at_once() -> None:
    import datasets

    from eagle.common import quiet_hf

    was_off = datasets.utils.are_progress_bars_disabled()
    datasets.enable_progress_bars()
    try:
        quiet_hf()
        assert datasets.utils.are_progress_bars_disabled()
    finally:
        if not was_off:
            datasets.enable_progress_bars()
