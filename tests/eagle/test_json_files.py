"""Every JSON file eagle is handed (config.json, `--draft-config`) is checked before it is read:
special files are refused at once naming the path (never a hang), size and nesting are bounded,
non-UTF-8 text is named; the commands turn that into their own clear errors (issue 51)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import helpers as H
import pytest
from click.testing import CliRunner

from eagle.common import EagleError
from eagle.fsutil import JSON_MAX_DEPTH, JsonFileError, read_json_file


def _special(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind}.json"
    return H.special_file(path, kind) if kind in H.SPECIAL_KINDS else path


def _finishes(fn, timeout: float = 10.0):
    """fn() run in a thread that must end within `timeout` (a FIFO read would block for ever)."""
    out: dict[str, object] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "it hung"
    return out


@pytest.mark.parametrize("kind, why", [("fifo", "a FIFO"), ("dev-zero", "a character device"),
                                       ("directory", "a directory")])
def test_special_files_are_refused_at_once_naming_the_path(tmp_path: Path, kind: str, why: str) -> None:
    path = _special(tmp_path, kind)
    out = _finishes(lambda: read_json_file(path))
    error = out.get("error")
    assert isinstance(error, JsonFileError), out
    assert str(error).startswith(f"{path}: {why}, not a JSON file"), error


def test_deep_big_and_undecodable_json_are_named(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000)  # past json's own recursion limit
    with pytest.raises(JsonFileError, match="nested too deeply"):
        read_json_file(deep)
    middling = tmp_path / "middling.json"
    middling.write_text('{"a": ' * (JSON_MAX_DEPTH + 5) + "1" + "}" * (JSON_MAX_DEPTH + 5))  # json parses it
    with pytest.raises(JsonFileError, match=f"more than {JSON_MAX_DEPTH} levels"):
        read_json_file(middling)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"x": "y" * 2000}))
    with pytest.raises(JsonFileError, match="more than the 1,000 a JSON file here may hold"):
        read_json_file(big, max_bytes=1000)
    latin = tmp_path / "latin.json"
    latin.write_bytes('{"name": "caf\xe9"}'.encode("latin-1"))
    with pytest.raises(JsonFileError, match=r"not UTF-8 text \(byte 0xe9 at offset 13\); save it as UTF-8"):
        read_json_file(latin)
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"ok": [1, {"b": 2}]}).encode())
    assert read_json_file(bom) == {"ok": [1, {"b": 2}]}
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1,}')
    with pytest.raises(json.JSONDecodeError):  # syntax errors keep their line and column for the caller
        read_json_file(bad)


@pytest.mark.parametrize("kind", ["fifo", "deep", "latin"])
def test_drafter_config_and_draft_config_readers_refuse_cleanly(tmp_path: Path, kind: str) -> None:
    from eagle.drafter.checkpoint import CheckpointError, read_config_json
    from eagle.target import read_draft_shape

    ckpt = tmp_path / "draft"
    ckpt.mkdir()
    config = ckpt / "config.json"
    if kind == "fifo":
        os.mkfifo(config)
    elif kind == "deep":
        config.write_text("[" * 5000 + "]" * 5000)
    else:
        config.write_bytes(b'{"x": "\xff"}')
    why = {"fifo": "a FIFO", "deep": "nested too deeply", "latin": "not UTF-8 text"}[kind]
    out = _finishes(lambda: read_config_json(ckpt))
    assert isinstance(out.get("error"), CheckpointError) and why in str(out["error"]), out
    assert str(config) in str(out["error"])
    out = _finishes(lambda: read_draft_shape(config))
    error = out.get("error")
    assert isinstance(error, EagleError) and error.code == 2 and why in str(error), out
    assert str(error).startswith(f"--draft-config {config}: "), error


def test_check_checkpoint_on_a_fifo_config_is_a_message_not_a_hang(tmp_path: Path) -> None:
    from eagle.cli import cli

    ckpt = tmp_path / "draft"
    ckpt.mkdir()
    os.mkfifo(ckpt / "config.json")
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                                    "vocab_size": 256}))
    out = _finishes(lambda: CliRunner().invoke(cli, ["check-checkpoint", str(ckpt), "--model", str(target)]),
                    timeout=60)
    result = out["value"]
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    assert "config.json" in result.output and "FIFO" in result.output, result.output


def test_dead_writers_temporaries_are_removed_and_live_or_foreign_ones_kept(tmp_path: Path) -> None:
    import subprocess
    import sys

    from eagle.fsutil import _host, remove_dead_temps, temp_name

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid of this host that no process holds now (reaped)
    live = temp_name(tmp_path / "hs_1.safetensors")
    assert live.name.startswith(f".tmp-hs_1.safetensors-{_host()}-{os.getpid()}-")
    dead = tmp_path / f".tmp-hs_2.safetensors-{_host()}-{gone.pid}-140"
    dead_dir = tmp_path / f".tmp-epoch-3-{_host()}-{gone.pid}-7"
    foreign = tmp_path / f".tmp-hs_3.safetensors-othernode-{gone.pid}-140"  # another node's shard may be alive
    odd = tmp_path / ".tmp-notes"
    for f in (live, dead, foreign, odd):
        f.write_bytes(b"half")
    dead_dir.mkdir()
    (dead_dir / "state.pt").write_bytes(b"x")
    assert remove_dead_temps(tmp_path) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, foreign.name, odd.name])
    assert remove_dead_temps(tmp_path / "missing") == 0
