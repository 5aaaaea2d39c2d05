"""Norms: epsilon. (The norm kind, offset and block come from the layout.)"""

from __future__ import annotations

from scaffold.checkpoint import Checkpoint
from scaffold.detect.common import set_from_config
from scaffold.spec import Spec


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    keys = ("rms_norm_eps", "layer_norm_eps", "norm_eps", "layer_norm_epsilon", "norm_epsilon")
    set_from_config(spec, ckpt, "norm_eps", keys, (int, float), default=1e-6 if spec.norm_kind == "rms" else 1e-5)
    spec.norm_eps = float(spec.norm_eps)
