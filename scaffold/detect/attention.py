"""Attention: head shapes checked against the tensors, and sliding-window layers."""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

from scaffold.checkpoint import Checkpoint
from scaffold.detect import chunks, conditions, dataflow, headsizes, kvshare, window
from scaffold.detect.common import config_value, stored_shape, unsupported
from scaffold.detect.sourcecode import modeling_sources
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.spec import Source, Spec, attention_module


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    where = ckpt.config_file
    n = spec.names
    _head_sizes(ckpt, spec)
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    # The rows the query projection has: twice q where it also holds the output gate per head (Qwen3-Next's).
    q_rows = spec.query_rows
    if spec.qkv_layout == "latent":
        # scaffold.detect.latent checked layer 0's projections; the policy check holds every layer to layer 0's shapes.
        expected = {}
    elif spec.qkv_layout == "routed":
        _routed_shapes(ckpt, spec)
        expected = {}
    elif spec.qkv_layout == "separate":
        expected = {"q_proj": q_rows, "k_proj": kv, "v_proj": spec.num_kv_heads * spec.value_dim}
    elif spec.qkv_layout == "kv_pairs":  # the queries' tensor, and one of keys and values
        expected = {"q_proj": q, "kv_proj": 2 * kv}
    else:  # fused or interleaved: one tensor
        expected = {"qkv_proj": q + 2 * kv}
    if expected:
        expected["o_proj"] = spec.hidden_size
    for layer in range(spec.num_layers):
        if spec.layer_num_heads and spec.qkv_layout == "separate":  # each layer's own query heads
            q = q_rows = spec.heads_of(layer) * spec.head_dim
            expected["q_proj"] = q_rows
        if spec.qkv_layout == "fused" and (spec.layer_num_heads or spec.layer_num_kv_heads):
            # OpenELM's one qkv_proj per layer, of that layer's own query and KV heads.
            q = spec.heads_of(layer) * spec.head_dim
            expected["qkv_proj"] = q + 2 * spec.kv_heads_of(layer) * spec.head_dim
        if spec.qkv_layout == "separate":  # each layer's own head width and KV heads; values of their own width
            if spec.layer_head_dim:  # per_layer_config
                q = q_rows = spec.num_heads * spec.head_dim_of(layer)
                expected["q_proj"] = q_rows
            expected["k_proj"] = spec.kv_heads_of(layer) * spec.head_dim_of(layer)
            expected["v_proj"] = spec.kv_heads_of(layer) * spec.value_dim_of(layer)
        for role, rows in expected.items():
            if role in ("k_proj", "v_proj") and layer in spec.kv_share_layers or (
                    role == "v_proj" and layer in spec.k_eq_v_layers):
                continue  # keys and values of another layer, or the keys' projection as values: not built there
            # OLMo v1's att_proj, attn_out are the layer's own (spec.attn_on_layer): no attention module in the name.
            module = n[role] if spec.attn_on_layer else f"{attention_module(n)}.{n[role]}"
            name = f"{n['model']}.{n['layers']}.{layer}.{module}.weight"
            info = ckpt.tensors.get(name)
            if info is None:
                if layer and (left_out := _not_built(ckpt, spec, n[role], layer)):
                    raise unsupported(left_out, where, spec.model_type)
                raise CheckpointError(f"tensor {name} is missing.", where)
            o_cols = spec.heads_of(layer) * spec.value_dim_of(layer) if spec.qkv_layout == "separate" else q
            shape = stored_shape(spec, role, (rows, o_cols if role == "o_proj" else spec.hidden_size))
            if info.shape != shape:
                doubled = (role == "q_proj" and spec.attn_output_gate != "in_query"
                           and info.shape == stored_shape(spec, role, (2 * q, spec.hidden_size)))
                raise CheckpointError(
                    f"tensor {name} has shape {list(info.shape)}, but {spec.heads_of(layer)} query heads and "
                    f"{spec.kv_heads_of(layer)} KV heads of size {spec.head_dim_of(layer)}"
                    + (f" (values {spec.value_dim_of(layer)} wide)"
                       if spec.value_dim_of(layer) != spec.head_dim_of(layer) else "")
                    + f" over hidden size {spec.hidden_size} need {list(shape)}"
                    + (": twice the query rows, as where the query projection also emits an output gate per head "
                       "(Qwen3-Next's [query | gate] per head), a form the attention's code was not read as"
                       if doubled else "") + ".",
                    where,
                )
    _scale_and_softcap(ckpt, spec)
    if spec.qkv_layout != "latent" and any(spec.head_dim_of(i) % 2 for i in range(spec.num_layers)):
        raise UnsupportedArchitecture(f"head_dim {spec.head_dim} is odd; rotary embeddings need an even size.", where)
    _sliding_window(ckpt, spec)
    _chunks(ckpt, spec)


def _not_built(ckpt: Checkpoint, spec: Spec, proj: str, layer: int) -> str | None:
    """Why a projection layer 0 holds is absent in `layer`, where the code says so: the attention's __init__, run
    over numbers for each layer's index (kvshare.layer_self), builds it in layer 0 and not in `layer`. Hunyuan-Large's
    cross-layer attention (config use_cla, cla_share_factor 2) builds no k_proj/v_proj in its odd layers, which take
    the previous layer's projected keys and values through the model's loop; that is not a broken checkpoint but a
    form the port does not compute. None where the code does not say (the tensor is then missing)."""
    sources = modeling_sources(ckpt) if ckpt.sources else {}
    found = dataflow.layer_class(sources, spec.names["layers"].rsplit(".", 1)[-1]) if sources else None
    if found is None:
        return None
    init = next((f for f in found[1].body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    value = dataflow._init_assignments(init).get(spec.names["self_attn"]) if init is not None else None
    sub = dataflow._submodule_class(sources, conditions.selected(value, ckpt.config) or value) if value else None
    attn_init = next((f for f in sub[1].body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None) \
        if sub is not None else None
    if attn_init is None:
        return None
    functions = {f.name: f for _file, tree in dataflow._parsed(sources) for f in tree.body
                 if isinstance(f, ast.FunctionDef)}
    config = kvshare._Reads(ckpt.config)
    try:
        built = [isinstance(kvshare.layer_self(functions, attn_init, config, i)[0].attrs.get(proj), kvshare._Module)
                 for i in (0, layer)]
    except Exception:  # noqa: BLE001 - code the reader cannot run says nothing here
        return None
    if built != [True, False]:
        return None
    keys = [k for k in sorted(config.asked) if k in ckpt.config and _decides(functions, attn_init, ckpt.config, k,
                                                                            proj, layer)]
    return (f"layer {layer}'s attention builds no {proj}: {sub[1].name}.__init__ ({sub[0]}:{attn_init.lineno}) "
            f"builds it in layer 0 but not for layer_idx {layer}"
            + (f", as config.json {', '.join(f'{k} = {ckpt.config[k]!r}' for k in keys)} decide" if keys else "")
            + "; that layer takes its keys and values from elsewhere (another layer's, through the model's loop), "
              "a form the port does not compute")


def _decides(functions: dict, init: ast.FunctionDef, config: dict, key: str, proj: str, layer: int) -> bool:
    """Whether another value of config.json's `key` (a flag flipped, a count set to 1) builds `proj` in `layer`."""
    value = config[key]
    other = (not value) if isinstance(value, bool) else 1 if isinstance(value, int) and value != 1 else None
    if other is None:
        return False
    try:
        me = kvshare.layer_self(functions, init, kvshare._Reads({**config, key: other}), layer)[0]
    except Exception:  # noqa: BLE001 - code the reader cannot run says nothing here
        return False
    return isinstance(me.attrs.get(proj), kvshare._Module)


def _routed_shapes(ckpt: Checkpoint, spec: Spec) -> None:
    """Every layer's mixture of attention heads (qkv_layout "routed"): the experts' query and output banks, the
    router, the output bias and the shared keys' and values' projection, sized from the config."""
    n, kv, hidden, experts = spec.names, spec.num_kv_heads * spec.head_dim, spec.hidden_size, spec.moa_num_experts
    attn = attention_module(n)
    routed = f"{attn}.{n['moa']}"
    shapes = {f"{routed}.{n['moa_q_bank']}.weight": (experts, kv, hidden),
              f"{routed}.{n['moa_o_bank']}.weight": (experts, hidden, kv),
              f"{routed}.{n['moa_router']}.weight": (experts, hidden), f"{routed}.{n['moa_bias']}": (hidden,),
              f"{attn}.{n['qkv_proj']}.weight": (2 * kv, hidden)}
    for layer in range(spec.num_layers):
        for rest, shape in shapes.items():
            name = f"{n['model']}.{n['layers']}.{layer}.{rest}"
            info = ckpt.tensors.get(name)
            if info is None:
                raise CheckpointError(f"tensor {name} is missing.", ckpt.config_file)
            if tuple(info.shape) != shape:
                raise CheckpointError(f"tensor {name} has shape {list(info.shape)}, but {experts} attention experts "
                                      f"of {spec.num_kv_heads} KV heads of size {spec.head_dim} over hidden size "
                                      f"{hidden} need {list(shape)}.", ckpt.config_file)


def _head_sizes(ckpt: Checkpoint, spec: Spec) -> None:
    """KV heads of each layer's own, value heads of their own width, a scale on the values: what the attention's
    __init__ and forward compute (scaffold.detect.headsizes), with separate q, k, v projections. The port builds
    each layer's attention from the code's KV head expression (over config and layer_idx) and the value width's
    config key; a form the reader finds but cannot follow is refused by name."""
    sources = modeling_sources(ckpt)
    if spec.qkv_layout != "separate" or not sources or "layers" not in spec.names:
        return
    sizes = headsizes.read(sources, ckpt.config, spec.names["layers"].rsplit(".", 1)[-1], spec.num_layers)
    if sizes is None:
        return
    where = f"{sizes.cls} ({sizes.file}:{sizes.line})"
    if sizes.problems:
        raise unsupported(f"attention sizes the port does not build: {where} has {'; '.join(sizes.problems)}",
                          ckpt.config_file, spec.model_type)
    if sizes.kv_expr:
        if spec.attn_output_gate == "in_query":
            raise unsupported(f"KV heads of each layer's own ({sizes.kv_expr}) with an output gate folded into the "
                              "query projection", ckpt.config_file, spec.model_type)
        spec.set("layer_num_kv_heads", sizes.kv_heads,
                 Source("code", f"{sizes.file}:{sizes.kv_line}: each layer's attention has {sizes.kv_expr} KV heads",
                        sizes.kv_expr))
    if sizes.v_width:
        spec.set("v_head_dim", sizes.v_width,
                 Source("code", f"{sizes.file}:{sizes.v_line}: value heads {sizes.v_expr} wide, q and k heads "
                                f"head_dim {spec.head_dim}", sizes.v_expr if sizes.v_expr.startswith("config.")
                        and sizes.v_expr[7:].isidentifier() else None))
    if sizes.value_scale is not None:
        spec.set("attn_value_scale", sizes.value_scale,
                 Source("code", f"{sizes.file}:{sizes.value_scale_line}: the values multiplied by "
                                f"{sizes.value_scale_expr}",
                        sizes.value_scale_expr if "config." in sizes.value_scale_expr else None))


def _sliding_window(ckpt: Checkpoint, spec: Spec) -> None:
    where = ckpt.config_file
    key, window = config_value(ckpt, "sliding_window")
    enabled = ckpt.config.get("use_sliding_window", True) is not False
    found = _code_window(ckpt, spec) if key is None else None
    if found is not None:
        spec.set("sliding_window", found.size, Source("code", f"{found.evidence}: the last config.{found.key} "
                                                              "positions, the query's own included",
                                                      f"config.{found.key}"))
        spec.set("sliding_window_layers", found.layers, Source("code", f"{found.evidence}: the layers where "
                                                                       f"{found.expr}", found.expr))
        return
    if key is None or not enabled:
        spec.set("sliding_window", None, Source("config", "no sliding_window in config.json" if key is None
                                                 else "config.json use_sliding_window is false"))
        spec.set("sliding_window_layers", [], Source("config", "no sliding window"))
        return
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        raise CheckpointError(f"config key 'sliding_window' must be a positive integer, not {window!r}.", where)
    spec.set("sliding_window", window, Source("config", "config.json sliding_window", "config.sliding_window"))
    layer_types = ckpt.config.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != spec.num_layers:
            raise CheckpointError(f"config key 'layer_types' must list one type for each of {spec.num_layers} layers.",
                                  where)
        unknown = sorted({t for t in layer_types if t not in ("sliding_attention", "full_attention")})
        if unknown:
            raise UnsupportedArchitecture(f"layer type(s) {unknown} in 'layer_types' are not supported.", where)
        layers = [i for i, t in enumerate(layer_types) if t == "sliding_attention"]
        spec.set("sliding_window_layers", layers, Source("config", "config.json layer_types"))
    else:
        spec.set("sliding_window_layers", list(range(spec.num_layers)),
                 Source("config", "sliding_window without layer_types: every layer"))


def _code_window(ckpt: Checkpoint, spec: Spec):
    """The window the attention's code narrows its causal mask to (scaffold.detect.window), where config.json
    names none; None without such code."""
    sources = modeling_sources(ckpt)
    if not sources or "layers" not in spec.names:
        return None
    try:
        return window.code_window(sources, ckpt.config, spec.names["layers"].rsplit(".", 1)[-1], spec.num_layers,
                                  ckpt.config_file, spec.model_type)
    except RecursionError:
        return None


def _number(ckpt: Checkpoint, key: str):
    value = ckpt.config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise CheckpointError(f"config key {key!r} must be a positive number, not {value!r}.", ckpt.config_file)
    return float(value)


def _scale_and_softcap(ckpt: Checkpoint, spec: Spec) -> None:
    """The attention score scale (head_dim ** -0.5 unless the config says otherwise) and soft-capping."""
    if ckpt.config.get("scale_attn_by_inverse_layer_idx") is True:
        raise unsupported("attention scores scaled by 1 / (layer index + 1) (GPT-2's config.json "
                          "scale_attn_by_inverse_layer_idx)", ckpt.config_file, spec.model_type)
    if ckpt.config.get("scale_attn_weights") is False:
        # GPT-2 with scale_attn_weights false: scores are q . k, not divided by sqrt(head_dim).
        spec.set("attention_scale", 1.0, Source("config", "config.json scale_attn_weights = false: unscaled scores"))
    elif (scalar := _number(ckpt, "query_pre_attn_scalar")) is not None:
        spec.set("attention_scale", scalar**-0.5, Source("config", "config.json query_pre_attn_scalar ** -0.5",
                                                         "config.query_pre_attn_scalar**-0.5"))
    elif (mult := _number(ckpt, "attention_multiplier")) is not None:
        spec.set("attention_scale", mult, Source("config", "config.json attention_multiplier",
                                                 "config.attention_multiplier"))
    elif (constant := constant_scaling(modeling_sources(ckpt), spec.names.get("self_attn", "self_attn"))) is not None:
        spec.set("attention_scale", constant[0], Source("code", constant[1]))
    elif (found := code_scores(modeling_sources(ckpt), ckpt.config)) is not None and found.scale is not None:
        spec.set("attention_scale", found.scale[0], Source("code", found.scale[2], found.scale[1]))
    else:
        spec.set("attention_scale", None, Source("default", "head_dim ** -0.5"))
    if (cap := _number(ckpt, "attn_logit_softcapping")) is not None:
        spec.set("attn_logit_softcap", cap, Source("config", "config.json attn_logit_softcapping",
                                                   "config.attn_logit_softcapping"))
    elif (found := code_scores(modeling_sources(ckpt), ckpt.config)) is not None and found.cap is not None:
        spec.set("attn_logit_softcap", found.cap[0], Source("code", found.cap[2], found.cap[1]))
    else:
        spec.set("attn_logit_softcap", None, Source("default", "no attn_logit_softcapping in config.json"))


@dataclass(frozen=True)
class Scores:
    """What an attention that computes its scores itself does to them before the softmax: (value, the config
    expression the port reads, evidence) for a scale and a tanh soft-cap; None where it does not."""

    scale: tuple[float, str, str] | None
    cap: tuple[float, str, str] | None


def code_scores(sources: dict, config: dict) -> Scores | None:
    """Grok-1's scores: `s = matmul(q, k.transpose(...)); s = s * self.m; s = self.c * tanh(s / self.c); ...
    softmax(s)`: a scale m instead of head_dim ** -0.5 and a soft-cap c, each an attribute of the attention that its
    constructors follow to one config key (window.lift_to_layer). None where the forward computes its scores
    otherwise, or a step is not read: then the other readers (or the defaults) stand."""
    found = dataflow.attention_class(sources, config) if sources else None
    if found is None:
        return None
    flow, file, cls = found
    init = dataflow._method_of(cls, "__init__")
    forward = dataflow._method_of(cls, "forward")
    if forward is None:
        return None
    scores, scale, cap = None, None, None

    def attr(node) -> str | None:
        return node.attr if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "self" else None

    def lifted(name: str, line: int, what: str) -> tuple[float, str, str] | None:
        expr = window.lift_to_layer(sources, flow, None, init, ast.parse(f"self.{name}", mode="eval").body)
        text = ast.unparse(expr) if expr is not None else ""
        if not text.startswith("config.") or not text[len("config."):].isidentifier():
            return None
        value = config.get(text[len("config."):])
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            return None
        return float(value), text, f"{file}:{line}: {what} (self.{name} = {text})"

    for stmt in forward.body:
        if scores is not None and isinstance(stmt, ast.If) and any(
                isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == scores for t in n.targets)
                and not (isinstance(n.value, ast.BinOp) and isinstance(n.value.op, ast.Add)) for n in ast.walk(stmt)):
            return None  # a step on the scores under a condition, other than adding the mask: not read
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        target, value = stmt.targets[0].id, stmt.value
        if scores is None:
            calls = [n for n in ast.walk(value) if isinstance(n, ast.Call)]
            if any(dataflow._dotted(c.func).rsplit(".", 1)[-1] == "matmul" and len(c.args) == 2
                   and "transpose" in ast.unparse(c.args[1]) for c in calls):
                scores = target
            continue
        names = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
        if scores not in names:
            continue
        if target != scores:
            break  # the scores go on under another name: read no further
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult) and scale is None and cap is None:
            other = value.right if ast.unparse(value.left) == scores else value.left \
                if ast.unparse(value.right) == scores else None
            if (name := attr(other)) is None or (scale := lifted(name, stmt.lineno, "scores times "
                                                                  f"self.{name}")) is None:
                return None
            continue
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult) and cap is None:
            # c * tanh(s / c)
            factor, call = (value.left, value.right) if isinstance(value.right, ast.Call) else (value.right,
                                                                                               value.left)
            if not (isinstance(call, ast.Call) and dataflow._dotted(call.func).rsplit(".", 1)[-1] == "tanh"
                    and len(call.args) == 1 and isinstance(call.args[0], ast.BinOp)
                    and isinstance(call.args[0].op, ast.Div) and ast.unparse(call.args[0].left) == scores
                    and (name := attr(factor)) is not None and attr(call.args[0].right) == name):
                return None
            if (cap := lifted(name, stmt.lineno, f"scores capped at self.{name} * tanh(scores / self.{name})")) \
                    is None:
                return None
            continue
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
            continue  # the mask
        while (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
               and value.func.attr in ("to", "float", "type_as") and isinstance(value.func.value, ast.Call)):
            value = value.func.value  # softmax(...).to(dtype): the call inside the cast
        callee = dataflow._dotted(value.func).rsplit(".", 1)[-1] if isinstance(value, ast.Call) else ""
        if callee == "softmax":
            break  # the scores end here
        if callee in ("to", "float", "type_as") and isinstance(value.func, ast.Attribute) \
                and ast.unparse(value.func.value) == scores:
            continue  # a cast
        return None  # a step on the scores not read: the port would leave it out
    if scores is None or (scale is None and cap is None):
        return None
    return Scores(scale, cap)


def constant_scaling(sources: dict, attention: str) -> tuple[float, str] | None:
    """(value, evidence) where the decoder's attention hands its attention function a score scale that __init__ sets
    to a number (Gemma 4's `self.scaling = 1.0`, passed as `scaling=self.scaling`): the scale whatever head_dim is.
    None where the scale is not such a constant (Llama's `self.head_dim**-0.5`, a config key read above)."""
    found = dataflow.layer_class(sources) if sources else None
    if found is None:
        return None
    _file, layer, _ = found
    layer_init = next((f for f in layer.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    built = next((n.value for n in ast.walk(layer_init) if layer_init is not None and isinstance(n, ast.Assign)
                  and len(n.targets) == 1 and ast.unparse(n.targets[0]) == f"self.{attention.split('.')[-1]}"
                  and isinstance(n.value, ast.Call)), None)
    cls = dataflow._class(sources, ast.unparse(built.func).rsplit(".", 1)[-1]) if built is not None else None
    if cls is None:
        return None
    file, node = cls
    methods = {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
    if "__init__" not in methods or "forward" not in methods:
        return None
    assigned: dict[str, list[ast.expr]] = {}
    for n in ast.walk(methods["__init__"]):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Attribute) \
                and ast.unparse(n.targets[0].value) == "self":
            assigned.setdefault(n.targets[0].attr, []).append(n.value)
        if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Attribute) \
                and ast.unparse(n.target.value) == "self":
            assigned.setdefault(n.target.attr, []).append(n.value)  # GPT-2's `self.scaling /= ...`: not one value
    for call in (n for n in ast.walk(methods["forward"]) if isinstance(n, ast.Call)):
        for kw in call.keywords:
            if kw.arg not in ("scaling", "scale") or not isinstance(kw.value, ast.Attribute) \
                    or ast.unparse(kw.value.value) != "self":
                continue
            values = assigned.get(kw.value.attr, [])
            if len(values) == 1 and isinstance(values[0], ast.Constant) and isinstance(values[0].value, (int, float)) \
                    and not isinstance(values[0].value, bool) and values[0].value > 0:
                return float(values[0].value), (f"{file}:{values[0].lineno}: self.{kw.value.attr} = "
                                                f"{values[0].value!r}, the scale forward hands the attention "
                                                f"function (line {call.lineno}: {kw.arg}=self.{kw.value.attr})")
    return None


def _chunks(ckpt: Checkpoint, spec: Spec) -> None:
    """Chunked attention (Llama 4's), from where the code builds a chunked causal mask (scaffold.detect.chunks):
    the chunk's size from config.json, the layers from the code's layer type or every layer."""
    where = ckpt.config_file
    try:
        found = chunks.chunked_attention(modeling_sources(ckpt))
    except chunks.Refused as refused:
        raise unsupported(str(refused), where, spec.model_type) from None
    if found is None:
        spec.set("attention_chunk_size", None, Source("default", "no chunked causal mask in the code"))
        spec.set("chunked_layers", [], Source("default", "no chunked attention"))
        return
    if found.layer_type is None:
        layers, expr = list(range(spec.num_layers)), None
    else:
        types = ckpt.config.get("layer_types")
        if not isinstance(types, list) or len(types) != spec.num_layers:
            raise CheckpointError(f"config key 'layer_types' must list one type for each of {spec.num_layers} "
                                  f"layers ({found.evidence}).", where)
        layers = [i for i, t in enumerate(types) if t == found.layer_type]
        expr = f"config.layer_types[layer_idx] == {found.layer_type!r}"
    size = ckpt.config.get(found.key)
    if not layers:
        spec.set("attention_chunk_size", None, Source("code", f"{found.evidence}; no layer of that type"))
        spec.set("chunked_layers", [], Source("code", f"{found.evidence}; no layer of that type"))
        return
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise CheckpointError(f"config key {found.key!r} must be a positive integer, not {size!r} "
                              f"({found.evidence}).", where)
    if spec.qkv_layout == "latent" or set(layers) & spec.layers_with_window:
        raise unsupported(f"chunked attention ({found.evidence}) "
                          + ("with latent attention" if spec.qkv_layout == "latent" else "on sliding-window layers"),
                          where, spec.model_type)
    spec.set("attention_chunk_size", size, Source("code", f"{found.evidence}: config.json {found.key}",
                                                  f"config.{found.key}"))
    spec.set("chunked_layers", layers, Source("code", f"{found.evidence}: the layers where {expr or 'always'}",
                                              expr))
