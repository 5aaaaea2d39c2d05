"""Conventions the modeling code decides, not the config, as defaults of a generated config class.

A port reads everything from its config at run time, as vLLM's own models do. Where the
checkpoint's config.json leaves a value to its modeling code (DemoLM's rope base lives only in
`getattr(config, "rope_theta", 500000.0)`), the port's own config class (configuration.py,
registered for a model_type transformers does not know) gets that value as a default, so the
model itself holds no literal and a sibling checkpoint that does set it is served with its own.
"""

from __future__ import annotations

from typing import Any

from scaffold.spec import Spec

# config.json keys that already say where the rotary parameters are.
ROPE_KEYS = ("rope_theta", "rope_parameters", "rope_scaling", "rotary_emb_base")


def convention_defaults(spec: Spec, config: dict) -> list[tuple[str, Any]]:
    """(config key, default) for values the spec took from the modeling code or a convention."""
    out: list[tuple[str, Any]] = []
    if not any(key in config for key in ROPE_KEYS) and not rope_base_key(spec, config):
        theta = spec.rope_parameters.get("rope_theta")
        if isinstance(theta, (int, float)) and not isinstance(theta, bool):
            out.append(("rope_theta", float(theta)))
    # Set from the key the code reads unless given (config_derived).
    return out + [(standard, None) for standard, _key in config_derived(spec, config)]


def rope_base_key(spec: Spec, config: dict) -> str | None:
    """The config.json key the code takes its rotary base from, where it is not one vLLM reads (OpenELM's
    `freq_constant=config.rope_freq_constant`): the port's config class sets rope_theta from it."""
    expr = spec.source("rope_parameters").expr or ""
    key = expr[len("config."):] if expr.startswith("config.") and expr[len("config."):].isidentifier() else None
    value = config.get(key) if key else None
    if key in ROPE_KEYS or not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    return key


# The keys vLLM derives the longest sequence from (its ModelArchConfigConvertorBase.get_max_model_len).
MAX_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                   "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")


def config_derived(spec: Spec, config: dict) -> list[tuple[str, str]]:
    """(standard key, the config.json key it is read from) for the port's config class: a value vLLM reads under a
    standard name that the checkpoint's code reads under its own (OpenELM's rope_freq_constant as rope_theta, its
    max_context_length as max_position_embeddings, which vLLM would otherwise take as 2048)."""
    out = []
    key = rope_base_key(spec, config) if not any(k in config for k in ROPE_KEYS) else None
    if key:
        out.append(("rope_theta", key))
    expr = spec.source("max_position").expr or ""
    length = expr[len("config."):] if expr.startswith("config.") and expr[len("config."):].isidentifier() else None
    if (length and length not in MAX_LENGTH_KEYS and isinstance(config.get(length), int)
            and not any(k in config for k in MAX_LENGTH_KEYS)):
        out.append(("max_position_embeddings", length))
    return out
