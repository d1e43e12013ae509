"""`eagle probe`: hidden-state similarity of two targets and a drafter's carry-over."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import _decode_helpers as helpers
import pytest
import torch
from click.testing import CliRunner

from eagle.cli import cli

_one_thread = helpers.one_thread  # autouse, module scope: one torch thread for these tiny models


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return helpers.write_prompts(tmp_path_factory.mktemp("prompts") / "p.jsonl", 2, salt=5)


@pytest.fixture(scope="module")
def perturbed(toy_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy target with noise added to decoder layer 3 only: layers 0-3 inputs are unchanged."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("perturbed") / "target"
    shutil.copytree(toy_target, out)
    tensors = load_file(str(out / "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    for name, t in tensors.items():
        if name.startswith("model.layers.3.mlp."):
            tensors[name] = t + 0.5 * t.std() * torch.randn(t.shape, generator=gen)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _probe(args: list[str], metrics: Path):
    return CliRunner().invoke(cli, ["probe", *args], env={"RUNBOOK_METRICS": str(metrics)}, catch_exceptions=False)


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
def test_probe_same_target_is_identical(toy_target: Path, prompts_file: Path, tmp_path: Path) -> None:
    res = _probe(["--model", str(toy_target), "--other", str(toy_target), "--prompts", str(prompts_file),
                  "--max-new-tokens", "8"], tmp_path / "m.json")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "m.json").read_text())
    assert set(m) == {"cos_sim_l2", "cos_sim_l4", "cos_sim_l5", "rel_norm_diff_l2", "rel_norm_diff_l4",
                      "rel_norm_diff_l5"}
    assert all(m[f"cos_sim_l{i}"] == pytest.approx(1.0, abs=1e-5) for i in (2, 4, 5))
    assert all(m[f"rel_norm_diff_l{i}"] < 1e-5 for i in (2, 4, 5))


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
def test_probe_sees_where_targets_differ(toy_target: Path, perturbed: Path, prompts_file: Path,
                                         tmp_path: Path) -> None:
    res = _probe(["--model", str(toy_target), "--other", str(perturbed), "--prompts", str(prompts_file),
                  "--layer-ids", "3,4,6", "--max-new-tokens", "8"], tmp_path / "m.json")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["cos_sim_l3"] == pytest.approx(1.0, abs=1e-5)  # layer 3's input precedes the change
    assert m["cos_sim_l4"] < 0.9999 and m["rel_norm_diff_l4"] > 1e-3
    assert m["rel_norm_diff_l6"] > 1e-3


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
def test_probe_with_drafter_reports_acceptance(toy_target: Path, perturbed: Path, prompts_file: Path,
                                               tmp_path: Path) -> None:
    draft = helpers.make_random_drafter(toy_target, tmp_path / "draft")
    res = _probe(["--model", str(toy_target), "--other", str(perturbed), "--prompts", str(prompts_file),
                  "--draft", str(draft), "--max-new-tokens", "12"], tmp_path / "m.json")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "m.json").read_text())
    assert 1.0 <= m["accept_len"] < 1.3 and 1.0 <= m["base_accept_len"] < 1.3
    assert "cos_sim_l4" in m  # the drafter's layer ids [2, 4, 5]


@pytest.mark.slow  # toy_target: trained once per machine (minutes on a cold one)
def test_probe_refuses_mismatched_targets(toy_target: Path, prompts_file: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(toy_target, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["num_hidden_layers"] = 9
    (other / "config.json").write_text(json.dumps(cfg))
    res = _probe(["--model", str(toy_target), "--other", str(other), "--prompts", str(prompts_file)],
                 tmp_path / "m.json")
    assert res.exit_code == 1
    assert "error:" in res.output and "Traceback" not in res.output


@pytest.mark.slow
def test_probe_reports_the_old_vocabularys_coverage_of_the_new_targets_outputs(
        toy_target: Path, toy_successor: Path, toy_drafter: Path, tmp_path: Path) -> None:
    """vocab_coverage = the share of the successor's own greedy tokens the old drafter's draft
    vocabulary holds, counted independently here from transformers' greedy outputs."""
    from safetensors.torch import load_file

    from eagle.decode.evaluate import reference_greedy
    from eagle.prompts import load_prompt_token_ids

    heldout = Path(__file__).resolve().parents[3] / "plans" / "data" / "prompts-heldout.jsonl"
    res = _probe(["--model", str(toy_target), "--other", str(toy_successor), "--prompts", str(heldout),
                  "--draft", str(toy_drafter), "--limit", "4", "--max-new-tokens", "24"], tmp_path / "m.json")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "m.json").read_text())
    t2d = load_file(str(toy_drafter / "model.safetensors"))["t2d"]
    prompts = load_prompt_token_ids(toy_target, heldout, limit=4)
    for name, target in (("vocab_coverage", toy_successor), ("base_vocab_coverage", toy_target)):
        outs = [t for o in reference_greedy(target, prompts, 24, torch.device("cpu"), torch.float32) for t in o]
        assert m[name] == pytest.approx(sum(bool(t2d[t]) for t in outs) / len(outs)), name
        if name == "vocab_coverage":
            distinct = set(outs)
            assert m["vocab_coverage_distinct"] == pytest.approx(sum(bool(t2d[t]) for t in distinct) / len(distinct))
    # the drafter's vocabulary was chosen from the old target's outputs: the successor's fit it less well
    assert m["vocab_coverage"] < m["base_vocab_coverage"]
    assert "draft vocabulary covers" in res.output
