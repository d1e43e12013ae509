"""Loaded by every Python process a fast test starts (conftest.py puts tests/site on PYTHONPATH for
tests not marked slow): install tests/support/training_guard.py there too, so an `eagle train` or a vLLM
server started by a fast test, however deep, is noticed."""

import os
import sys

if os.environ.get("RUNBOOK_TEST_GUARD"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import training_guard

    sys.path.pop(0)
    training_guard.install()
