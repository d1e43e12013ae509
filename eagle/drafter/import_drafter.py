"""`eagle import-drafter`: a drafter of any published EAGLE-3 layout, written in ours.

The reading and the writing are eagle/drafter/checkpoint.py's (`read_drafter`, `write_checkpoint`); this
module is the command around them. A drafter whose values are unusable (NaN/Inf weights, a d2t that is
float or maps outside the target vocabulary; eagle/drafter/check.py `value_problems`) is refused, nothing
written. The import is lossless: tensors keep their stored dtype and an
embedding the source carries is kept; what changes is the layout (speculators' config.json,
`layers.0.*` names, explicit layer ids and norm flags, an absolute verifier path).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel


class ImportResult(BaseModel):
    source: str
    out: str
    layout: str  # the source's: "speculators" or "eagle" (EAGLE / SpecForge)
    layer_ids: list[int]
    draft_vocab_size: int
    vocab_size: int
    norm_flags: dict[str, bool]
    dtypes: list[str]
    verifier: str | None
    notes: list[str]


def import_drafter(src: Path, out: Path, model: Path | None = None) -> ImportResult:
    """Read `src` (any layout), check it against the target `model` when given, write ours to `out`."""
    from eagle.drafter import checkpoint
    from eagle.drafter.check import value_problems

    src, out = Path(src), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise checkpoint.CheckpointError(f"--out {out}: exists and is not an empty directory; choose a new one")
    from eagle.target import open_target

    target = open_target(model) if model is not None else None
    ck = checkpoint.read_drafter(src, target.num_layers if target is not None else None)
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
    cfg = checkpoint.write_checkpoint(out, config, tensors, keep_embedding=True)
    written = checkpoint.read_drafter(out)
    return ImportResult(source=str(src), out=str(out), layout=ck.layout, layer_ids=list(cfg.layer_ids or []),
                        draft_vocab_size=cfg.draft_vocab_size, vocab_size=cfg.vocab_size, norm_flags=cfg.flags(),
                        dtypes=sorted(set(written.dtypes.values())), verifier=written.cfg.verifier, notes=ck.notes)
