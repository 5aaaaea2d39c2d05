"""Rotary embedding parameters: config.json first, then defaults in the modeling code."""

from __future__ import annotations

from scaffold.checkpoint import Checkpoint
from scaffold.detect.sourcecode import config_default
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.spec import Source, Spec

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")
DEFAULT_THETA = 10000.0


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    where = ckpt.config_file
    cfg = ckpt.config
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        params = dict(params)
        source = Source("config", "config.json rope_parameters")
    else:
        params = {}
        scaling = cfg.get("rope_scaling")
        if isinstance(scaling, dict):
            params.update(scaling)
            if "type" in params and "rope_type" not in params:
                params["rope_type"] = params.pop("type")
        if cfg.get("rope_theta") is not None:
            params["rope_theta"] = cfg["rope_theta"]
            source = Source("config", "config.json rope_theta")
        else:
            found = config_default(ckpt, "rope_theta")
            if found is not None:
                params["rope_theta"] = found.value
                source = Source("code", f"{found}: default of getattr(config, 'rope_theta', ...)")
            else:
                params["rope_theta"] = DEFAULT_THETA
                source = Source("default", "no rope_theta in config.json or the modeling source")
    params.setdefault("rope_type", "default")
    if not isinstance(params["rope_theta"], (int, float)) or params["rope_theta"] <= 0:
        raise CheckpointError(f"rope_theta must be a positive number, not {params['rope_theta']!r}.", where)
    params["rope_theta"] = float(params["rope_theta"])
    if params["rope_type"] not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedArchitecture(f"rope type {params['rope_type']!r} is not supported.", where)
    spec.set("rope_parameters", params, source)

    factor = cfg.get("partial_rotary_factor", params.get("partial_rotary_factor"))
    if factor is not None:
        if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
            raise CheckpointError(f"partial_rotary_factor must be in (0, 1], not {factor!r}.", where)
        spec.set("partial_rotary_factor", float(factor), Source("config", "config.json partial_rotary_factor"))
    else:
        spec.set("partial_rotary_factor", 1.0, Source("default", "rotary embedding over the whole head"))
    spec.set("rope_neox_style", True, Source("default", "rotate_half (NeoX style) rotary embedding"))
