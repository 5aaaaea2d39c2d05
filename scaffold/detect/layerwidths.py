"""Modules of the decoder layer built with a width of each layer's own: a linear that maps config.K[i] features back
to the hidden size in layer i (Gemma-3n's MLP, `config.intermediate_size[layer_idx]`), the width followed from the
module's __init__ through the decoder layer's constructor call to the layer list's index (window's steps), whatever
the modules, the key and the parameters are called; or a width computed from one config value and the layer's index
(Gemma 4's double-wide MLP: `config.intermediate_size * (2 if use_double_wide_mlp and is_kv_shared_layer else 1)`,
its locals and the constructors' parameters followed the same way). detect.sizes ports either as
layer_intermediate_sizes; the policy's shape check lets that module's tensors differ from layer to layer."""

from __future__ import annotations

import ast

from scaffold.detect import codekeys, conditions, dataflow, purefuncs, window
from scaffold.detect.linears import linear_classes, width_args
from scaffold.detect.sourcecode import subtree


def _config_key(node: ast.AST) -> str | None:
    """`K` of `config.K` / `self.config.K`."""
    if isinstance(node, ast.Attribute) and codekeys._is_config(node.value):
        return node.attr
    return None


def per_layer_widths(sources: dict, hidden: str | None) -> list[tuple[str, str, str]]:
    """(the layer's attribute, K, file:line) of each linear, in a module the decoder layer builds, that maps
    config.K[i] features back to the hidden size (`hidden`, the config expression) with i the layer's index (the
    layer list's loop variable, handed down through the constructors)."""
    found = []
    for attr, width, where in width_expressions(sources, hidden):
        if (isinstance(width, ast.Subscript) and isinstance(width.slice, ast.Name)
                and width.slice.id == "layer_idx" and (key := _config_key(width.value)) is not None):
            found.append((attr, key, where))
    return found


def _mlp_attribute(sources: dict, config: dict) -> str | None:
    """The decoder layer's attribute holding its MLP, as the layer's forward uses it (dataflow)."""
    layer = dataflow.analyze_layer(sources, config)
    return layer.mlp if layer is not None else None


def _indexes_a_layer_list(width: ast.expr, config: dict, num_layers: int) -> bool:
    """Whether `width` reads config.K[layer_idx] of a key config.json holds one value per layer (OpenELM's
    ffn_multipliers): a width of each layer's own where the config has no width key."""
    return any(isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Name) and n.slice.id == "layer_idx"
               and (k := _config_key(n.value)) is not None and isinstance(config.get(k), list)
               and len(config[k]) == num_layers for n in ast.walk(width))


def layer_dependent_widths(sources: dict, hidden: str | None, key: str | None, config: dict,
                           num_layers: int, exclude: frozenset[str] = frozenset()
                           ) -> list[tuple[str, str, list[int], str]]:
    """(the layer's attribute, the expression, its value in each layer, file:line) of each linear, in a module the
    decoder layer builds, that maps a width computed from config.K (`key`, the MLP's width key, one number in
    config.json) and the layer's index back to the hidden size, where that width differs between layers (Gemma 4's
    double-wide MLP in its KV-shared layers: `config.intermediate_size * (2 if config.use_double_wide_mlp and
    layer_idx >= config.num_hidden_layers - config.num_kv_shared_layers > 0 else 1)`), whatever the locals, the
    attributes and the modules are called. Or, whatever the width key (`key`, None where the config has none), a
    width computed from a config list of one value per layer (OpenELM's `make_divisible(config.ffn_multipliers[layer_idx] * config.model_dim, ...)`,
    the helper written out by purefuncs); `exclude`: the layer's attributes not to read (its attention, whose
    heads detect.layerheads reads). The expression reads the config and the layer's index alone, so the port
    evaluates it per layer on the config it serves; one it cannot evaluate on config.json is left out."""
    if isinstance(config.get(key), list):
        return []
    found = []
    for attr, width, where in width_expressions(sources, hidden):
        if attr in exclude:
            continue
        # OpenELM's make_divisible(...), a helper the port carries (spec code_helpers), written out to be read.
        written = purefuncs.inline(width, sources)
        names = {n.id for n in ast.walk(written) if isinstance(n, ast.Name)}
        if "layer_idx" not in names or names - window.READS or _config_key(written) is not None:
            continue
        read = {n.attr for n in ast.walk(written) if isinstance(n, ast.Attribute) and codekeys._is_config(n.value)}
        if key not in read and not (_indexes_a_layer_list(written, config, num_layers)
                                    and attr == _mlp_attribute(sources, config)):
            continue  # a width from a per-layer list only where it is the MLP's (not Laguna's heads per layer)
        values = [conditions._value(written, config, {"layer_idx": i}) for i in range(num_layers)]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
            continue
        if len(set(values)) > 1:
            found.append((attr, ast.unparse(width), values, where))
    return found


def layer_reads(sources: dict) -> list[tuple[str, str, str]]:
    """(the layer's attribute, K, file:line) wherever a module the decoder layer builds reads config.K[i] in its own
    __init__, i the layer's index handed down through the constructors (OpenELM's attention:
    `q_heads = config.num_query_heads[layer_idx]`; its FFN: `ffn_multiplier = config.ffn_multipliers[layer_idx]`):
    that module may be sized differently in each layer, as the code computes."""
    found = []
    linear = linear_classes(sources)
    sizing = {(attr, ast.dump(n)) for attr, _file, _init, _width, lifted
              in _submodule_exprs(sources, lambda init: _linear_widths(init, linear))
              for n in ast.walk(lifted) if isinstance(n, ast.Subscript)}
    for attr, file, init, read, lifted in _submodule_exprs(sources, _layer_indexed_reads):
        if (isinstance(lifted, ast.Subscript) and isinstance(lifted.slice, ast.Name)
                and lifted.slice.id == "layer_idx" and (key := _config_key(lifted.value)) is not None
                and (attr, ast.dump(lifted)) in sizing):  # it sizes a projection (not a flag: SmolLM3's no_rope_layers)
            found.append((attr, key, f"{file}:{read.lineno}"))
    return list(dict.fromkeys(found))


def _linear_widths(init: ast.FunctionDef, linear: dict) -> list[ast.expr]:
    """The input and output widths of the linear layers (`linear`: linears.linear_classes) an __init__ builds."""
    out = []
    for node in subtree(init):
        kind = linear.get(codekeys.callee(node)) if isinstance(node, ast.Call) else None
        if kind is not None and (args := width_args(kind, node)) is not None:
            out += list(args)
    return out


def _layer_indexed_reads(init: ast.FunctionDef) -> list[ast.expr]:
    """The `config.K[name]` subscripts of an __init__ (name: any parameter or local, followed by the lift)."""
    return [node for node in subtree(init) if isinstance(node, ast.Subscript) and _config_key(node.value) is not None
            and isinstance(node.slice, ast.Name)]


def _submodule_exprs(sources: dict, pick) -> list[tuple[str, str, ast.FunctionDef, ast.expr, ast.expr]]:
    """(the layer's attribute, file, the submodule's __init__, each expression `pick` finds there, that expression
    followed to the config and the layer's index) for each module the decoder layer builds."""
    layer_found = dataflow.layer_class(sources) if sources else None
    if layer_found is None:
        return []
    layer_file, layer_cls, list_line = layer_found
    layer_init = window._init(layer_cls)
    found = []
    for attr, call in dataflow._init_assignments(layer_init).items():
        sub = dataflow._submodule_class(sources, call)
        init = window._init(sub[1]) if sub is not None else None
        if init is None:
            continue
        for expr in pick(init):
            lifted = window._lift(expr, init, {})
            lifted = window._lift(lifted, None, window._bind(init, call))
            lifted = window._lift(lifted, layer_init, {})
            lifted = window._to_layer_list(sources, layer_file, list_line, layer_init, lifted)
            if lifted is not None:
                found.append((attr, sub[0], init, expr, lifted))
    return found


def width_expressions(sources: dict, hidden: str | None) -> list[tuple[str, ast.expr, str]]:
    """(the layer's attribute, the input width followed to the config and the layer's index, file:line) of each
    linear, in a module the decoder layer builds, that maps back to the hidden size (`hidden`, the config
    expression)."""
    if not sources or not hidden:
        return []
    layer_found = dataflow.layer_class(sources)
    if layer_found is None:
        return []
    layer_file, layer_cls, list_line = layer_found
    layer_init = window._init(layer_cls)
    linear = linear_classes(sources)
    found = []
    for attr, call in dataflow._init_assignments(layer_init).items():
        sub = dataflow._submodule_class(sources, call)
        if sub is None:
            continue
        file, cls = sub
        init = window._init(cls)
        for node in subtree(init) if init is not None else ():
            kind = linear.get(codekeys.callee(node)) if isinstance(node, ast.Call) else None
            args = width_args(kind, node) if kind is not None else None
            if args is None:
                continue
            out = codekeys.config_expr(args[1], init)
            if not out or out[0] != hidden:
                continue
            width = window._lift(args[0], init, {})
            width = window._lift(width, None, window._bind(init, call))
            width = window._lift(width, layer_init, {})
            width = window._to_layer_list(sources, layer_file, list_line, layer_init, width)
            if width is not None:
                found.append((attr, width, f"{file}:{node.lineno}"))
    return found
