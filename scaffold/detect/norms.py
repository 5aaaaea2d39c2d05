"""Norms: epsilon. (The norm kind, offset and block come from the layout.)"""

from __future__ import annotations

from scaffold.checkpoint import Checkpoint
from scaffold.detect import codekeys
from scaffold.detect.common import set_from_config
from scaffold.spec import Spec

KEYS = ("rms_norm_eps", "layer_norm_eps", "norm_eps", "layer_norm_epsilon", "norm_epsilon")


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    # The key the code passes as eps= (chatglm's layernorm_epsilon) first, then the known names.
    read = [f.keys[0] for f in codekeys.keyword_reads(codekeys.code_sources(ckpt), "eps")
            if len(f.keys) == 1 and f.expr == f"config.{f.keys[0]}"]
    keys = tuple(dict.fromkeys(k for k in read if k in ckpt.config)) if len(set(read)) == 1 else ()
    keys = tuple(dict.fromkeys(keys + KEYS))
    set_from_config(spec, ckpt, "norm_eps", keys, (int, float), default=1e-6 if spec.norm_kind == "rms" else 1e-5)
    spec.norm_eps = float(spec.norm_eps)
