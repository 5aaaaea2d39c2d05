"""Norms: epsilon. (The norm kind, offset and block come from the layout.)"""

from __future__ import annotations

import ast

from scaffold.checkpoint import Checkpoint
from scaffold.detect import codekeys, dataflow, latentnorm
from scaffold.detect.common import set_from_config, unsupported
from scaffold.detect.sourcecode import _classes, modeling_sources, module_class, subtree
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
    elif (built := _built_eps(ckpt, spec)) is not None:
        # The decoder layer builds its norms with an eps written as a number (CTRL's nn.LayerNorm(n_embd,
        # eps=1e-6)), whatever config.json says; the port builds every norm with the one norm_eps.
        value, where = built
        if value != spec.norm_eps:
            raise unsupported(f"the decoder layer's norms use eps={value} written in the code ({where}), the other "
                              f"norms {spec.norm_eps} ({spec.source('norm_eps').detail}): the port builds every "
                              "norm with one eps", ckpt.config_file, spec.model_type)
        spec.set("norm_eps", value, Source("code", f"{where}: the layer's norms are built with eps={value}, as "
                                                   f"{spec.source('norm_eps').detail} gives the others"))
    latentnorm.detect(ckpt, spec)


def _built_eps(ckpt: Checkpoint, spec: Spec) -> tuple[float, str] | None:
    """The eps the decoder layer's norms are built with where the constructor writes it as a number:
    `self.<attn_norm> = nn.LayerNorm(..., eps=1e-6)`; None where it hands a config value or nothing."""
    names = [spec.names.get(r) for r in ("attn_norm", "mlp_norm", "attn_post_norm", "mlp_post_norm")]
    sources = modeling_sources(ckpt)
    layers = spec.names.get("layers")
    layer = dataflow.layer_class(sources, layers.rsplit(".", 1)[-1] if layers else None)
    if layer is None:
        return None
    found = set()
    for file, cls, _func, attr, value in codekeys.self_assignments(sources):
        if cls.name != layer[1].name or attr not in names or not isinstance(value, ast.Call):
            continue
        for kw in value.keywords:
            if (kw.arg in ("eps", "epsilon") and isinstance(kw.value, ast.Constant)
                    and isinstance(kw.value.value, (int, float)) and not isinstance(kw.value.value, bool)):
                found.add((float(kw.value.value), f"{file}:{value.lineno}"))
    return min(found) if len({v for v, _ in found}) == 1 else None


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
