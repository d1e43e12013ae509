"""The agent contract: published JSON Schemas match the models, and every field is documented."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from runbook import contract, formatting
from runbook.cli import COMMANDS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_command_has_a_result_model_and_a_schema() -> None:
    # `runbook mcp` prints no result of its own: it serves the other verbs' envelopes as MCP tools
    assert set(contract.RESULTS) == set(COMMANDS) - {"mcp"}
    for command in contract.RESULTS:
        schema = contract.output_schema(command)
        assert schema["title"] == f"runbook {command} --json"
        assert set(schema["required"]) >= {"command", "ok", "exit_code"}
        assert {"schema_version", "result", "error"} <= set(schema["properties"])
    with pytest.raises(KeyError):
        contract.output_schema("nope")


@pytest.mark.parametrize("command", sorted(contract.RESULTS))
def test_published_schema_is_the_generated_one(command: str) -> None:
    path = DOCS / "schemas" / f"{command}.schema.json"
    assert path.is_file(), f"{path} missing: run `python -m runbook.contract docs/schemas`"
    assert path.read_text(encoding="utf-8") == contract.schema_text(command), (
        f"{path} drifted from runbook/contract.py: run `python -m runbook.contract docs/schemas`"
    )


def _models() -> list[type[BaseModel]]:
    found = []
    for value in vars(contract).values():
        if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == contract.__name__:
            if value not in (contract.Model, contract.Envelope) and "[" not in value.__name__:
                found.append(value)
    return found


def test_every_field_of_every_model_is_documented() -> None:
    doc = (DOCS / "json.md").read_text() + (DOCS / "brief.md").read_text()
    missing = []
    for model in _models():
        for field in model.model_fields:
            if not re.search(rf"`{field}`", doc):
                missing.append(f"{model.__name__}.{field}")
    assert not missing, f"docs/json.md does not describe: {missing}"


def test_times_are_iso_utc_to_the_second() -> None:
    assert formatting.iso_utc("2026-11-29T14:30:12.123456Z") == "2026-11-29T14:30:12Z"
    assert formatting.iso_utc("2026-11-29 14:30 UTC") == "2026-11-29T14:30:00Z"
    assert formatting.iso_utc("2026-11-29T14:30:12+02:00") == "2026-11-29T12:30:12Z"
    assert formatting.iso_utc(None) is None


def test_envelope_is_one_document_with_result_or_error() -> None:
    ok = json.loads(contract.envelope_json("init", 0, contract.InitResult(root="/r", created=[], plan="p", notes=None,
                                                                           git_init=False)))
    assert ok["ok"] is True and "error" not in ok and ok["result"]["plan"] == "p"
    err = json.loads(contract.envelope_json("next", 5, error=contract.ErrorInfo(code="locked", message="busy")))
    assert err["ok"] is False and "result" not in err and err["error"]["code"] == "locked" and err["exit_code"] == 5
