"""Norms: epsilon and the weight convention."""

from __future__ import annotations

from scaffold.checkpoint import Checkpoint
from scaffold.detect.common import set_from_config
from scaffold.spec import Source, Spec


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    keys = ("rms_norm_eps", "layer_norm_eps", "norm_eps", "layer_norm_epsilon")
    set_from_config(spec, ckpt, "norm_eps", keys, (int, float), default=1e-6 if spec.norm_kind == "rms" else 1e-5)
    spec.norm_eps = float(spec.norm_eps)
    spec.set("norm_offset", 0.0, Source("default", "norm output is x_normed * weight"))
    spec.set("block", "pre_norm", Source("tensor", "input_layernorm and post_attention_layernorm before each sublayer"))
