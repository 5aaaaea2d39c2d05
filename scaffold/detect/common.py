"""Helpers shared by the detectors: reading config keys with their provenance."""

from __future__ import annotations

from typing import Any

from scaffold.checkpoint import Checkpoint
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.spec import Source, Spec

MISSING = object()
BACKEND_HINT = (
    "vLLM's transformers backend (`vllm serve CKPT --model-impl transformers`) may serve it if the model's "
    "transformers code is compliant with it."
)


def unsupported(feature: str, where, model_type: str | None) -> UnsupportedArchitecture:
    """The error for an architecture feature the generator cannot express, naming the feature."""
    return UnsupportedArchitecture(f"{feature}; the generator cannot express this yet.", where,
                                   hint=BACKEND_HINT if model_type else "")


def config_value(ckpt: Checkpoint, *keys: str) -> tuple[str | None, Any]:
    """The first of `keys` present (and not null) in config.json, with its key; a key `K.Y` reads Y of the sub-config
    K (DBRX's `ffn_config.moe_num_experts`: config.json's K is a dict, the loaded config's an object with Y)."""
    for key in keys:
        if ckpt.config.get(key) is not None:
            return key, ckpt.config[key]
        outer, dot, inner = key.partition(".")
        if dot and isinstance(ckpt.config.get(outer), dict) and ckpt.config[outer].get(inner) is not None:
            return key, ckpt.config[outer][inner]
    return None, MISSING


def set_from_config(
    spec: Spec,
    ckpt: Checkpoint,
    field: str,
    keys: tuple[str, ...],
    kind: type | tuple[type, ...],
    default: Any = MISSING,
    runtime: bool = True,
) -> Any:
    """Set `field` from the first present config key, else `default`.

    With runtime=True the generated model reads the value from its config
    (`config.<key>`), so one port serves every size of the architecture.
    """
    key, value = config_value(ckpt, *keys)
    if key is not None:
        if not isinstance(value, kind) or isinstance(value, bool) and bool not in _tuple(kind):
            raise CheckpointError(f"config key {key!r} must be {_names(kind)}, not {value!r}.", ckpt.config_file)
        spec.set(field, value, Source("config", f"config.json {key}", f"config.{key}" if runtime else None))
        return value
    if default is MISSING:
        # Unknown, not refused: the user's spec file may say (scaffold.detect refuses if nothing does).
        spec.unknown(field, f"config.json has none of the keys {', '.join(keys)}",
                     tuple((key, "not in config.json") for key in keys))
        return None
    spec.set(field, default, Source("default", f"no {' / '.join(keys)} in config.json"))
    return default


def _tuple(kind):
    return kind if isinstance(kind, tuple) else (kind,)


def _names(kind) -> str:
    return " or ".join(k.__name__ for k in _tuple(kind))


def stored_shape(spec: Spec, role: str, shape: tuple[int, int]) -> tuple[int, int]:
    """The shape the checkpoint stores a projection's weight in: `shape` ([out, in], nn.Linear's), reversed for
    a role whose class stores it [in, out] (GPT-2's Conv1D, spec.transposed_roles)."""
    return (shape[1], shape[0]) if role in spec.transposed_roles else shape
