"""eagle as a library leaves its host's logging alone; the `eagle` command line quiets loguru.

speculators logs every file it opens at INFO through loguru. Only the command line, which owns its
process, drops loguru's handlers (eagle/cli.py); importing eagle.drafter.model (the speculators importer)
into another program must not clear that program's handlers."""

from __future__ import annotations

from helpers import python_snippet


def test_importing_the_drafter_keeps_the_hosts_loguru_handlers() -> None:
    done = python_snippet("""
        import sys
        from loguru import logger
        logger.add(sys.stdout, format="{message}")
        import eagle.drafter.model
        logger.info("the host still logs")
    """)
    assert done.returncode == 0, done.stderr
    assert "the host still logs" in done.stdout


def test_the_command_line_drops_loguru_handlers_before_a_verb_runs() -> None:
    done = python_snippet("""
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


def test_quiet_hf_silences_datasets_and_transformers_without_importing_them() -> None:
    """The verbs that never read a dataset or load a model do not pay for importing datasets (a third
    of a second of CPU) or transformers (a second) to silence them: their progress bars and
    transformers' warnings are off through the variables each reads on import."""
    done = python_snippet("""
        import sys
        from eagle.common import quiet_hf
        quiet_hf()
        print("datasets" in sys.modules, "transformers" in sys.modules, "huggingface_hub" in sys.modules)
        import datasets, transformers
        print(datasets.utils.are_progress_bars_disabled(), transformers.utils.logging.is_progress_bar_enabled())
        print(transformers.utils.logging.get_verbosity() == transformers.utils.logging.ERROR)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "False", "True", "False", "True"]


def test_quiet_hf_after_huggingface_hub_was_imported_still_silences_transformers() -> None:
    """huggingface_hub reads its variable when imported; transformers' bars follow the hub's switch."""
    done = python_snippet("""
        import huggingface_hub
        from eagle.common import quiet_hf
        quiet_hf()
        import transformers
        print(transformers.utils.logging.is_progress_bar_enabled())
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]


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
