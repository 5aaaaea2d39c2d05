"""Model dimensions: each under the config key the modeling code reads, checked against tensor shapes.

Where the checkpoint ships its modeling source, the code says which config attribute holds each size
(codekeys): `range(config.num_layers)` builds the layer list, `nn.Embedding(config.padded_vocab_size, ...)`
the embedding, the MLP's down projection takes `config.intermediate_size // 2` features. The generated model
evaluates that same expression at run time, so it serves sibling checkpoints. Without source, or where the
code does not say, the key names transformers' configs use are hints, looked up through the config class's
attribute_map first (GPT-2 keeps hidden_size as n_embd).
"""

from __future__ import annotations

import ast
import re

from scaffold.checkpoint import Checkpoint, _short_list
from scaffold.detect import (
    codekeys,
    configreads,
    dataflow,
    layerheads,
    layerwidths,
    policy,
    positions,
    purefuncs,
    recurrence,
    subconfigs,
)
from scaffold.detect.common import config_value, set_from_config
from scaffold.detect.linears import linear_classes
from scaffold.detect.sourcecode import _parsed, modeling_sources, subtree
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.spec import Source, Spec, Undetermined

# Config keys each size goes by in the checkpoints the generator knows (first present wins).
HINTS = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_heads": ("num_attention_heads", "n_head"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "max_position": ("max_position_embeddings", "n_positions", "seq_length"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "head_dim": ("head_dim",),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"),
}
# Keys that are hints only where the code reads them (kv_channels is a head size in qwen and chatglm, but
# another config could use the name for something else).
CODE_HINTS = {"num_kv_heads": ("multi_query_group_num",), "head_dim": ("kv_channels",)}
# Sizes whose hinted keys count only where the modeling code reads them (see detect.keys).
UNREAD_HINTS_IGNORED = ("num_kv_heads", "intermediate_size")
# The name transformers' PretrainedConfig gives each size, which a config class's attribute_map redirects.
STANDARD = {"hidden_size": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
            "vocab_size": "vocab_size", "max_position": "max_position_embeddings",
            "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim", "intermediate_size": "intermediate_size"}


# Name components that say a key is a context length, when no code reads one (`max_seq_len`, `ctx_len`,
# `max_ctx`, `context_length`); `max` with a length word counts too (`max_len`).
CONTEXT_WORDS = {"ctx", "context", "seq", "sequence", "positions"}
LENGTH_WORDS = {"len", "length", "position"}


def _context_key(config: dict) -> str | None:
    """The one positive integer key of config.json whose name says it is the context length, else None: a key
    naming the context (`max_context_length`) before one saying a maximum length only (OpenELM's rope_max_length,
    the rotary table's)."""
    context, length = [], []
    for key, value in config.items():
        words = set(key.lower().split("_"))
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or "original" in words:
            continue
        if words & CONTEXT_WORDS:
            context.append(key)
        elif "max" in words and words & LENGTH_WORDS:
            length.append(key)
    found = context or length
    return found[0] if len(found) == 1 else None


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    where = ckpt.config_file
    sources = codekeys.code_sources(ckpt)
    aliases = codekeys.attribute_map(ckpt)
    reads = codekeys.config_reads(sources)
    # Every key transformers' own modeling file for this model type reads, under its stored name too (empty
    # for a checkpoint with its own code: that code's reads are `reads`, and the code decides its sizes).
    read_anywhere = set(configreads.config_reads(modeling_sources(ckpt))) if not ckpt.sources else set()
    read_anywhere |= {aliases[k] for k in list(read_anywhere) if k in aliases}
    from_code = _code_sizes(ckpt, sources, aliases)

    def keys(field: str) -> tuple[str, ...]:
        hints = HINTS[field] + tuple(k for k in CODE_HINTS.get(field, ()) if k in reads)
        if field in UNREAD_HINTS_IGNORED and read_anywhere:
            # A config may carry a key its model never reads (GPT-2's config.json with an intermediate_size
            # beside n_inner): only the keys transformers' modeling file reads size the model.
            hints = tuple(k for k in hints if k in read_anywhere)
        read = tuple(k for k in hints if k in reads)
        mapped = aliases.get(STANDARD[field])
        return tuple(dict.fromkeys(((mapped,) if mapped else ()) + read + hints))

    def size(field: str, found: tuple[codekeys.CodeExpr, int] | None = None, **kwargs) -> None:
        chosen = keys(field)
        found = found or from_code.get(field)
        hinted = config_value(ckpt, *chosen)[0]
        if found is not None and found[0].expr != f"config.{hinted}":
            # The code reads another key than the hints would pick: the code decides.
            spec.set(field, found[1], Source("code", f"{found[0]}: {found[0].expr}", found[0].expr))
            return
        set_from_config(spec, ckpt, field, chosen, int, **kwargs)
        key = config_value(ckpt, *chosen)[0]
        if key is not None and key == aliases.get(STANDARD[field]) and key != STANDARD[field]:
            spec.set(field, getattr(spec, field),
                     Source("config", f"config.json {key} (attribute_map: {STANDARD[field]})", f"config.{key}"))

    spec.set("code_helpers", [], Source("default", "the port evaluates no function of the code"))
    size("hidden_size")
    if spec.recurrent_stacks and (stacked := recurrence.layer_count(modeling_sources(ckpt), ckpt.config)):
        # Stacks run in cycles: each stack's list is as long as this key (HRM's num_layers_per_stack; its
        # num_hidden_layers counts the attention calls of a forward).
        key, file, line = stacked
        if isinstance(ckpt.config.get(key), int):
            from_code["num_layers"] = (codekeys.CodeExpr(f"config.{key}", (key,), file, line), ckpt.config[key])
    size("num_layers")
    # Heads each layer's attention reads for itself from a list in config.json (OpenELM's): layer 0's are the
    # model's, each layer's its own (set below).
    own_heads = (layerheads.read(sources or modeling_sources(ckpt), ckpt.config, spec.source("hidden_size").expr,
                                 spec.num_layers) if spec.num_layers > 0 else None)
    if own_heads is not None:
        file, line = own_heads.where.rsplit(":", 1)
        from_code["num_heads"] = (codekeys.CodeExpr(f"config.{own_heads.query_key}[0]", (own_heads.query_key,),
                                                    file, int(line)), own_heads.query[0])
    size("num_heads", _divisor(sources, ckpt.config, spec.source("hidden_size").expr)
         if own_heads is None else None)  # head_dim = hidden // H
    size("vocab_size")
    size("max_position", from_code.get("max_position"), default=2048)
    if spec.source("max_position").kind == "default" and (named := _context_key(ckpt.config)):
        spec.set("max_position", ckpt.config[named],
                 Source("config", f"config.json {named} (the one integer key whose name says context length; "
                                  "no code reads a maximum position)", f"config.{named}"))
    if unknown := [spec.unknowns[n] for n in ("hidden_size", "num_layers", "num_heads", "vocab_size")
                   if n in spec.unknowns]:
        raise Undetermined(*unknown)  # the checks and the derived sizes below need them
    if own_heads is not None and own_heads.kv_key:
        spec.set("num_kv_heads", own_heads.kv[0],
                 Source("code", f"{own_heads.where}: the attention's KV heads are config.{own_heads.kv_key}"
                                "[layer_idx] (layer 0's)", f"config.{own_heads.kv_key}[0]"))
    else:
        _kv_heads(ckpt, spec, tuple(dict.fromkeys(keys("num_kv_heads") + _kv_keys(
            sources, spec.source("num_heads").expr, ckpt.config, modeling_sources(ckpt)))), reads)
    layer_sizes = policy.per_layer_config_sizes(ckpt)
    if layer_sizes is not None and spec.source("num_kv_heads").kind == "default":
        # The attention reads its KV heads as config.per_layer_config[layer_idx].num_key_value_heads (Gemma 4
        # Unified's): config.json's num_key_value_heads where a layer does not override it.
        set_from_config(spec, ckpt, "num_kv_heads", ("num_key_value_heads",), int)
    for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "vocab_size"):
        if getattr(spec, name) <= 0:
            raise CheckpointError(f"{spec.source(name).detail} must be positive, not {getattr(spec, name)}.", where)
    if spec.num_heads % spec.num_kv_heads:
        raise CheckpointError(
            f"{spec.num_heads} attention heads cannot be shared by {spec.num_kv_heads} KV heads: "
            "the head counts do not divide.",
            where,
        )
    key, _ = config_value(ckpt, *keys("head_dim"))
    if key is not None:
        size("head_dim")
    else:
        if spec.hidden_size % spec.num_heads:
            raise CheckpointError(
                f"hidden size {spec.hidden_size} is not a multiple of {spec.num_heads} heads and there is no head_dim.",
                where,
            )
        hk, nk = spec.source("hidden_size").expr, spec.source("num_heads").expr
        spec.set("head_dim", spec.hidden_size // spec.num_heads,
                 Source("derived", "hidden_size // num_heads", f"{hk} // {nk}" if hk and nk else None))
    _layer_sizes(spec, layer_sizes)
    if own_heads is not None:
        _own_heads(spec, own_heads)
    if _layer_mlp_widths(ckpt, spec, sources or modeling_sources(ckpt), keys("intermediate_size")):
        return
    found = (_mlp_width(sources, spec, ckpt.config, aliases)
             or _layer_mlp_width(sources or modeling_sources(ckpt), ckpt.config, aliases))
    key, _ = config_value(ckpt, *keys("intermediate_size"))
    if found is None and key is None and not sources:
        # transformers' own file, where no key it reads under a standard name gives the width: the width its MLP
        # is built with, where that is an expression over the config (GPT-NeoX-Japanese's
        # int(config.hidden_size * config.intermediate_multiple_size)), else what a builder function is handed
        # (CTRL's point_wise_feed_forward_network(config.n_embd, config.dff)).
        library = modeling_sources(ckpt)
        found = _mlp_width(library, spec, ckpt.config, aliases)
        if found is None and (hidden := spec.source("hidden_size").expr):
            heads = set(re.findall(r"config\.(\w+)", spec.source("num_heads").expr or ""))
            found = _valued(_unique(_built_widths(library, hidden, heads, False)), ckpt.config, aliases)
    if found is not None or key is not None:
        size("intermediate_size", found)
    else:
        hk = spec.source("hidden_size").expr
        spec.set("intermediate_size", 4 * spec.hidden_size,
                 Source("default", "no intermediate_size: 4 * hidden_size", f"4 * {hk}" if hk else None))
    _layer_dependent_widths(ckpt, spec, frozenset({own_heads.attr}) if own_heads is not None else frozenset())


def _own_heads(spec: Spec, heads: layerheads.LayerHeads) -> None:
    """Each layer's query and KV heads, where the attention reads them per layer (layerheads): the port reads the
    same keys per layer at run time, so it serves every checkpoint of the architecture, whatever its counts."""
    said = f"{heads.where}: each layer's attention ({heads.attr}) reads"
    spec.set("layer_num_heads", list(heads.query),
             Source("code", f"{said} config.{heads.query_key}[layer_idx] query heads", f"config.{heads.query_key}"))
    if heads.kv_key:
        spec.set("layer_num_kv_heads", list(heads.kv),
                 Source("code", f"{said} config.{heads.kv_key}[layer_idx] KV heads",
                        f"config.{heads.kv_key}[layer_idx]"))
    for layer, (q, kv) in enumerate(zip(spec.layer_num_heads, spec.layer_num_kv_heads or [spec.num_kv_heads] *
                                        spec.num_layers)):
        if q % kv:
            raise CheckpointError(f"layer {layer}'s {q} query heads (config.{heads.query_key}) cannot share {kv} KV "
                                  "heads.", heads.where)


def _layer_dependent_widths(ckpt: Checkpoint, spec: Spec, attention: frozenset[str] = frozenset()) -> None:
    """Each layer's MLP width where config.json holds one width and the MLP's __init__ computes its own from it and
    the layer's index (Gemma 4's double-wide MLP in its KV-shared layers): the expression followed from the down
    projection's input to the config and the layer's index (layerwidths.layer_dependent_widths), evaluated on
    config.json per layer (spec layer_intermediate_sizes; the port evaluates the expression on the config it
    serves). Two modules computing different widths so are refused by name."""
    width_expr = spec.source("intermediate_size").expr or ""
    key = width_expr[len("config."):] if re.fullmatch(r"config\.\w+", width_expr) else None
    found = layerwidths.layer_dependent_widths(modeling_sources(ckpt), spec.source("hidden_size").expr, key,
                                               ckpt.config, spec.num_layers, attention)
    if not found:
        return
    if len({(expr, tuple(values)) for _attr, expr, values, _where in found}) > 1:
        raise UnsupportedArchitecture(
            "per-layer sizes: modules computing widths of their own from the layer's index: "
            + "; ".join(f"{attr} ({where}: {expr})" for attr, expr, _values, where in found), ckpt.config_file)
    _attr, expr, values, where = found[0]
    helpers = purefuncs.called(ast.parse(expr, mode="eval").body, modeling_sources(ckpt))
    if helpers:  # the code's own arithmetic, carried by the port as written (OpenELM's make_divisible)
        spec.set("code_helpers", [text for _at, text in helpers],
                 Source("code", f"{where}: the MLP's width calls "
                                + ", ".join(f"{text.split('(')[0].removeprefix('def ')} ({at})" for at, text in helpers)))
    if key is None or f"config.{key}" not in expr:  # no width key the MLP reads (OpenELM's): layer 0's is the model's
        spec.set("intermediate_size", values[0], Source("code", f"{where}: the MLP's down projection takes {expr} "
                                                                "features (layer 0's)"))
    spec.set("layer_intermediate_sizes", list(values),
             Source("code", f"{where}: the MLP's down projection takes {expr} features", expr))


def _layer_mlp_widths(ckpt: Checkpoint, spec: Spec, sources: dict, keys: tuple[str, ...]) -> bool:
    """Each layer's MLP width where config.json holds the width key as one value per layer (Gemma-3n's
    intermediate_size): ported where the MLP's down projection takes config.K[i] features in layer i, the expression
    followed from the MLP's __init__ through the decoder layer's constructor call to the layer list's index; the
    port evaluates it per layer (spec layer_intermediate_sizes). Refused otherwise. False where the key holds one
    value."""
    key = next((k for k in keys if isinstance(ckpt.config.get(k), list)), None)
    spec.set("layer_intermediate_sizes", [], Source("default", "every layer's MLP is intermediate_size wide"))
    if key is None:
        return False
    values = ckpt.config[key]
    found = [(k, at) for _attr, k, at in layerwidths.per_layer_widths(sources, spec.source("hidden_size").expr)
             if k == key]
    if not found or len(values) != spec.num_layers:
        raise UnsupportedArchitecture(
            f"per-layer sizes: config key {key!r} holds one value per layer ({_short_list(values)}), "
            + (f"but {spec.num_layers} layers" if found else "where the port builds every layer from one value")
            + (f" (the code reads config.{key}[layer_idx] at {found[0][1]})" if found else
               " (the reader finds no MLP built from config." + key + "[layer_idx])"), ckpt.config_file)
    where = found[0][1]
    spec.set("intermediate_size", values[0],
             Source("code", f"{where}: config.{key}[layer_idx] (layer 0's)", f"config.{key}[0]"))
    spec.set("layer_intermediate_sizes", list(values),
             Source("code", f"{where}: the MLP's down projection takes config.{key}[layer_idx] features",
                    f"config.{key}[layer_idx]"))
    return True


def _valued(found: codekeys.CodeExpr | None, config: dict, aliases: dict) -> tuple[codekeys.CodeExpr, int] | None:
    if found is None:
        return None
    value = codekeys.evaluate(found.expr, config, aliases)
    return (found, value) if value is not None else None


def _unique(found: list[codekeys.CodeExpr]) -> codekeys.CodeExpr | None:
    """The one expression the code uses, else None (two different ones: the code does not say which)."""
    exprs = {f.expr for f in found}
    return found[0] if len(exprs) == 1 else None


def _code_sizes(ckpt: Checkpoint, sources: dict, aliases: dict) -> dict[str, tuple[codekeys.CodeExpr, int]]:
    """Sizes the code computes from config: the layer count, the embedding's rows and width."""
    out = {}
    if not sources:
        return out
    counts = [layers.count for layers in codekeys.layer_lists(sources) if layers.count is not None]
    if (found := _valued(_unique(counts), ckpt.config, aliases)) is not None:
        out["num_layers"] = found
    # The embedding: an nn.Embedding whose module the checkpoint stores (PrefixEncoder-style extras are not).
    stored = {name.rsplit(".", 2)[-2] for name, info in ckpt.tensors.items()
              if name.endswith(".weight") and len(info.shape) == 2 and name.count(".") >= 1}
    # A learned position table (GPT-2's wpe) is an embedding too: its rows are the context length, not the vocab.
    learned = positions.learned_positions(sources)
    tables = {learned.positions} if learned is not None else set()
    for field, index, keyword in (("vocab_size", 0, "num_embeddings"), ("hidden_size", 1, "embedding_dim")):
        found = [e for attr, e in codekeys.call_arg(sources, ("Embedding",), None, index, keyword)
                 if attr in stored and attr not in tables]
        if (got := _valued(_unique(found), ckpt.config, aliases)) is not None:
            out[field] = got
    if learned is not None and not learned.offset:
        found = [e for attr, e in codekeys.call_arg(sources, ("Embedding",), learned.positions, 0, "num_embeddings")]
        if (got := _valued(_unique(found), ckpt.config, aliases)) is not None:
            out["max_position"] = got
    return out


def _config_key(node: ast.AST) -> str | None:
    """`K` of `config.K` / `self.config.K`."""
    if isinstance(node, ast.Attribute) and codekeys._is_config(node.value):
        return node.attr
    return None


def _layer_sizes(spec: Spec, found: policy.LayerSizes | None) -> None:
    """Each layer's head width and KV heads where the attention reads them from per_layer_config and they differ
    between layers (Gemma 4's full-attention layers: global_head_dim); the port reads them the same way."""
    if found is None or (len(set(found.head_dim)) == 1 and len(set(found.num_kv_heads)) == 1):
        spec.set("layer_head_dim", [], Source("default", "every layer's heads are head_dim wide"))
        spec.set("layer_num_kv_heads", [], Source("default", "every layer has num_kv_heads KV heads"))
        return
    spec.set("layer_head_dim", list(found.head_dim),
             Source("code", f"{found.evidence}: per_layer_config's head_dim of each layer, else head_dim",
                    "config.per_layer_config[layer_idx].head_dim"))
    spec.set("layer_num_kv_heads", list(found.num_kv_heads),
             Source("code", f"{found.evidence}: per_layer_config's num_key_value_heads of each layer, else "
                            "num_key_value_heads", "config.per_layer_config[layer_idx].num_key_value_heads"))


def _divisions(sources: dict, numerator: str | None):
    """(key, file, line) of each `config.<numerator> // config.<key>` (or `/`) in the code that is a size: not one
    that scales the hidden states (MiniCPM's logits `lm_head(hidden_states / (config.hidden_size /
    config.dim_model_base))`: a width ratio, not hidden_size // heads)."""
    if not numerator or not numerator.startswith("config.") or not sources:
        return
    for file, _cls, func in codekeys.methods(sources):
        scales = {id(side) for node in subtree(func)
                  if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.Mult))
                  for side, other in ((node.left, node.right), (node.right, node.left)) if _states(other)}
        for node in subtree(func):
            if (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Div)) and id(node) not in scales
                    and f"config.{_config_key(node.left)}" == numerator and (key := _config_key(node.right))):
                yield key, file, node.lineno


def _states(node: ast.AST) -> bool:
    """An operand that is a value computed at run time (a tensor: hidden_states, x, self.proj(x)), not a number from
    the config, a constant or the module's attributes set from them."""
    return not any(isinstance(n, ast.Constant) or _config_key(n) or (isinstance(n, ast.Attribute) and isinstance(
        n.value, ast.Name) and n.value.id == "self") for n in subtree(node)) and not isinstance(node, ast.Constant)


def _divisor(sources: dict, config: dict, numerator: str | None) -> tuple[codekeys.CodeExpr, int] | None:
    """The head count as the code computes head_dim: `config.<hidden> // config.<heads>`, when one key is."""
    found = {key: (file, line) for key, file, line in _divisions(sources, numerator)}
    if len(found) != 1:
        return None
    key, (file, line) = next(iter(found.items()))
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return codekeys.CodeExpr(f"config.{key}", (key,), file, line), value


def _kv_keys(sources: dict, heads: str | None, config: dict | None = None,
             library: dict | None = None) -> tuple[str, ...]:
    """Config keys the code uses as the KV head count: the divisor of the head count (query heads per KV
    group), or a key assigned to an attention attribute named for KV heads (`self.n_kv_heads = config.K`)."""
    keys = [key for key, _file, _line in _divisions(sources, heads)]
    # Keys read from a sub-config (DBRX's `self.num_key_value_heads = attn_config.kv_n_heads`, attn_config =
    # config.attn_config): "K.Y" where the code reads K.Y on the assignment's line.
    for _file, _cls, _func, attr, value in codekeys.self_assignments(sources):
        if re.fullmatch(r"(num_|n_)?(kv|key_value)_?(heads?|groups?)?", attr) and (key := _config_key(value)):
            keys.append(key)
    # Keys read from a sub-config (DBRX's `self.num_key_value_heads = attn_config.kv_n_heads`, attn_config =
    # config.attn_config): "K.Y" where the code reads K.Y on the assignment's line (transformers' own file too).
    code = sources or library
    reads = subconfigs.subconfig_reads(code, config) if config and code else None
    at = {where: read for read, where in reads.at} if reads is not None else {}
    for file, _cls, _func, attr, value in codekeys.self_assignments(code) if at else ():
        if (re.fullmatch(r"(num_|n_)?(kv|key_value)_?(heads?|groups?)?", attr) and isinstance(value, ast.Attribute)
                and (read := at.get(f"{file}:{value.lineno}", "")).endswith(f".{value.attr}")):
            keys.append(read)
    return tuple(dict.fromkeys(keys))


def _kv_heads(ckpt: Checkpoint, spec: Spec, keys: tuple[str, ...], reads: set[str]) -> None:
    key, _ = config_value(ckpt, *keys)
    if key is None:
        spec.set("num_kv_heads", spec.num_heads,
                 Source("default", "no num_key_value_heads: one KV head per query head", spec.source("num_heads").expr))
        return
    set_from_config(spec, ckpt, "num_kv_heads", (key,), int)
    flag = "multi_query_attention"
    if key == "multi_query_group_num" and flag in reads:
        # chatglm: the groups apply only where multi_query_attention is set; otherwise one KV head per head.
        on = ckpt.config.get(flag)
        expr = f"(config.{key} if config.{flag} else {spec.source('num_heads').expr})"
        spec.set("num_kv_heads", spec.num_kv_heads if on else spec.num_heads,
                 Source("code", f"config.json {key} where {flag} (the code reads both)", expr))


def _layer_mlp_width(sources: dict, config: dict, aliases: dict) -> tuple[codekeys.CodeExpr, int] | None:
    """The MLP width where the decoder layer builds its MLP with it (Llama 4's dense layers:
    `Llama4TextMLP(config, intermediate_size=config.intermediate_size_mlp)`, the class's own default otherwise):
    the one config expression the layer's __init__ passes as an `intermediate_size` keyword."""
    layer = dataflow.layer_class(sources)
    init = next((f for f in layer[1].body if isinstance(f, ast.FunctionDef) and f.name == "__init__"),
                None) if layer else None
    found = []
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and isinstance(node.value, ast.Call)):
            for kw in node.value.keywords:
                if kw.arg == "intermediate_size" and (expr := codekeys.config_expr(kw.value, init)) and expr[1]:
                    found.append(codekeys.CodeExpr(expr[0], expr[1], layer[0], node.lineno))
    return _valued(_unique(found), config, aliases)


def _mlp_width(sources: dict, spec: Spec, config: dict, aliases: dict) -> tuple[codekeys.CodeExpr, int] | None:
    """The MLP width: the input features of the MLP's down projection, the one linear of the `mlp` module's
    class that maps back to hidden_size; where no module is called `mlp`, the one linear of any class that maps
    a width other than the attention heads' back to hidden_size."""
    hidden = spec.source("hidden_size").expr
    if not sources or not hidden:
        return None
    classes = _mlp_classes(sources)
    linear = linear_classes(sources)
    heads = set(spec.source("num_heads").expr and re.findall(r"config\.(\w+)", spec.source("num_heads").expr) or ())
    found = []
    for file, cls, func in codekeys.methods(sources):
        if (classes and cls.name not in classes) or func.name != "__init__":
            continue
        for node in subtree(func):
            kind = linear.get(codekeys.callee(node)) if isinstance(node, ast.Call) else None
            # Conv1D(nf, nx) takes the output width first.
            if kind is not None and len(node.args) > max(kind.in_arg, kind.out_arg):
                features_in = codekeys.config_expr(node.args[kind.in_arg], func)
                features_out = codekeys.config_expr(node.args[kind.out_arg], func)
                if (features_out and features_out[0] == hidden and features_in and features_in[0] != hidden
                        and not heads & set(features_in[1])):
                    found.append(codekeys.CodeExpr(features_in[0], features_in[1], file, node.lineno))
    return _valued(_unique(found + _built_widths(sources, hidden, heads, bool(classes))), config, aliases)


def _mlp_classes(sources: dict) -> set[str]:
    """The classes built as `self.mlp`: the decoder layer's own (both branches of a conditional, DeepSeek-V3's
    dense and MoE layers), where it builds one; else every class's. A module of another class also called `mlp`
    (A.X-K2's gated norm holds a low-rank AXK2GateMLP as self.mlp) is not the layer's MLP."""
    layer = dataflow.layer_class(sources)
    every: set[str] = set()
    own: set[str] = set()
    for _file, cls, _func, attr, value in codekeys.self_assignments(sources):
        if attr != "mlp":
            continue
        for call in (value.body, value.orelse) if isinstance(value, ast.IfExp) else (value,):
            if isinstance(call, ast.Call):
                every.add(codekeys.callee(call))
                if layer is not None and cls is layer[1]:
                    own.add(codekeys.callee(call))
    return own or every


def _built_widths(sources: dict, hidden: str, heads: set, mlp_named: bool) -> list[codekeys.CodeExpr]:
    """A module-level function that builds the MLP's linears from its parameters (CTRL's
    point_wise_feed_forward_network(d_model_size, dff) returning an nn.Sequential), called by a constructor with
    config values: the widths its linears map back to hidden_size, read with the call's arguments in place of the
    parameters."""
    linear = linear_classes(sources)
    found = []
    builders = {node.name: node for _file, tree in _parsed(sources) for node in tree.body
                if isinstance(node, ast.FunctionDef)}
    for file, _cls, init, attr, value in codekeys.self_assignments(sources):
        if not isinstance(value, ast.Call) or (mlp_named and attr != "mlp"):
            continue
        fn = builders.get(codekeys.callee(value)) if isinstance(value.func, ast.Name) else None
        if fn is None:
            continue
        bound = dict(zip((a.arg for a in fn.args.args), value.args))
        bound.update({k.arg: k.value for k in value.keywords if k.arg})
        for node in subtree(fn):
            kind = linear.get(codekeys.callee(node)) if isinstance(node, ast.Call) else None
            if kind is None or len(node.args) <= max(kind.in_arg, kind.out_arg):
                continue
            args = [bound.get(a.id, a) if isinstance(a, ast.Name) else a for a in node.args]
            features_in = codekeys.config_expr(args[kind.in_arg], init)
            features_out = codekeys.config_expr(args[kind.out_arg], init)
            if (features_out and features_out[0] == hidden and features_in and features_in[0] != hidden
                    and not heads & set(features_in[1])):
                found.append(codekeys.CodeExpr(features_in[0], features_in[1], file, node.lineno))
    return found

