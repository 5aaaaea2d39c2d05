"""Fill a Spec from a Checkpoint, one concern per module.

Each detector reads the checkpoint (config.json, tensor headers, modeling source)
and sets spec fields with their Source. Nothing here executes checkpoint code.

A detector that cannot determine a field records it (Spec.unknown, or raises
Undetermined when it cannot go on) instead of refusing, so that the user's spec
file, pinned before detection runs, can supply it. Only when fields stay unknown
does the tool refuse, naming them all at once (detect) or showing what it did
understand (understand, for `scaffold inspect`).
"""

from __future__ import annotations

import re
from typing import Any

from scaffold.checkpoint import Checkpoint
from scaffold.detect import (
    altup,
    attention,
    blocks,
    external,
    forms,
    head,
    hyperconn,
    identity,
    layout,
    mlp,
    moe,
    normparams,
    norms,
    policy,
    recurrence,
    rope,
    scaling,
    sizes,
    sublayers,
)
from scaffold.errors import ScaffoldError, SpecError
from scaffold.spec import CONFIG_KEY_FIELDS, Source, Spec, Undetermined, Unknown, validate_identifiers, validate_names

DETECTORS = (identity, sizes, layout, attention, rope, mlp, moe, norms, scaling, head, hyperconn)

# The fields a detector decides, so that those a stopped detector left undecided are named. A mixture of
# experts and an extra gate bias are features a spec adds with their names; left out, the model has neither.
DECIDES = {
    sizes: ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size",
            "max_position"),
    layout: ("names", "skipped_tensors", "qkv_layout", "qkv_bias", "o_bias", "qk_norm", "mlp_kind", "gate_up_layout", "mlp_bias",
             "block", "norm_kind", "norm_offset", "norm_bias", "tie_word_embeddings", "lm_head_bias"),
}


def detect(ckpt: Checkpoint, overrides: dict[str, Any] | None = None, origin: str | None = None) -> Spec:
    """The spec of `ckpt`, with the user's `overrides` (from the spec file `origin`) applied first; refuses,
    naming every field it could not determine, when the overrides leave any unknown."""
    return settled(understand(ckpt, overrides, origin), ckpt, origin)


def settled(spec: Spec, ckpt: Checkpoint, origin: str | None = None) -> Spec:
    """`spec` (from understand) once nothing is unknown and its names are valid; else the refusal."""
    if spec.unknowns:
        raise incomplete(spec, ckpt, origin)
    # Blame the spec file for a bad name it set, config.json for one detected.
    where = origin if origin and spec.pinned.keys() & NAMED_FIELDS else str(ckpt.config_file)
    # Syntax only: whether the package name is free is checked once the port is about to be written.
    validate_identifiers(spec, where, free=False)
    validate_names(spec, where)
    return spec


NAMED_FIELDS = {"architecture", "model_type", "class_prefix", "package", "config_class", "gate_extra_bias", "names"}


def understand(ckpt: Checkpoint, overrides: dict[str, Any] | None = None, origin: str | None = None) -> Spec:
    """What detection can tell of `ckpt`, with spec.unknowns saying what it could not: never refuses for an
    unknown, only for a checkpoint that contradicts itself (or the user's values)."""
    policy.check(ckpt)  # blocks no port expresses, shapes config.json contradicts
    forms.check(ckpt)  # forms of the code no port computes (the backend may still serve them: choose)
    spec = Spec()
    if overrides:
        values, sources = config_keyed(ckpt, dict(overrides), origin or "")
        spec.pin(values, origin or "", sources)
    # Stacks run in cycles (HRM's): the detectors read the first stack's layers as the model's one list.
    stored, ckpt = ckpt, recurrence.view(ckpt, spec)
    # The detectors read norms by their `weight`; a lab's norms may keep it as `scale` (the port maps it back).
    ckpt = normparams.view(ckpt, spec)
    ckpt = blocks.view(ckpt, spec)
    ckpt = altup.view(ckpt, spec)  # AltUp's copies of the stream: the detectors read the layer on the active copy
    whole, ckpt = ckpt, sublayers.view(ckpt, spec)
    for detector in DETECTORS:
        try:
            detector.detect(ckpt, spec)
        except Undetermined as stop:
            for u in stop.unknowns:
                spec.unknown(u.field, u.reason, u.candidates)
            _undecided(spec, detector, f"the {_name(detector)} detector stopped at {stop.unknowns[0].field}; set "
                                       "this field, or set that one and run inspect again")
        except Exception as exc:  # only while something is unknown; else re-raised
            if not spec.unknowns:
                raise
            # Checked against a value still unknown: not a finding about the checkpoint. Said, not raised.
            spec.unknowns.setdefault(f"({_name(detector)})", _blocked(detector, exc))
            _undecided(spec, detector, f"the {_name(detector)} detector stopped on a value still unknown")
    if spec.sublayer_count and not spec.unknowns:
        sublayers.check(whole, spec)  # the sublayers the view left out, against what detection found
    if spec.recurrent_stacks and not spec.unknowns:
        recurrence.settle(stored, spec)  # the stored names of what the view showed as transformers loads it
    return spec


def _name(detector) -> str:
    return detector.__name__.rsplit(".", 1)[-1]


def _undecided(spec: Spec, detector, why: str) -> None:
    for name in DECIDES.get(detector, ()):
        if name == "names" and any(u.startswith("names.") for u in spec.unknowns):
            continue  # already named role by role
        if name not in spec.provenance and name not in spec.unknowns:
            spec.unknown(name, f"not determined: {why}")


def _blocked(detector, exc: Exception) -> Unknown:
    problem = exc.problem if isinstance(exc, ScaffoldError) else f"{type(exc).__name__}: {exc}"
    return Unknown(f"({_name(detector)})", f"stopped on a value still unknown: {problem}")


def config_keyed(ckpt: Checkpoint, values: dict[str, Any], origin: str) -> tuple[dict[str, Any], dict[str, Source]]:
    """The spec file's values with its [spec.config_keys] table (field = "config key") read from config.json:
    such a field's source names the key, so the port reads `config.<key>` at run time."""
    keys = values.pop("config_keys", None)
    if keys is None:
        return values, {}
    if not isinstance(keys, dict):
        raise SpecError("'config_keys' must be a table of field = \"config.json key\".", origin)
    sources = {}
    for name, key in keys.items():
        if name not in CONFIG_KEY_FIELDS:
            raise SpecError(f"config_keys.{name}: only the sizes can name a config key "
                            f"({', '.join(CONFIG_KEY_FIELDS)}).", origin)
        value = ckpt.config.get(key) if isinstance(key, str) else None
        expected = float if name == "norm_eps" else int
        if isinstance(value, bool) or not isinstance(value, (expected, int)):
            raise SpecError(f"config_keys.{name} = {key!r}: config.json has no number under that key "
                            f"(found {value!r}).", origin)
        if name in values and values[name] != value:
            raise SpecError(f"{name} = {values[name]!r} but config_keys.{name} names config.json {key}, which holds "
                            f"{value!r}.", origin)
        values[name] = float(value) if expected is float else value
        sources[name] = Source("config", f"config.json {key} (named in {origin})", f"config.{key}")
    return values, sources


class SpecIncomplete(ScaffoldError):
    """Detection left fields unknown, and no spec file set them."""


def incomplete(spec: Spec, ckpt: Checkpoint, origin: str | None) -> SpecIncomplete:
    """The refusal for what stayed unknown: the fields, in a few lines, and how to supply them."""
    # The fields; a detector's note only when a later one settled every field it was blocked by.
    missing = [u for f, u in spec.unknowns.items() if not f.startswith("(")] or list(spec.unknowns.values())
    by_reason: dict[str, list[str]] = {}
    for u in missing:  # the reason's first clause: inspect shows the rest, and the candidates
        by_reason.setdefault(re.split(r"; | \(", u.reason, maxsplit=1)[0], []).append(u.field)
    lines = [f"  {', '.join(fields)}: {reason}" for reason, fields in by_reason.items()]
    where = "the spec file does not set" if origin else "no --spec file sets"
    if (outside := external.outside_code(ckpt)) is not None:
        # The cause is one: the model's code is elsewhere. The fields it leaves unknown, by name alone.
        return SpecIncomplete(
            f"cannot port this checkpoint: the model's code is not in it: {outside}. The tool reads what a model "
            "computes from the checkpoint's Python files or transformers' own, so "
            f"{len(missing)} spec field(s) stay unknown and {where} them: {', '.join(u.field for u in missing)}. "
            "Describe the model in a spec file (--spec).",
            origin or ckpt.config_file,
            hint=f"`scaffold inspect {ckpt.path} --spec-template spec.toml` writes a spec file with every field: fill in "
                 "those marked UNKNOWN from the package's code.",
        )
    return SpecIncomplete(
        f"cannot port this checkpoint: {len(missing)} spec field(s) could not be determined and {where} them:\n"
        + "\n".join(lines) + "\nSupply them in a spec file (--spec).",
        origin or ckpt.config_file,
        hint=f"`scaffold inspect {ckpt.path}` shows why and what was considered; with `--spec-template spec.toml` "
             "it writes a spec file with every field: fill in those marked UNKNOWN.",
    )
