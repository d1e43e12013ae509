"""The drafters published for Kimi-K2 / K2.5 / DeepSeek-V3 (issue 46): read, written, fine-tuned, exported, served.

Each is written by tests/support/_layouts.py from the session's trained toy drafter (no network):
SpecForge's own Kimi-K2 draft config (model_type "kimi_k2"), SGLang's output-of-layer layer ids, and
weights that were never initialised (an embed_tokens of torch.empty garbage, or of zeros).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import _layouts as L
import helpers as H
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from eagle.drafter import checkpoint

REPO = Path(__file__).resolve().parents[3]
HELDOUT = REPO / "plans" / "data" / "prompts-heldout.jsonl"
EVAL = ["--prompts", str(HELDOUT), "-k", "3", "--limit", "2", "--max-new-tokens", "24", "--json"]


def run(*args: object) -> subprocess.CompletedProcess[str]:
    return H.eagle_inproc(*map(str, args))


def ok(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def accept_len(target: Path, draft: Path) -> float:
    return ok(run("evaluate", "--model", target, "--draft", draft, *EVAL, "--no-check"))["accept_len"]


@pytest.mark.slow
def test_a_kimi_k2_specforge_drafter_is_imported_evaluated_probed_tuned_exported_and_served(
        toy_target: Path, toy_data: Path, toy_drafter: Path, tmp_path: Path) -> None:
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    src = L.specforge_kimi_k2(toy_drafter, tmp_path / "kimi-k2")
    source_cfg = json.loads((src / "config.json").read_text())
    assert source_cfg["model_type"] == "kimi_k2"

    # check-checkpoint: vLLM serves the source (it builds DeepseekV3Config, head_dim given); the reading is stated
    report = ok(run("check-checkpoint", src, "--model", toy_target, "--json"))
    assert report["ok"] and report["layout"] == "eagle" and report["summary"]["layer_ids"] == [2, 4, 5]
    assert any("model_type 'kimi_k2' of the drafter layer read as 'llama'" in f for f in report["facts"])

    # import-drafter: a layer config vLLM and speculators accept (vLLM refused "kimi_k2" here before)
    res = ok(run("import-drafter", src, "--out", tmp_path / "imported", "--model", toy_target, "--json"))
    assert res["layer_convention"] == "input"
    imported = tmp_path / "imported"
    cfg = json.loads((imported / "config.json").read_text())
    assert cfg["transformer_layer_config"]["model_type"] == "llama" and "model_type" not in cfg
    assert ok(run("check-checkpoint", imported, "--model", toy_target, "--json"))["ok"]
    from eagle.drafter import model as drafter

    loaded = drafter.load_drafter(imported, toy_target)  # speculators' own Eagle3SpeculatorConfig + model
    assert loaded.config.transformer_layer_config.model_type == "llama"
    times["check + import"] = time.perf_counter() - t0

    # evaluate and probe read the source directly: the same weights give the same answers
    t0 = time.perf_counter()
    expected = accept_len(toy_target, toy_drafter)
    assert accept_len(toy_target, src) == expected == accept_len(toy_target, imported)
    probe = ok(run("probe", "--model", toy_target, "--other", toy_target, "--prompts", HELDOUT, "--draft", src,
                   "--limit", "2", "--max-new-tokens", "16", "--json"))
    assert probe["accept_len"] == probe["base_accept_len"] > 1.0
    times["evaluate x3 + probe"] = time.perf_counter() - t0

    # train --init-from, 1 epoch: the published lm_head is kept and trained (and frozen on request)
    t0 = time.perf_counter()
    proc = run("train", "--model", toy_target, "--data", toy_data, "--out", tmp_path / "tuned", "--init-from", src,
               "--epochs", "1", "--json")
    ok(proc)
    assert "lm_head: the drafter's rows (the target's for tokens new to it), trained" in proc.stderr
    theirs = checkpoint.read_drafter(src).tensors()
    tuned = checkpoint.read_drafter(tmp_path / "tuned").tensors()
    assert not torch.equal(tuned["lm_head.weight"], theirs["lm_head.weight"])
    assert torch.equal(tuned["d2t"], theirs["d2t"])
    times["train --init-from"] = time.perf_counter() - t0
    model = drafter.init_from(checkpoint.read_drafter(src, 8), toy_target, layer_ids=[2, 4, 5], d2t=theirs["d2t"],
                              t2d=theirs["t2d"], ttt_steps=3, freeze_lm_head=True)
    assert torch.equal(model.lm_head.weight, theirs["lm_head.weight"].float())  # the drafter's, not the target's
    assert not model.lm_head.weight.requires_grad
    frozen = run("train", "--model", toy_target, "--data", toy_data, "--out", tmp_path / "x", "--freeze-lm-head")
    assert frozen.returncode == 1 and "--freeze-lm-head goes with --init-from" in frozen.stderr

    # export back: the source's config (as JSON, key order too), tensors and safetensors bytes
    t0 = time.perf_counter()
    back = ok(run("export", imported, "--to", "specforge", "--out", tmp_path / "back", "--json"))
    assert back["from_source"] and back["layer_ids"] == [2, 4, 5]
    exported_cfg = json.loads((tmp_path / "back" / "config.json").read_text())
    assert exported_cfg == source_cfg and list(exported_cfg) == list(source_cfg)
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    sglang = ok(run("export", imported, "--to", "sglang", "--out", tmp_path / "sglang", "--json"))
    assert sglang["from_source"]  # the same layout, the source's convention
    # a fine-tuned drafter is written from its own config, in SGLang's output-of-layer ids
    tuned_out = ok(run("export", tmp_path / "tuned", "--to", "sglang", "--out", tmp_path / "tuned-sglang", "--json"))
    assert not tuned_out["from_source"] and tuned_out["layer_ids"] == [1, 3, 4]
    tuned_sglang = json.loads((tmp_path / "tuned-sglang" / "config.json").read_text())
    assert tuned_sglang["architectures"] == ["LlamaForCausalLMEagle3"] and tuned_sglang["model_type"] == "llama"
    with safe_open(str(tmp_path / "tuned-sglang" / "model.safetensors"), "pt") as f:
        assert "midlayer.self_attn.q_proj.weight" in set(f.keys())
    read_back = checkpoint.read_drafter(tmp_path / "tuned-sglang", 8, convention="output")
    assert read_back.cfg.layer_ids == [2, 4, 5]
    assert all(torch.equal(v, tuned[k]) for k, v in read_back.tensors().items())
    times["export x3"] = time.perf_counter() - t0

    # vLLM serves the imported copy (it refused its transformer_layer_config.model_type "kimi_k2" before)
    t0 = time.perf_counter()
    common = ["--model", toy_target, "--draft", imported, "--prompts", HELDOUT, "-k", "3", "--limit", "2",
              "--max-new-tokens", "32", "--json"]
    evaluated = ok(run("evaluate", *common))
    sb = subprocess.run([sys.executable, "-m", "eagle.cli", "serve-bench", *map(str, common), "--no-baseline",
                         "--startup-timeout", "900"], capture_output=True, text=True, timeout=1500, cwd=REPO)
    assert sb.returncode == 0, sb.stderr[-5000:]
    served = json.loads(sb.stdout)["metrics"]["vllm_accept_len"]
    times["evaluate + serve-bench"] = time.perf_counter() - t0
    print(f"\n[kimi_k2] vllm_accept_len {served:.3f} vs evaluate {evaluated['accept_len']:.3f}; "
          + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    assert abs(served - evaluated["accept_len"]) <= 0.10 * evaluated["accept_len"]


@pytest.mark.slow
def test_sglang_output_of_layer_ids_are_detected_and_mapped(toy_target: Path, toy_data: Path, toy_drafter: Path,
                                                           tmp_path: Path) -> None:
    """SpecForge's ids [1, 3, 4] (output of layers 1, 3, 4 = HF hidden_states [2, 4, 5]) are refused until the
    convention is stated; stated, the import reads [2, 4, 5] and decodes as the drafter it came from."""
    src = L.specforge_output_ids(toy_drafter, tmp_path / "sglang-ids")
    proc = run("check-checkpoint", src, "--model", toy_target)
    assert proc.returncode == 1, proc.stderr
    assert "aux layer ids [1, 3, 4] look like SGLang / SpecForge's output-of-layer convention" in proc.stderr
    assert "SpecForge's default [1, N//2-1, N-4] for a 8-layer target" in proc.stderr
    assert "hidden_states[2, 4, 5]" in proc.stderr and "--layer-convention output" in proc.stderr

    proc = run("import-drafter", src, "--out", tmp_path / "refused", "--model", toy_target)
    assert proc.returncode == 2 and "[1, 3, 4]" in proc.stderr and "--layer-convention output" in proc.stderr
    assert not (tmp_path / "refused").exists()
    proc = run("train", "--model", toy_target, "--data", toy_data, "--out", tmp_path / "tuned", "--init-from", src,
               "--epochs", "1")
    assert proc.returncode == 2 and "--layer-convention output` writes them as [2, 4, 5]" in proc.stderr
    assert not (tmp_path / "tuned").exists()

    res = ok(run("import-drafter", src, "--out", tmp_path / "imported", "--model", toy_target,
                 "--layer-convention", "output", "--json"))
    assert res["layer_ids"] == [2, 4, 5] and res["layer_convention"] == "output"
    assert ok(run("check-checkpoint", tmp_path / "imported", "--model", toy_target, "--json"))["ok"]
    # stated, check-checkpoint still refuses the source itself: vLLM would read [1, 3, 4]
    stated = run("check-checkpoint", src, "--model", toy_target, "--layer-convention", "output")
    assert stated.returncode == 1 and "serve the copy `eagle import-drafter --layer-convention output`" in stated.stderr
    assert accept_len(toy_target, tmp_path / "imported") == accept_len(toy_target, toy_drafter)
    # evaluating the source as written warns (it is what vLLM would do)
    warned = run("evaluate", "--model", toy_target, "--draft", src, *EVAL, "--no-check")
    assert warned.returncode == 0 and "warning:" in warned.stderr and "[1, 3, 4]" in warned.stderr
    # export back to SGLang: the source's ids and bytes again
    back = ok(run("export", tmp_path / "imported", "--to", "sglang", "--out", tmp_path / "back", "--json"))
    assert back["from_source"] and back["layer_ids"] == [1, 3, 4]
    assert json.loads((tmp_path / "back" / "config.json").read_text()) == json.loads((src / "config.json").read_text())
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["uninitialised", "zeros"])
def test_a_broken_embedding_fails_check_checkpoint(kind: str, toy_target: Path, toy_drafter: Path,
                                                   tmp_path: Path) -> None:
    vocab, hidden = 2048, 128
    emb = L.garbage_embedding(vocab, hidden) if kind == "uninitialised" else torch.zeros(vocab, hidden,
                                                                                          dtype=torch.bfloat16)
    assert bool(torch.isfinite(emb).all())  # no NaN/Inf: the old checks passed it
    bad = L.with_embedding(toy_drafter, tmp_path / kind, emb)
    proc = run("check-checkpoint", bad, "--model", toy_target)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    named = [line for line in proc.stderr.splitlines() if "[embed_tokens.weight]" in line]
    want = "below 1e-30 (denormal range)" if kind == "uninitialised" else "values are zero"
    assert any(want in line for line in named), proc.stderr
    assert any("rows differ from the target's embedding" in line for line in named), proc.stderr
    # the target's own embedding passes
    target_emb = load_file(str(toy_target / "model.safetensors"))["model.embed_tokens.weight"].to(torch.bfloat16)
    good = L.with_embedding(toy_drafter, tmp_path / "good", target_emb)
    assert run("check-checkpoint", good, "--model", toy_target).returncode == 0


def test_a_layer_config_is_normalised_to_llama() -> None:
    layer, notes = checkpoint.normalize_layer_config({"model_type": "deepseek_v3", "hidden_size": 64,
                                                      "kv_lora_rank": 512, "n_routed_experts": 256})
    assert layer == {"model_type": "llama", "hidden_size": 64}
    assert "'deepseek_v3'" in notes[0] and "kv_lora_rank, n_routed_experts" in notes[1]
    assert checkpoint.normalize_layer_config({"model_type": "qwen3"})[0]["model_type"] == "qwen3"


def test_output_convention_hints() -> None:
    hint = checkpoint.output_convention_hint
    assert hint([2, 4, 5], 8, "eagle") is None
    assert "SpecForge's default" in (hint([1, 3, 4], 8, "eagle") or "")
    assert "first id" in (hint([1, 30, 58], 61, "speculators") or "")
    assert "N-1 = 7" in (hint([2, 4, 7], 8, "eagle") or "")
    assert hint([2, 4, 7], 8, "speculators") is None  # ours: the input of the last layer
    assert hint([1, 4, 8], 8, "eagle") is None  # 8 = N exists only as an input id


@pytest.mark.slow
def test_what_vllm_cannot_serve_is_refused_before_serving(toy_target: Path, toy_drafter: Path, tmp_path: Path) -> None:
    """The copy import-drafter wrote before issue 46 (transformer_layer_config.model_type "kimi_k2": vLLM raises
    "Unsupported model_type") and a SpecForge config typed deepseek_v3 without head_dim (vLLM builds DeepseekV3Config,
    whose head_dim is qk_rope_head_dim = 64, not the layer's 128 / 4 = 32): each a problem with the reason."""
    old_copy = L.copy_tree(toy_drafter, tmp_path / "old-import")
    cfg = json.loads((old_copy / "config.json").read_text())
    cfg["transformer_layer_config"]["model_type"] = "kimi_k2"
    (old_copy / "config.json").write_text(json.dumps(cfg))
    proc = run("check-checkpoint", old_copy, "--model", toy_target)
    assert proc.returncode == 1, proc.stderr
    assert "[transformer_layer_config.model_type]: is 'kimi_k2'" in proc.stderr
    assert "Unsupported model_type kimi_k2 for Eagle3 speculator" in proc.stderr and "import-drafter" in proc.stderr
    assert accept_len(toy_target, old_copy) == accept_len(toy_target, toy_drafter)  # eagle reads it as the Llama layer

    ds = L.specforge(toy_drafter, tmp_path / "deepseek")
    cfg = json.loads((ds / "config.json").read_text())
    cfg["model_type"] = "deepseek_v3"
    cfg.pop("head_dim", None)
    (ds / "config.json").write_text(json.dumps(cfg))
    proc = run("check-checkpoint", ds, "--model", toy_target)
    assert proc.returncode == 1, proc.stderr
    assert "[head_dim]: absent: vLLM builds this config as model_type 'deepseek_v3'" in proc.stderr
    assert "head_dim is 64, while the Llama layer's is hidden_size / heads = 32" in proc.stderr
    imported = ok(run("import-drafter", ds, "--out", tmp_path / "imported", "--model", toy_target, "--json"))
    assert ok(run("check-checkpoint", imported["out"], "--model", toy_target, "--json"))["ok"]
