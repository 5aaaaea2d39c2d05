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
    if not any(key in config for key in ROPE_KEYS):
        theta = spec.rope_parameters.get("rope_theta")
        if isinstance(theta, (int, float)) and not isinstance(theta, bool):
            out.append(("rope_theta", float(theta)))
    return out
