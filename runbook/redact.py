"""What runbook never writes into a record it commits: passwords inside URLs.

`redact_credentials` replaces the password of `scheme://user:password@host` with `***`. The run
record's models apply it to everything a user or a step wrote that the record keeps (step
commands, log tails, vars: runbook/model.py), so no code path can commit one; env values are
filtered in runbook/run/envprint.py. Pure, no imports beyond `re`.
"""

from __future__ import annotations

import re

__all__ = ["redact_credentials"]

_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/:@'\"]+):[^\s/@'\"]+@")


def redact_credentials(text: str) -> str:
    """`scheme://user:password@host` -> `scheme://user:***@host`, everywhere in `text`."""
    if "@" not in text or "://" not in text:
        return text
    return _URL_PASSWORD.sub(r"\1:***@", text)
