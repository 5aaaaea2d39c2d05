"""The eps of latent attention's own norms (the low-rank query's and the joint latent's), and the switch of its
projections' bias, read from the code.

DeepSeek-V3's attention builds `q_a_layernorm = RMSNorm(q_lora_rank)` and `kv_a_layernorm = RMSNorm(kv_lora_rank)`
without an eps: the norm class's default (1e-6 in every DeepSeek-derived file), not config.rms_norm_eps, which
the decoder layer's norms take. The two agree in DeepSeek's configs (rms_norm_eps 1e-6); GLM-5's (glm_moe_dsa)
says 1e-5, so a port building the latent norms with config.rms_norm_eps normalizes them otherwise than the code.

For each latent norm the attention's constructor builds, the eps is what the call hands it (`eps=` or the second
argument: a config key, read by the port at run time, or a number), else the default of the norm class's own
__init__ parameter (`eps: float = 1e-6`). Where both give the port's norm_eps (its key, or its value on this
checkpoint) nothing is set; where both give one other value it is `latent_norm_eps`; two different ones, or an eps the reader cannot follow (an expression,
a class of the library with no default written), are refused naming the line.

The latent projections' bias: the layout ports latent attention without one and refuses a checkpoint holding a
bias tensor there (GLM-5's attention_bias true). The attention's constructor may build them with
`bias=config.KEY`: where config.json sets KEY true the code builds biases the checkpoint does not hold, refused;
false (or absent: the config class's default) is what the port computes, and qkv_bias's provenance names KEY.
"""

from __future__ import annotations

import ast

from scaffold.checkpoint import Checkpoint
from scaffold.detect import codekeys
from scaffold.detect.common import unsupported
from scaffold.detect.sourcecode import _classes, _dotted, modeling_sources
from scaffold.spec import Source, Spec

EPS_NAMES = ("eps", "epsilon", "variance_epsilon", "norm_eps")


def _number(node: ast.AST | None) -> float | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _number(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    return None


def _config_key(node: ast.AST | None, names: tuple[str, ...] = ("config",)) -> str | None:
    """KEY of `config.KEY` or `self.config.KEY` (`names`: the config as the constructor calls it)."""
    if isinstance(node, ast.Attribute) and _dotted(node.value) in (*names, "self.config"):
        return node.attr
    return None


def _config_names(cls: ast.ClassDef) -> tuple[str, ...]:
    """What the class's __init__ calls the config: its first parameter after self (a lab's `cfg`), and config."""
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    first = init.args.args[1].arg if init is not None and len(init.args.args) > 1 else "config"
    return tuple(dict.fromkeys((first, "config")))


def _class_default(sources: dict[str, str], name: str) -> tuple[float | None, str]:
    """The default of the eps parameter of class `name`'s __init__ (the one named for it, else its second
    parameter after self), with file:line; None where the class is not in the sources or writes no number."""
    found = _classes(sources).get(name)
    if found is None:
        return None, ""
    file, cls = found
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None:
        return None, ""
    params = init.args.args[1:]
    defaults = dict(zip([a.arg for a in params[len(params) - len(init.args.defaults):]], init.args.defaults))
    defaults.update({a.arg: d for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults) if d is not None})
    param = next((p.arg for p in params + init.args.kwonlyargs if p.arg in EPS_NAMES),
                 params[1].arg if len(params) > 1 else None)
    return _number(defaults.get(param)), f"{file}:{init.lineno}"


def _eps(sources: dict[str, str], file: str, call: ast.Call, config: tuple[str, ...]) -> tuple[float | str | None, str]:
    """The eps `call` builds its norm with: a number, "config.KEY", or None where the reader cannot tell; with
    the evidence."""
    given = next((k.value for k in call.keywords if k.arg in EPS_NAMES), call.args[1] if len(call.args) > 1 else None)
    where = f"{file}:{call.lineno}: {ast.unparse(call)[:80]}"
    if given is not None:
        if (key := _config_key(given, config)) is not None:
            return f"config.{key}", where
        return _number(given), where
    cls = _dotted(call.func).rsplit(".", 1)[-1]
    value, at = _class_default(sources, cls)
    return value, f"{where}, the default eps of {cls} ({at})"


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    """Set latent_norm_eps where the latent norms take another eps than the port's norm_eps (module
    docstring)."""
    if spec.qkv_layout != "latent":
        return
    roles = [r for r in ("q_a_norm", "kv_a_norm") if spec.names.get(r)]
    sources = modeling_sources(ckpt)
    # The attention class: the one whose constructor builds the joint latent's norm (and the query's, if any).
    builds: dict[str, dict[str, tuple[str, ast.Call]]] = {}
    classes: dict[str, ast.ClassDef] = {}
    for file, cls, _func, attr, value in codekeys.self_assignments(sources):
        classes[cls.name] = cls
        if isinstance(value, ast.IfExp) and isinstance(value.orelse, ast.Constant) and value.orelse.value is None:
            value = value.body  # `Norm(q_lora_rank) if self.q_lora_rank is not None else None`
        if isinstance(value, ast.Call) and attr in {spec.names[r] for r in roles}:
            builds.setdefault(cls.name, {})[attr] = (file, value)
    owners = [c for c, built in builds.items() if set(built) == {spec.names[r] for r in roles}]
    if len(owners) != 1:
        return  # no one class builds them: the port's norm_eps, as before
    _bias_switch(ckpt, spec, sources, owners[0])
    config = _config_names(classes[owners[0]])
    found = {attr: _eps(sources, file, call, config) for attr, (file, call) in builds[owners[0]].items()}
    values = {v for v, _ in found.values()}
    evidence = "; ".join(w for _, w in found.values())
    if None in values:
        unknown = next(w for v, w in found.values() if v is None)
        raise unsupported(f"a latent attention norm whose eps the reader does not follow ({unknown}): the port "
                          "builds it with one it can name", ckpt.config_file, spec.model_type)
    if len(values) != 1:
        raise unsupported(f"latent attention norms built with different eps ({evidence}): the port builds both "
                          "with one", ckpt.config_file, spec.model_type)
    value = values.pop()
    # The same eps as the port's other norms on this checkpoint: nothing to set (DeepSeek's class default 1e-6 and
    # config.rms_norm_eps 1e-6).
    if value == spec.source("norm_eps").expr or value == spec.norm_eps:
        return
    if isinstance(value, str):
        key = value.split(".", 1)[1]
        if key not in ckpt.config or isinstance(ckpt.config[key], bool) or not isinstance(ckpt.config[key],
                                                                                           (int, float)):
            raise unsupported(f"a latent attention norm built with eps={value} ({evidence}), which config.json does "
                              "not give as a number", ckpt.config_file, spec.model_type)
        spec.set("latent_norm_eps", float(ckpt.config[key]),
                 Source("config", f"config.json {key} ({evidence})", value))
        return
    spec.set("latent_norm_eps", value, Source("code", f"{evidence}: eps={value:g}, not the other norms' "
                                                              f"{spec.norm_eps:g}"))


def _bias_switch(ckpt: Checkpoint, spec: Spec, sources: dict[str, str], attention: str) -> None:
    """The config keys the attention's linear layers read as bias= (module docstring)."""
    found = _classes(sources).get(attention)
    if found is None:
        return
    file, cls = found
    config = _config_names(cls)
    keys: dict[str, str] = {}
    for node in ast.walk(cls):
        if isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] == "Linear":
            bias = next((k.value for k in node.keywords if k.arg == "bias"), None)
            if (key := _config_key(bias, config)) is not None:
                keys.setdefault(key, f"{file}:{node.lineno}")
    if not keys or spec.qkv_bias or spec.o_bias:
        return
    for key, where in keys.items():
        value = ckpt.config.get(key, False)
        if value is not False and value is not None:
            raise unsupported(f"latent attention projections built with bias=config.{key} ({where}), {value!r} in "
                              "config.json, where the checkpoint holds no bias for them", ckpt.config_file,
                              spec.model_type)
    named = ", ".join(f"bias=config.{k} ({w})" for k, w in keys.items())
    spec.set("qkv_bias", False, Source("code", f"{spec.source('qkv_bias').detail}; the code's {named} is false "
                                               "in config.json"))
