"""A checkpoint `eagle train` saves loads in speculators and in vLLM, from another working directory.

The drafter is trained with the target given as a RELATIVE path (as plans write it) and with
speculators 0.9's default norm flags; the checkpoint must record the target absolutely (speculators
and `vllm serve DRAFT` resolve the verifier against their current directory) and serve the flags.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from eagle.cli import cli

HELDOUT = Path(__file__).resolve().parents[2] / "plans" / "data" / "prompts-heldout.jsonl"
K, LIMIT, MAX_NEW = 3, 4, 32

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def cwd(path: Path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@pytest.fixture(scope="module")
def relative_drafter(toy_target: Path, toy_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from eagle.train.config import TrainConfig
    from eagle.train.trainer import train

    out = tmp_path_factory.mktemp("relative") / "draft"
    with cwd(toy_target.parent):
        train(TrainConfig(model=toy_target.name, data=str(toy_data), out=str(out), norm_before_fc=True,
                        norm_output=True, norm_before_residual=True), echo=False)
    return out


@pytest.fixture
def elsewhere(tmp_path: Path):
    with cwd(tmp_path):
        yield tmp_path


def test_the_checkpoint_records_the_target_absolutely(relative_drafter: Path, toy_target: Path) -> None:
    cfg = json.loads((relative_drafter / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == str(toy_target.resolve())
    assert cfg["norm_before_fc"] and cfg["norm_output"] and cfg["norm_before_residual"]


def test_speculators_from_pretrained_loads_it(relative_drafter: Path, toy_target: Path, elsewhere: Path) -> None:
    from speculators.models.eagle3 import Eagle3DraftModel

    from eagle.decode.draft_infer import load_drafter
    from eagle.drafter import checkpoint

    model = Eagle3DraftModel.from_pretrained(str(relative_drafter))  # reads the verifier's config
    assert model.config.eagle_aux_hidden_state_layer_ids == [2, 4, 5]
    stored = checkpoint.load_draft_state(relative_drafter)
    params = dict(model.named_parameters())
    assert "input_norm.weight" in stored
    for name, value in stored.items():
        if name in params:
            assert torch.equal(params[name].detach().to(value.dtype), value), name
    # same logits as our own inference on the same weights (embedding: the verifier's)
    model = model.float()
    model._load_verifier_weights(overwrite_embed_tokens=True)
    model.config.transformer_layer_config._attn_implementation = "sdpa"
    from eagle.drafter.model import set_attn_impl

    set_attn_impl(model, "sdpa")
    ours = load_drafter(relative_drafter, target_embed=model.embed_tokens.weight, target_layers=8)
    torch.manual_seed(0)
    hs, ids = torch.randn(1, 10, 3 * 128), torch.randint(0, 2048, (1, 10))
    logits: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda m, a, o: logits.append(o[0].detach()))
    with torch.no_grad():
        model.eval()(hidden_states=hs, input_ids=ids, document_ids=torch.zeros(1, 10, dtype=torch.long),
                     position_ids=torch.arange(1, 11)[None], ttt_steps=1)
    hook.remove()
    with torch.inference_mode():
        step0, _ = ours(ours.combine(hs[0]), ids[0], torch.arange(10), ours.new_cache(16))
    torch.testing.assert_close(step0, logits[0], rtol=1e-4, atol=1e-4)


def test_vllm_serves_it_given_as_the_model(relative_drafter: Path, toy_target: Path, elsewhere: Path) -> None:
    """`vllm serve DRAFT` (the drafter directory as --model: vLLM takes the target from the
    checkpoint's verifier) from another directory, acceptance as `eagle evaluate` measures it."""
    from eagle.prompts import load_prompt_token_ids
    from eagle.serving.client import acceptance_metrics, run_prompts, spec_counters
    from eagle.serving.flags import ServerSpec
    from eagle.serving.server import free_port, running_server

    res = CliRunner().invoke(cli, ["evaluate", "--model", str(toy_target), "--draft", str(relative_drafter),
                                   "--prompts", str(HELDOUT), "-k", str(K), "--limit", str(LIMIT),
                                   "--max-new-tokens", str(MAX_NEW), "--no-check", "--json"])
    assert res.exit_code == 0, res.output
    evaluated = json.loads(res.stdout)["accept_len"]
    prompts = [list(map(int, p)) for p in load_prompt_token_ids(toy_target, HELDOUT, limit=LIMIT)]
    spec = ServerSpec(model=str(relative_drafter), k=K, port=free_port(), dtype="float32",
                      max_model_len=max(map(len, prompts)) + MAX_NEW + K + 16)
    with running_server(spec, startup_timeout=900, echo=False) as server:
        before = spec_counters(server.metrics_text())
        run_prompts(server.url, prompts, MAX_NEW)
        time.sleep(0.5)  # counters are published by the engine's stats loop
        served = acceptance_metrics(spec_counters(server.metrics_text()).minus(before))["vllm_accept_len"]
    print(f"\n[vllm, drafter as --model, from {elsewhere}] vllm_accept_len {served:.3f} vs evaluate {evaluated:.3f}")
    assert evaluated > 1.8
    assert abs(served - evaluated) <= 0.10 * evaluated
