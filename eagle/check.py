"""`eagle check-checkpoint`: static checks of a drafter against its target, before anyone serves it.

vLLM loads a broken drafter silently more often than not: a missing `d2t` or a wrong layer id gives
an acceptance length near 1.0 and no error. These checks read only config.json files and the
safetensors weights (no model is built, no vLLM is started) and name every problem at once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel

from eagle.checkpoint import (
    CONFIG_FILE,
    REQUIRED_KEYS,
    WEIGHTS_FILE,
    DraftConfig,
    optional_shapes,
    shape_problems,
)
from eagle.common import EagleError, fail


class Problem(BaseModel):
    where: str  # file (and key/tensor) the problem is in
    message: str  # what is wrong and what to do

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


class CheckReport(BaseModel):
    draft: str
    target: str
    ok: bool
    problems: list[Problem]
    summary: dict[str, Any]


def _read_json(path: Path, problems: list[Problem]) -> dict[str, Any] | None:
    if not path.is_file():
        problems.append(Problem(where=str(path), message="not found"))
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        problems.append(Problem(where=f"{path}:{exc.lineno}:{exc.colno}", message=f"invalid JSON: {exc.msg}"))
        return None
    if not isinstance(data, dict):
        problems.append(Problem(where=str(path), message="expected a JSON object"))
        return None
    return data


def config_problems(cfg: dict[str, Any], target: dict[str, Any], where: str) -> list[Problem]:
    """Problems of a drafter config.json against the target's config.json (pure)."""
    out: list[Problem] = []

    def bad(key: str, message: str) -> None:
        out.append(Problem(where=f"{where} [{key}]", message=message))

    for key in REQUIRED_KEYS:
        if key not in cfg:
            hint = " (write it explicitly: vLLM defaults it to True, speculators to False)" \
                if key == "norm_before_residual" else ""
            bad(key, f"missing{hint}")
    if cfg.get("speculators_model_type", "eagle3") != "eagle3":
        bad("speculators_model_type", f"is {cfg['speculators_model_type']!r}, expected 'eagle3'")
    if "model_type" in cfg:
        bad("model_type", "a top-level model_type must not be there: vLLM then loads the drafter as a plain "
                          f"{cfg['model_type']!r} model instead of a speculators checkpoint; delete the key")
    if "norm_before_residual" in cfg and not isinstance(cfg["norm_before_residual"], bool):
        bad("norm_before_residual", f"must be true or false, got {cfg['norm_before_residual']!r}")
    for flag in ("norm_before_fc", "fc_norm", "norm_output"):
        if cfg.get(flag):
            bad(flag, "is true; not every vLLM version supports it (train with it off)")

    n_layers = target.get("num_hidden_layers")
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids) or not ids:
            bad("eagle_aux_hidden_state_layer_ids", f"must be a non-empty list of integers, got {ids!r}")
        else:
            if len(set(ids)) != len(ids):
                bad("eagle_aux_hidden_state_layer_ids", f"{ids} has repeated layers (vLLM fails in "
                    "combine_hidden_states); choose distinct ids such as [2, N//2, N-3]")
            if ids != sorted(ids):
                bad("eagle_aux_hidden_state_layer_ids", f"{ids} is not ascending; vLLM concatenates the aux "
                    "layers in layer order, so training and serving would disagree")
            if isinstance(n_layers, int):
                out_of_range = [i for i in ids if not 0 <= i < n_layers]
                if out_of_range:
                    bad("eagle_aux_hidden_state_layer_ids", f"{out_of_range} outside 0..{n_layers - 1} "
                        f"(the target has {n_layers} decoder layers)")

    tl = cfg.get("transformer_layer_config")
    if isinstance(tl, dict):
        for key in ("hidden_size", "vocab_size"):
            if key in target and tl.get(key) != target[key]:
                bad(f"transformer_layer_config.{key}", f"is {tl.get(key)}, the target's is {target[key]}")
        if tl.get("num_hidden_layers", 1) != 1:
            bad("transformer_layer_config.num_hidden_layers",
                f"is {tl.get('num_hidden_layers')}; the EAGLE-3 drafter has exactly 1 layer")
    elif "transformer_layer_config" in cfg:
        bad("transformer_layer_config", "must be an object (a 1-layer llama config)")

    dv = cfg.get("draft_vocab_size")
    if dv is not None and isinstance(target.get("vocab_size"), int):
        if not isinstance(dv, int) or not 0 < dv <= target["vocab_size"]:
            bad("draft_vocab_size", f"is {dv!r}; it must be between 1 and the target vocab {target['vocab_size']}")
    return out


def tensor_problems(cfg: DraftConfig, tensors: dict[str, Any], where: str) -> list[Problem]:
    """Shapes, finiteness and the d2t/t2d vocabulary mapping (tensors: name -> torch.Tensor)."""
    import torch

    out = [Problem(where=where, message=m + (" (d2t maps draft ids to target ids; without it vLLM "
                                             "proposes the wrong tokens and acceptance collapses to ~1)"
                                             if m.startswith("missing tensor d2t") else ""))
           for m in shape_problems(cfg, {k: tuple(v.shape) for k, v in tensors.items()})]
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            out.append(Problem(where=f"{where} [{name}]", message=f"{bad} non-finite values (NaN/Inf)"))
    d2t = tensors.get("d2t")
    if d2t is not None and tuple(d2t.shape) == (cfg.draft_vocab_size,):
        if d2t.is_floating_point():
            out.append(Problem(where=f"{where} [d2t]", message=f"dtype {d2t.dtype}; expected an integer type"))
        target_ids = d2t.long() + torch.arange(cfg.draft_vocab_size)
        outside = ((target_ids < 0) | (target_ids >= cfg.vocab_size)).nonzero().flatten().tolist()
        if outside:
            out.append(Problem(where=f"{where} [d2t]", message=f"{len(outside)} draft ids map outside the target "
                               f"vocab 0..{cfg.vocab_size - 1} (first: draft id {outside[0]} -> "
                               f"{int(target_ids[outside[0]])}); d2t must hold target_id - draft_id"))
        elif len(set(target_ids.tolist())) != cfg.draft_vocab_size:
            out.append(Problem(where=f"{where} [d2t]", message="several draft ids map to the same target id"))
        t2d = tensors.get("t2d")
        if t2d is not None and tuple(t2d.shape) == optional_shapes(cfg)["t2d"] and not outside:
            if int(t2d.bool().sum()) != cfg.draft_vocab_size or not bool(t2d.bool()[target_ids].all()):
                out.append(Problem(where=f"{where} [t2d]", message="t2d does not mark exactly the target ids d2t maps to"))
    return out


def check_checkpoint(draft: str | Path, target: str | Path) -> CheckReport:
    """Run every check; never raises for a bad checkpoint (problems are in the report)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    draft, target = Path(draft), Path(target)
    problems: list[Problem] = []
    cfg_path = draft / CONFIG_FILE
    cfg = _read_json(cfg_path, problems)
    tcfg = _read_json(target / CONFIG_FILE, problems)
    if tcfg is not None:
        from eagle.target import open_target

        try:
            tcfg = open_target(target).text  # the text model's config, also when nested (text_config, ...)
        except EagleError as exc:
            problems.append(Problem(where=str(target / CONFIG_FILE), message=str(exc)))
            tcfg = None
    summary: dict[str, Any] = {}
    if cfg is not None and tcfg is not None:
        problems += config_problems(cfg, tcfg, str(cfg_path))
    parsed: DraftConfig | None = None
    if cfg is not None:
        # parse leniently (problems above are already reported) so the tensors still get checked
        lenient = {k: v for k, v in cfg.items() if k != "model_type"}
        lenient.setdefault("norm_before_residual", False)
        try:
            parsed = DraftConfig.from_config_json(lenient, source=str(cfg_path))
        except EagleError as exc:
            if not problems:
                problems.append(Problem(where=str(cfg_path), message=str(exc)))
    weights = draft / WEIGHTS_FILE
    if not weights.is_file():
        problems.append(Problem(where=str(weights), message="not found (the drafter's weights)"))
    elif parsed is not None:
        try:
            tensors = load_file(str(weights))
        except (SafetensorError, OSError) as exc:
            problems.append(Problem(where=str(weights), message=f"unreadable safetensors file: {exc}"))
        else:
            problems += tensor_problems(parsed, tensors, str(weights))
    if parsed is not None:
        summary = {"hidden_size": parsed.hidden_size, "vocab_size": parsed.vocab_size,
                   "draft_vocab_size": parsed.draft_vocab_size, "layer_ids": parsed.layer_ids,
                   "norm_before_residual": parsed.norm_before_residual,
                   "speculative_tokens": parsed.speculative_tokens,
                   "target_layers": (tcfg or {}).get("num_hidden_layers")}
    return CheckReport(draft=str(draft), target=str(target), ok=not problems, problems=problems, summary=summary)


@click.command("check-checkpoint")
@click.argument("draft", type=click.Path(exists=True, file_okay=False))
@click.option("--model", "model", required=True, type=click.Path(exists=True, file_okay=False),
              help="The target model directory the drafter is for.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def command(draft: str, model: str, as_json: bool) -> None:
    """Check a drafter checkpoint against its target before serving it (no vLLM needed).

    \b
    Checks: config keys vLLM needs (speculators_model_type, transformer_layer_config,
    speculators_config, draft_vocab_size, norm_before_residual written, layer ids), no top-level
    model_type; layer ids distinct, ascending and within the target's layers; hidden size and
    vocab equal to the target's; fc / q,k,v / lm_head / d2t shapes; d2t maps every draft id into
    the target vocab (and agrees with t2d); every float tensor finite.

    Exit 0 when all pass; 1 listing every problem (file [key]: what is wrong).

    \b
    Example:
      eagle check-checkpoint work/draft --model work/target
    """
    try:
        report = check_checkpoint(draft, model)
    except EagleError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps(report.model_dump(), indent=1))
    elif report.ok:
        s = report.summary
        click.echo(f"ok: {draft} fits {model} (layers {s.get('layer_ids')} of {s.get('target_layers')}, "
                   f"hidden {s.get('hidden_size')}, draft vocab {s.get('draft_vocab_size')} of {s.get('vocab_size')})")
    else:
        click.echo(f"{len(report.problems)} problem(s) in {draft}:", err=True)
        for p in report.problems:
            click.echo(f"  {p}", err=True)
    if not report.ok:
        raise SystemExit(1)
