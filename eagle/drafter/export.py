"""`eagle export`: a drafter written in a published layout (the inverse of `eagle import-drafter`).

Layouts (`TARGETS`): "speculators" (ours: speculators' eagle3 config, what vLLM serves); "sglang" and
"specforge", which name one layout (SpecForge writes what SGLang serves): a top-level llama config with
architectures ["LlamaForCausalLMEagle3"], eagle_config.eagle_aux_hidden_state_layer_ids, weights under
midlayer.*, tensors in their stored dtype; "mla", an MLA drafter's only layout (vLLM's
Eagle3DeepseekV2ForCausalLM: a top-level DeepSeek-V3 config, eagle_config, input-convention ids).
An MLA drafter goes only to "mla", a Llama-layer drafter never.

An MLA drafter read in the MLA layout as vLLM serves it (`checkpoint.vllm_mla_ready`: vLLM's architecture
name, a model_type vLLM does not turn into its MTP model) and exported to it in the convention it was
read in is written back as it is: its config.json dict (json, indent 2: byte-identical to a source written so), every
tensor under its stored name, its safetensors metadata (model.safetensors byte-identical to a
source that safetensors wrote as one file).

Layer ids are written in the layout's convention unless `convention` says otherwise: "input" (HF
hidden_states[i], ours and vLLM's) for speculators, "output" (HF hidden_states[i+1], SGLang's and
SpecForge's) for sglang / specforge; exporting an imported drafter to its source's layout uses the
convention its ids were imported in.

Round trip. A drafter written by `eagle import-drafter` carries eagle_source.json (its source's config,
safetensors metadata and stored tensor names). Exported to the source's layout in the source's
convention, while its config means what the source's does (the same DraftConfig, the verifier aside),
the export IS the source: config.json equal to the source's as JSON (the same keys, values and key
order: model_type "kimi_k2", bos ids, torch_dtype all come back), every tensor under its stored name
with equal dtype, shape and bytes, and the same safetensors metadata, so model.safetensors is
byte-identical to a source that safetensors wrote as one file. A drafter changed since (fine-tuned,
another layout) is written from its own config in that layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from eagle.drafter import checkpoint
from eagle.drafter.import_drafter import SourceRecord, read_source_record

TARGETS = {"speculators": "speculators", "sglang": "eagle", "specforge": "eagle", "mla": "mla"}
LAYOUT_CONVENTION = {"speculators": "input", "eagle": "output", "mla": "input"}
_LAYER_KEYS_DROPPED = ("architectures", "dtype", "torch_dtype", "transformers_version", "_attn_implementation",
                       "_name_or_path")
_DTYPE_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "bfloat16": "bfloat16",
                "float16": "float16", "float32": "float32"}


class ExportResult(BaseModel):
    draft: str
    out: str
    to: str
    layout: str  # "speculators" or "eagle"
    layer_ids: list[int]  # as written
    layer_convention: str
    from_source: bool  # the source's config, names and metadata written back (see the module docstring)
    notes: list[str]


def _source_meaning(source: SourceRecord) -> checkpoint.DraftConfig | None:
    """The DraftConfig of the source's config, read as import-drafter read it (None if it cannot be read)."""
    raw = dict(source.config)
    try:
        config, _ = checkpoint.LAYOUT_READERS[source.layout](raw)
        config = {k: v for k, v in config.items() if k not in checkpoint._DROP_KEYS}
        ids = config.get("eagle_aux_hidden_state_layer_ids")
        if source.layer_convention == "output" and isinstance(ids, list):
            config["eagle_aux_hidden_state_layer_ids"] = [int(i) + 1 for i in ids]
        return checkpoint.DraftConfig.from_config_json(config)
    except checkpoint.CheckpointError:
        return None


def _same_meaning(a: checkpoint.DraftConfig, b: checkpoint.DraftConfig) -> bool:
    skip = {"verifier", "speculative_tokens"}  # import records the target as verifier; the eagle layout has no k
    return a.model_dump(exclude=skip) == b.model_dump(exclude=skip)


def stored_ids(ids: list[int], convention: str, where: str) -> list[int]:
    """Our ids (HF hidden_states indices) in `convention`."""
    if convention == "input":
        return list(ids)
    if min(ids) < 1:
        raise checkpoint.CheckpointError(f"{where}: layer id 0 (the embedding's output) has no output-of-layer form; "
                                         "export with --layer-convention input")
    return [i - 1 for i in ids]


def eagle_layout_config(ck: checkpoint.Checkpoint, convention: str, dtype: str) -> dict[str, Any]:
    """The SpecForge / SGLang config.json of a checkpoint (ours in memory)."""
    cfg = ck.cfg
    assert cfg.layer_ids is not None  # ours always has them
    tl = {k: v for k, v in ck.config["transformer_layer_config"].items() if k not in _LAYER_KEYS_DROPPED}
    config: dict[str, Any] = {**tl, "architectures": [checkpoint.EAGLE_ARCHITECTURE], "num_hidden_layers": 1,
                              "torch_dtype": dtype, "draft_vocab_size": cfg.draft_vocab_size,
                              "eagle_config": {"eagle_aux_hidden_state_layer_ids":
                                               stored_ids(cfg.layer_ids, convention, str(ck.source)),
                                               "use_aux_hidden_state": True}}
    for flag, on in cfg.flags().items():
        if on:
            config[flag] = True
    if cfg.norm_before_fc:
        config["eagle_config"]["norm_before_fc"] = True
    if cfg.target_hidden_size and cfg.target_hidden_size != cfg.hidden_size:
        config["target_hidden_size"] = cfg.target_hidden_size
    return config


def _mla_export(ck: checkpoint.Checkpoint, convention: str
                ) -> tuple[dict[str, Any], dict[str, str], dict[str, str], bool]:
    """(config.json dict, tensor names, safetensors metadata, written back as it is) of an MLA drafter."""
    from safetensors import safe_open

    assert ck.cfg.layer_ids is not None  # export_drafter checked
    raw = checkpoint.read_config_json(ck.source)
    if ck.layout == "mla" and convention == ck.convention and ck.weights_file.suffix == ".safetensors" \
            and checkpoint.vllm_mla_ready(raw):
        with safe_open(str(ck.weights_file), "pt") as f:
            metadata = f.metadata() or {}
        return raw, ck.stored_names(), metadata, True
    ids = stored_ids(ck.cfg.layer_ids, convention, str(ck.source))
    names = {k: k.replace("layers.0.", "midlayer.", 1) if k.startswith("layers.0.") else k for k in ck.shapes}
    return checkpoint.mla_layout_config(ck.config, layer_ids=ids), names, {"format": "pt"}, False


def export_drafter(draft: Path, to: str, out: Path, convention: str | None = None) -> ExportResult:
    """Write the drafter in `draft` (any layout eagle reads) to `out` in the layout `to`."""
    from safetensors.torch import save_file

    from eagle.drafter.check import value_problems
    from eagle.fsutil import atomic_path, atomic_write_json

    draft, out = Path(draft), Path(out)
    if to not in TARGETS:
        raise checkpoint.CheckpointError(f"--to {to!r}: expected one of {', '.join(TARGETS)}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise checkpoint.CheckpointError(f"--out {out}: exists and is not an empty directory; choose a new one")
    layout = TARGETS[to]
    ck = checkpoint.read_drafter(draft)
    if ck.cfg.layer_ids is None:
        raise checkpoint.CheckpointError(f"{draft / checkpoint.CONFIG_FILE}: eagle_aux_hidden_state_layer_ids is null; "
                                         "import it with `eagle import-drafter --model TARGET` first")
    if ck.cfg.is_mla != (layout == "mla"):
        raise checkpoint.CheckpointError(
            f"{draft}: an MLA drafter (DeepSeek multi-head latent attention) has one layout, vLLM's "
            f"{checkpoint.MLA_VLLM_ARCHITECTURE}: export it --to mla" if ck.cfg.is_mla else
            f"--to mla: {draft} is a Llama-layer drafter, not an MLA one; export it --to speculators, sglang or specforge")
    source = read_source_record(draft)
    own = source is not None and source.layout == layout
    if convention is None:
        convention = source.layer_convention if own and source is not None else LAYOUT_CONVENTION[layout]
    tensors = ck.tensors()
    bad = value_problems(ck.cfg, tensors, str(ck.weights_file))
    if bad:
        raise checkpoint.CheckpointError(f"{draft}: not exported, its weights are unusable: " +
                                         "; ".join(str(problem) for problem in bad))
    notes: list[str] = []
    meaning = _source_meaning(source) if own and source is not None else None
    from_source = (source is not None and meaning is not None and convention == source.layer_convention
                   and _same_meaning(meaning, ck.cfg)
                   and (layout != "mla" or checkpoint.vllm_mla_ready(source.config)))
    if from_source and source is not None:
        config, metadata = dict(source.config), source.metadata
        names = {k: source.names.get(k, k) for k in tensors}
        notes.append(f"the source's config.json, tensor names and metadata written back ({source.layout} layout)")
    elif layout == "mla":
        config, names, metadata, from_source = _mla_export(ck, convention)
        if from_source:
            notes.append("its own config.json, tensor names and metadata written back (MLA layout)")
    elif layout == "eagle":
        dtypes = sorted({ck.dtypes[n] for n in tensors if n not in ("d2t", "t2d")})
        config = eagle_layout_config(ck, convention, _DTYPE_NAMES.get(dtypes[0], dtypes[0]) if dtypes else "bfloat16")
        metadata = {"format": "pt"}
        names = {k: k.replace("layers.0.", "midlayer.", 1) if k.startswith("layers.0.") else k for k in tensors}
        if source is not None and not own:
            notes.append(f"imported from the {source.layout} layout; written from its own config in the eagle layout")
    else:
        ids = ck.cfg.layer_ids
        config, _, tensors = checkpoint.prepare_checkpoint(out, dict(ck.config), tensors, keep_embedding=True)
        config["eagle_aux_hidden_state_layer_ids"] = stored_ids(ids, convention, str(draft))
        metadata = {"format": "pt"}
        names = {k: k for k in tensors}
    written_ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids",
                                                        config.get("eagle_aux_hidden_state_layer_ids"))
    if to == "sglang" and convention == "output" and written_ids and written_ids[0] != 1:
        notes.append(f"SGLang adds 1 to the ids {written_ids} only when the first is 1 since sglang#25454, always "
                     "before it: older and newer SGLang read these ids differently")
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / checkpoint.WEIGHTS_FILE) as tmp:
        save_file({names[k]: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    atomic_write_json(out / checkpoint.CONFIG_FILE, config, indent=2)
    return ExportResult(draft=str(draft), out=str(out), to=to, layout=layout, layer_ids=list(written_ids or []),
                        layer_convention=convention, from_source=from_source, notes=notes)
