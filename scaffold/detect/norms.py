"""Norms: epsilon. (The norm kind, offset and block come from the layout.)"""

from __future__ import annotations

import ast

from scaffold.checkpoint import Checkpoint
from scaffold.detect import codekeys
from scaffold.detect.common import set_from_config
from scaffold.detect.sourcecode import _classes, module_class, modeling_sources, subtree
from scaffold.spec import Source, Spec

KEYS = ("rms_norm_eps", "layer_norm_eps", "norm_eps", "layer_norm_epsilon", "norm_epsilon")


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    # The key the code passes as eps= (chatglm's layernorm_epsilon) first, then the known names.
    read = [f.keys[0] for f in codekeys.keyword_reads(codekeys.code_sources(ckpt), "eps")
            if len(f.keys) == 1 and f.expr == f"config.{f.keys[0]}"]
    keys = tuple(dict.fromkeys(k for k in read if k in ckpt.config)) if len(set(read)) == 1 else ()
    keys = tuple(dict.fromkeys(keys + KEYS))
    set_from_config(spec, ckpt, "norm_eps", keys, (int, float), default=1e-6 if spec.norm_kind == "rms" else 1e-5)
    spec.norm_eps = float(spec.norm_eps)
    if spec.source("norm_eps").kind == "default" and (written := _constant_eps(ckpt, spec)) is not None:
        value, where = written
        spec.set("norm_eps", value, Source("code", f"{where}: the norm's code passes eps={value}"))


def _constant_eps(ckpt: Checkpoint, spec: Spec) -> tuple[float, str] | None:
    """The eps the layer norm's class writes as a number in its own code (OLMo's F.layer_norm(..., eps=1e-5)),
    when config.json has none: the one constant eps= among the norm classes' calls."""
    sources = modeling_sources(ckpt)
    attr = spec.names.get("attn_norm") or spec.names.get("attn_post_norm")
    found = module_class(sources, attr, ckpt.config) if attr else None
    classes = _classes(sources)
    if found is None or found[0].rsplit(".", 1)[-1] not in classes:
        return None
    file, cls = classes[found[0].rsplit(".", 1)[-1]]
    constants = {(float(kw.value.value), f"{file}:{node.lineno}") for node in subtree(cls) if isinstance(node, ast.Call)
                 for kw in node.keywords if kw.arg == "eps" and isinstance(kw.value, ast.Constant)
                 and isinstance(kw.value.value, (int, float)) and not isinstance(kw.value.value, bool)}
    return next(iter(constants)) if len({v for v, _ in constants}) == 1 and len(constants) == 1 else None
