"""eagle/data/engine_check.py's pure parts: the verdict against bf16 rounding, the sums, the metric names."""

from __future__ import annotations

import pytest
import torch

from eagle.data.engine_check import BF16_LEVEL, DIFFERS, EngineCheck, Sums, verdicts


def test_a_layer_is_bf16_level_up_to_tolerance_times_the_yardstick() -> None:
    got = verdicts(["2", "last"], [0.008, 0.0081], [0.99, 0.98], [0.004, 0.004], tolerance=2.0)
    assert [(s.layer, s.verdict, s.ratio) for s in got] == [("2", BF16_LEVEL, pytest.approx(2.0)),
                                                            ("last", DIFFERS, pytest.approx(2.025))]
    assert verdicts(["1"], [0.0], [1.0], [0.0], 2.0)[0].verdict == BF16_LEVEL  # both exact
    assert verdicts(["1"], [1e-9], [1.0], [0.0], 2.0)[0].verdict == DIFFERS


def test_sums_weigh_every_token_and_column_alike() -> None:
    ref = torch.ones(3, 2, 4)
    got = ref.clone()
    got[:, 1] *= 1.5  # column 1: 50% larger, same direction
    s = Sums(2)
    s.add(got, ref)
    s.add(ref[:1], ref[:1])
    rel, cos = s.means()
    assert s.tokens == 4 and rel == pytest.approx([0.0, 0.375]) and cos == pytest.approx([1.0, 1.0])


def test_metrics_name_each_layer_and_the_verdict() -> None:
    layers = verdicts(["2", "last"], [0.004, 0.02], [0.999, 0.99], [0.004, 0.005], 2.0)
    report = EngineCheck(model="m", dtype="bfloat16", samples=1, tokens=5, layer_ids=[2], tolerance=2.0, layers=layers,
                         agree=False, vllm_seconds=1.0, vllm_flags=[])
    m = report.metrics()
    assert set(m) == {"engine_rel_diff_l2", "engine_cos_sim_l2", "engine_bf16_rel_diff_l2", "engine_rel_diff_last",
                      "engine_cos_sim_last", "engine_bf16_rel_diff_last", "engine_max_ratio", "engine_max_rel_diff",
                      "engines_agree"}
    assert m["engines_agree"] == 0 and m["engine_max_ratio"] == pytest.approx(4.0)
