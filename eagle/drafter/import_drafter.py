"""`eagle import-drafter`: a drafter of any published EAGLE-3 layout, written in ours.

The reading and the writing are eagle/drafter/checkpoint.py's (`read_drafter`, `write_checkpoint`); this
module is the command around them. A drafter whose values are unusable (NaN/Inf weights, a d2t that is
float or maps outside the target vocabulary; eagle/drafter/check.py `value_problems`) is refused, nothing
written. The import is lossless: tensors keep their stored dtype and an
embedding the source carries is kept; what changes is the layout (speculators' config.json,
`layers.0.*` names, explicit layer ids in vLLM's input-of-layer convention, norm flags, a Llama layer
config, an absolute verifier path). An MLA drafter has no speculators form: it is written in vLLM's MLA
layout (checkpoint.mla_layout_config: its DeepSeek-V3 layer config, eagle_config with input-convention
ids, `layers.0.*` names).

Aux layer ids whose convention is in doubt (they look like SGLang's output-of-layer ids: see
checkpoint.output_convention_hint) are refused until `--layer-convention` says which they are.

Beside the checkpoint it writes `eagle_source.json` (SOURCE_FILE): the source's layout, the convention its
ids were read in, its config.json as parsed, its safetensors metadata and the stored name of every tensor,
so that `eagle export` can give the source back (eagle/drafter/export.py). vLLM and speculators ignore it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

SOURCE_FILE = "eagle_source.json"


class ImportResult(BaseModel):
    source: str
    out: str
    layout: str  # the source's: "speculators", "eagle" (EAGLE / SpecForge) or "mla"
    layer_ids: list[int]
    layer_convention: str  # how the source's ids were read: "input" (as written) or "output" (shifted by one)
    draft_vocab_size: int
    vocab_size: int
    norm_flags: dict[str, bool]
    dtypes: list[str]
    verifier: str | None
    notes: list[str]


class SourceRecord(BaseModel):
    """eagle_source.json: what `eagle export` needs to write an imported drafter back as its source."""
    layout: str
    layer_convention: str
    config: dict[str, Any]  # the source's config.json, as parsed (key order kept)
    metadata: dict[str, str] | None  # the source's safetensors __metadata__ (None: none, or not safetensors)
    names: dict[str, str]  # our tensor name -> the source's stored name
    files: list[str]  # the source's weight files (export writes one model.safetensors)


def _source_record(ck: Any, raw: dict[str, Any]) -> SourceRecord:
    from safetensors import safe_open

    where = ck._where
    files = sorted({f for f, _ in where.values()})
    metadata = None
    if len(files) == 1 and files[0].suffix == ".safetensors":
        with safe_open(str(files[0]), "pt") as f:
            metadata = f.metadata()
    return SourceRecord(layout=ck.layout, layer_convention=ck.convention, config=raw, metadata=metadata,
                        names={name: stored for name, (_, stored) in where.items()}, files=[f.name for f in files])


def read_source_record(draft: Path) -> SourceRecord | None:
    """The eagle_source.json of an imported drafter, or None (not imported, or the file is unreadable)."""
    path = Path(draft) / SOURCE_FILE
    if not path.is_file():
        return None
    try:
        return SourceRecord.model_validate(json.loads(path.read_text()))
    except (ValueError, OSError):
        return None


def import_drafter(src: Path, out: Path, model: Path | None = None, convention: str | None = None) -> ImportResult:
    """Read `src` (any layout; its aux layer ids in `convention`, None: as written unless they look like
    the other one), check it against the target `model` when given, write ours to `out`."""
    from eagle.drafter import checkpoint
    from eagle.drafter.check import value_problems

    src, out = Path(src), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise checkpoint.CheckpointError(f"--out {out}: exists and is not an empty directory; choose a new one")
    from eagle.target import open_target

    target = open_target(model) if model is not None else None
    ck = checkpoint.read_drafter(src, target.num_layers if target is not None else None, convention=convention)
    doubt = ck.convention_doubt(target.num_layers if target is not None else None)
    if doubt is not None and ck.stored_ids:
        raise checkpoint.CheckpointError(checkpoint.convention_message(ck.stored_ids, doubt, str(src / checkpoint.CONFIG_FILE)))
    if ck.cfg.layer_ids is None:
        raise checkpoint.CheckpointError(
            f"{src / checkpoint.CONFIG_FILE}: eagle_aux_hidden_state_layer_ids is null; pass --model TARGET so "
            "vLLM's default [2, N//2, N-3] for that target can be written")
    if target is not None:
        problems = checkpoint.target_fit_problems(ck.cfg, target.text)
        if problems:
            raise checkpoint.CheckpointError(f"{src}: does not fit --model {model}: " + "; ".join(problems))
    config = dict(ck.config)
    if model is not None:
        spec = dict(config["speculators_config"])
        spec["verifier"] = dict(spec.get("verifier") or {}, name_or_path=str(model))
        config["speculators_config"] = spec
    tensors = ck.tensors()
    bad = value_problems(ck.cfg, tensors, str(ck.weights_file))
    if bad:
        raise checkpoint.CheckpointError(f"{src}: not imported, its weights are unusable: " +
                                         "; ".join(str(problem) for problem in bad))
    record = _source_record(ck, checkpoint.read_config_json(src))
    cfg = checkpoint.write_checkpoint(out, config, tensors, keep_embedding=True)
    from eagle.fsutil import atomic_write_json

    atomic_write_json(out / SOURCE_FILE, record.model_dump(), indent=1)
    written = checkpoint.read_drafter(out)
    return ImportResult(source=str(src), out=str(out), layout=ck.layout, layer_ids=list(cfg.layer_ids or []),
                        layer_convention=ck.convention,
                        draft_vocab_size=cfg.draft_vocab_size, vocab_size=cfg.vocab_size, norm_flags=cfg.flags(),
                        dtypes=sorted(set(written.dtypes.values())), verifier=written.cfg.verifier, notes=ck.notes)
