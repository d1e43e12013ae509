"""The step as CUDA graphs (eagle/train/step_graph.py), what of it runs on the CPU: the sync-free accuracy
counts equal speculators' and leave no data-dependent operator in the compiled forward, the
optimizer state made before capture moves no weight, a graphed run's optimizer state resumes
without graphs, and where `eagle train` turns graphs on or refuses them. The capture itself runs in
tests/gpu/test_gpu.py (the step's losses and weights against the eager step's)."""

from __future__ import annotations

from pathlib import Path

import _train_data as td
import pytest
import torch
from click.testing import CliRunner


@pytest.fixture(scope="module")
def target_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny target and its hidden states on 4 sequences of 24 tokens, made once for the module's two
    tests that read them (neither writes there)."""
    root = tmp_path_factory.mktemp("step-graph")
    target = td.make_target(root / "target")
    return target, td.make_data(target, root / "data", n=4, length=24)


def test_sync_free_accuracy_counts_as_speculators_does() -> None:
    from speculators.models.metrics import compute_accuracy_single_step

    from eagle.drafter.model import sync_free_accuracy

    g = torch.Generator().manual_seed(0)
    for case in range(12):
        n = int(torch.randint(1, 40, (1,), generator=g))
        pred, target = torch.randint(0, 3, (1, n), generator=g), torch.randint(0, 3, (1, n), generator=g)
        mask = torch.randint(0, 2, (1, n), generator=g) if case % 3 else None
        prev = torch.randint(0, 2, (1, n), generator=g).bool() if case % 2 else None
        theirs_prev, ours_prev = (prev.clone(), prev.clone()) if prev is not None else (None, None)
        theirs = compute_accuracy_single_step(pred, target, mask, theirs_prev)
        ours = sync_free_accuracy(pred, target, mask, ours_prev)
        assert [t.dtype for t in ours] == [t.dtype for t in theirs]
        assert [float(t) for t in ours] == [float(t) for t in theirs], case
        if prev is not None:
            assert torch.equal(ours_prev, theirs_prev)  # prev_correct updated in place, as theirs


def test_drafter_forward_has_no_data_dependent_operator(target_data: tuple[Path, Path]) -> None:
    """speculators' accuracy counts select the masked positions (masked_select: the host reads the
    size back, a sync in every draft step, and a break in the compiled forward); with
    use_sync_free_metrics dynamo finds no such operator in the training forward, and the loss and
    every metric are unchanged."""
    import torch._dynamo

    from eagle.drafter import model as drafter
    from eagle.train import dataset
    from eagle.train.steps import forward, use_doc_attention

    target, data = target_data
    d2t, t2d = dataset.read_vocab(data)
    torch.manual_seed(1)
    model = drafter.build_drafter(target, layer_ids=td.LAYER_IDS, d2t=d2t, t2d=t2d, ttt_steps=3)
    use_doc_attention(model)
    batch = dataset.HiddenStates(data, budget=64).batch([0, 1], torch.device("cpu"), layout=True,
                                                         layout_multiple=8, pad_to=64)
    losses = drafter.loss_config()

    def run(b: dict) -> tuple:
        return forward(model, b, 3, losses, 0.8)

    from speculators.models import metrics as shared
    from speculators.models.eagle3 import metrics as eagle3

    original = eagle3.compute_accuracy_single_step
    eagle3.compute_accuracy_single_step = shared.compute_accuracy_single_step  # speculators' own, even if patched
    try:
        before = run(batch)
        torch._dynamo.reset()
        reasons_before = [str(r.reason) for r in torch._dynamo.explain(run)(batch).break_reasons]
    finally:
        eagle3.compute_accuracy_single_step = original
    drafter.use_sync_free_metrics()
    after = run(batch)
    torch._dynamo.reset()
    reasons_after = [str(r.reason) for r in torch._dynamo.explain(run)(batch).break_reasons]
    torch._dynamo.reset()
    assert sum("masked_select" in r for r in reasons_before) >= 3  # at least one per draft step
    assert not any("masked_select" in r or "Dynamic shape operator" in r for r in reasons_after), reasons_after
    assert torch.equal(before[0], after[0])
    assert before[1].keys() == after[1].keys()
    assert all(torch.equal(before[1][k], after[1][k]) for k in before[1])


def test_device_scalars_leaves_every_other_call_to_torch() -> None:
    """The device branch (a CUDA scalar built by torch.full) runs in tests/gpu/test_gpu.py's captures."""
    from eagle.train.step_graph import device_scalars

    original = torch.tensor
    with device_scalars():
        assert torch.tensor is not original
        for value, kwargs in ((1.5, {}), (3, {"device": "cpu"}), ([1, 2], {"dtype": torch.int32}), (True, {}),
                              (2.0, {"device": "cpu", "requires_grad": True})):
            got, want = torch.tensor(value, **kwargs), original(value, **kwargs)
            assert got.dtype == want.dtype and got.device == want.device and torch.equal(got, want)
            assert got.requires_grad == want.requires_grad
    assert torch.tensor is original


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=g)), torch.nn.Parameter(torch.randn(7, generator=g))]


def test_optimizer_state_made_before_capture_moves_no_weight() -> None:
    from eagle.train.step_graph import init_optimizer_state

    made, fresh = _params(0), _params(0)
    opt_made = torch.optim.AdamW(made, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    opt_fresh = torch.optim.AdamW(fresh, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    made[0].grad = torch.ones(5, 3)  # a gradient already there stays
    assert init_optimizer_state(opt_made) == 2 and init_optimizer_state(opt_made) == 0
    assert all(torch.equal(a, b) for a, b in zip(made, fresh, strict=True))
    assert torch.equal(made[0].grad, torch.ones(5, 3)) and made[1].grad is None
    assert all(float(v.abs().sum()) == 0 for p in made for v in opt_made.state[p].values())
    g = torch.Generator().manual_seed(1)
    for _ in range(3):  # then every step is the fresh optimizer's (weight decay included)
        for a, b in zip(made, fresh, strict=True):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        opt_made.step()
        opt_fresh.step()
        assert all(torch.equal(a, b) for a, b in zip(made, fresh, strict=True))


def test_a_graphed_runs_optimizer_state_resumes_without_graphs() -> None:
    from eagle.train.step_graph import set_capturable

    params = _params(2)
    opt = torch.optim.AdamW(params, lr=1e-2)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    set_capturable(opt, True)  # as a graphed run saves it (its counters on the parameters' device)
    saved = opt.state_dict()
    assert all(g["capturable"] for g in saved["param_groups"])
    again = torch.optim.AdamW(_params(2), lr=1e-2)
    again.load_state_dict(saved)
    set_capturable(again, False)
    assert not any(g["capturable"] for g in again.param_groups)
    assert all(s["step"].device.type == "cpu" and float(s["step"]) == 1.0 for s in again.state.values())
    for p in again.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    again.step()  # a capturable state on the CPU would fail here
    assert all(float(s["step"]) == 2.0 for s in again.state.values())


@pytest.mark.parametrize(("device", "update", "graphs"), [
    ("cuda", {"cuda_graphs": True}, True),
    ("cuda", {}, False),
    ("cpu", {}, False),
    ("cuda", {"shape_buckets": False, "warm_shapes": False}, False),
    ("cuda", {"world_size": 2}, False),
    ("cuda", {"grad_accum": 2}, False),
    ("cuda", {"cuda_graphs": False}, False),
])
def test_where_cuda_graphs_are_on(device: str, update: dict, graphs: bool) -> None:
    from eagle.train.config import TrainConfig, resolve_config

    args = TrainConfig(model="m", data="d", out="o", **update)
    assert resolve_config(args, 128, torch.device(device)).cuda_graphs is graphs


@pytest.mark.parametrize(("device", "update", "says"), [
    ("cpu", {}, "need a CUDA device"),
    ("cuda", {"world_size": 4}, "under DDP (4 processes)"),
    ("cuda", {"grad_accum": 2}, "--grad-accum"),
    ("cuda", {"shape_buckets": False, "warm_shapes": False}, "need shape buckets"),
])
def test_cuda_graphs_where_they_cannot_run_are_refused(device: str, update: dict, says: str) -> None:
    from eagle.common import EagleError
    from eagle.train.config import TrainConfig, resolve_config

    with pytest.raises(EagleError, match="--cuda-graphs") as err:
        resolve_config(TrainConfig(model="m", data="d", out="o", cuda_graphs=True, **update), 128, torch.device(device))
    assert says in str(err.value) and err.value.code == 2


def test_cuda_graphs_on_the_cpu_are_refused_by_the_cli(target_data: tuple[Path, Path], tmp_path: Path) -> None:
    from eagle.commands.train import command

    target, data = target_data
    res = CliRunner().invoke(command, ["--model", str(target), "--data", str(data), "--out", str(tmp_path / "d"),
                                       "--device", "cpu", "--cuda-graphs"])
    assert res.exit_code == 2, res.output
    assert "--cuda-graphs: they need a CUDA device" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "d").exists()
