"""`eagle train --hidden-states vllm`'s refusals, before anything trains or is written (no vLLM here:
tests/e2e/test_train_from_server.py trains against a real one)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import _train_data as td
import pytest
from click.testing import CliRunner
from helpers import eagle_inproc

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return td.make_small(tmp_path_factory.mktemp("server-fed"))


class _NotExtracting(BaseHTTPRequestHandler):
    """A healthy HTTP server that is no extraction server: /health answers, completions are 404."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802
        self.send_response(404)
        self.end_headers()
        self.wfile.write(b'{"error": "no such route"}')

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def not_extracting() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _NotExtracting)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        thread.join()


def _args(target: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--model", str(target), "--data", str(data), "--out", str(out), "--device", "cpu",
            "--batch-tokens", "128", "--hidden-states", "vllm", *extra]


def test_a_server_url_with_nothing_there_is_one_line_and_exit_1(small: tuple[Path, Path], tmp_path: Path) -> None:
    from eagle.serving.server import free_port

    target, data = small
    url = f"http://127.0.0.1:{free_port()}"
    proc = eagle_inproc(*_args(target, data, tmp_path / "out", "--server", url), cwd=REPO, timeout=300)  # main's stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and f"--server {url}: nothing answers there" in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_server_that_does_not_extract_is_refused_naming_it(small: tuple[Path, Path], tmp_path: Path,
                                                             not_extracting: str) -> None:
    from eagle.cli import cli

    target, data = small
    result = CliRunner().invoke(cli, _args(target, data, tmp_path / "out", "--server", not_extracting))
    assert result.exit_code == 1, result.output
    assert f"--server {not_extracting} did not give hidden states (vLLM refused an extraction request (404)" \
           in result.output
    assert "extract_hidden_states" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("extra", "says"), [
    (["--online"], "--online (the target beside the drafter) and --hidden-states vllm"),
    (["--server", "http://x", "--server-storage", "/tmp/x"], "--server-storage is where eagle's own server writes"),
    (["--in-flight", "0"], "--in-flight must be >= 1"),
    (["--server", "http://x", "--vllm-arg", "max-model-len=64"], "--vllm-arg sets eagle's own extraction server"),
    (["--vllm-arg", "served-model-name=x"], "served-model-name"),  # eagle's own server's flags, checked before it starts
])
def test_conflicting_flags_are_refused(small: tuple[Path, Path], tmp_path: Path, extra: list[str], says: str) -> None:
    from eagle.cli import cli

    target, data = small
    result = CliRunner().invoke(cli, _args(target, data, tmp_path / "out", *extra))
    assert result.exit_code == 1 and says in result.output, result.output


def test_server_flags_need_the_vllm_source(small: tuple[Path, Path], tmp_path: Path) -> None:
    from eagle.cli import cli

    target, data = small
    args = ["train", "--model", str(target), "--data", str(data), "--out", str(tmp_path / "o"), "--server", "http://x"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "--server and --server-storage go with --hidden-states vllm" in result.output


def test_a_sample_longer_than_the_budget_is_refused_before_any_server(small: tuple[Path, Path], tmp_path: Path) -> None:
    """The length check runs on the prepared rows before eagle would start its own server (minutes on a GPU)."""
    from eagle.cli import cli

    target, data = small  # 32-token rows
    args = _args(target, data, tmp_path / "out")
    args[args.index("--batch-tokens") + 1] = "16"
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "longer than --batch-tokens 16" in result.output, result.output
    assert "vLLM" not in result.output and not (tmp_path / "out").exists()
