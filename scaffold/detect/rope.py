"""The position scheme (rotary, ALiBi) from the modeling code; rotary parameters from config.json first,
then defaults in the modeling code."""

from __future__ import annotations

import ast
import re

from scaffold.checkpoint import Checkpoint
from scaffold.detect import blocks, codekeys, conditions, configreads, dataflow, longrope, rotaryfreq, sourcecode
from scaffold.detect.common import unsupported
from scaffold.detect.positions import (
    alibi_code,
    alibi_scaled,
    computed_positions,
    learned_positions,
    positions_offset,
    rotary_code,
)
from scaffold.detect.sinusoid import SinusoidTable, sinusoid_table
from scaffold.detect.sourcecode import (
    Found,
    _classes,
    config_default,
    modeling_sources,
    rotate_half_style,
    subtree,
    walk,
)
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.spec import CODE_LONGROPE, COMPUTED_ROPE_BASE, THETA_UNREAD, Source, Spec

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional")
DEFAULT_THETA = 10000.0
NEEDS_ORIGINAL_MAX = ("longrope", "yarn", "llama3")


LAYER_TYPES = ("full_attention", "sliding_attention")


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    _position_scheme(ckpt, spec)
    where = ckpt.config_file
    cfg = ckpt.config
    params = cfg.get("rope_parameters")
    sliding, sliding_source = {}, Source("default", "sliding-window layers rotate as the others do")
    per_type, null_types, null_check = None, [], None
    computed = None
    if isinstance(params, dict) and set(params) & set(LAYER_TYPES) and "rope_theta" not in params:
        # One set of parameters per layer type (Gemma 3 in transformers 5).
        per_type = params
        null_types = [t for t in LAYER_TYPES if t in per_type and per_type[t] is None]
        rotating = [t for t in LAYER_TYPES if t not in null_types]
        if null_types and rotating and (null_check := _null_rope_check(modeling_sources(ckpt))) is not None:
            # A layer type without rotary parameters takes no rotary embedding (Cohere Compass's NoPE layers): its
            # layers are no_rope_layers; the port builds their unused rotary from the other type's set.
            per_type = {**per_type, **{t: per_type[rotating[0]] for t in null_types}}
        else:
            null_types = []
        if not all(isinstance(per_type.get(t), dict) and "rope_theta" in per_type[t] for t in LAYER_TYPES):
            raise CheckpointError("config key 'rope_parameters' is keyed by layer type but does not give "
                                  f"rope_theta for each of {', '.join(LAYER_TYPES)}.", where)
        params = dict(per_type["full_attention"])
        source = Source("config", "config.json rope_parameters.full_attention" + (
            f" (null for {', '.join(null_types)}: those layers take no rotary, {null_check}; their unused rotary "
            f"built from {rotating[0]}'s set)" if null_types else ""))
        sliding = _checked(dict(per_type["sliding_attention"]), where)
        sliding_source = Source("config", "config.json rope_parameters.sliding_attention")
    elif isinstance(params, dict) and "rope_theta" in params:
        params = dict(params)
        source = Source("config", "config.json rope_parameters")
    else:
        params = {}
        scaling = cfg.get("rope_scaling")
        if isinstance(scaling, dict):
            params.update(scaling)
            if "type" in params and "rope_type" not in params:
                params["rope_type"] = params.pop("type")
        unread = _theta_unread(ckpt) if cfg.get("rope_theta") is not None else None
        if cfg.get("rope_theta") is not None and unread is None:
            params["rope_theta"] = cfg["rope_theta"]
            source = Source("config", "config.json rope_theta")
        elif (base := _base_key(ckpt)) is not None:
            # The code passes its own key as the base (qwen's RotaryEmbedding(dim, base=config.rotary_emb_base)).
            params["rope_theta"] = ckpt.config[base.keys[0]]
            source = Source("code", f"{base}: base={base.expr}", base.expr)
        else:
            found = config_default(ckpt, "rope_theta")
            if found is not None:
                params["rope_theta"] = found.value
                source = Source("code", f"{found}: default of getattr(config, 'rope_theta', ...)")
            elif isinstance(computed := _computed_base(ckpt, spec), rotaryfreq.ComputedBase) and (
                    computed.float16 or abs(computed.base - DEFAULT_THETA) > 1e-9 * DEFAULT_THETA):
                params["rope_theta"] = computed.base
                source = Source("code", f"{computed}: {computed.cls} run over numbers at "
                                        f"{', '.join(map(str, computed.lengths))} positions computes NeoX rotary at "
                                        f"base {computed.base:.10g} at each: {COMPUTED_ROPE_BASE}")
            elif isinstance(computed, str) and rotaryfreq.MOVING in computed:
                # A base the code computes from the length itself (dynamic NTK below the port's max_position):
                # no one table computes it.
                raise unsupported(f"a rotary table that changes with the sequence length up to the port's "
                                  f"max_position {spec.max_position}: {computed}", where, spec.model_type)
            else:
                params["rope_theta"] = DEFAULT_THETA
                source = Source("default", "no rope_theta in config.json or the modeling source")
        if unread is not None and source.kind == "default":
            if isinstance(computed, rotaryfreq.ComputedBase):
                # The code's own rotary, run over numbers, computes the default base: say so rather than assume it.
                source = Source("code", f"{computed}: {computed.cls} run over numbers at "
                                        f"{', '.join(map(str, computed.lengths))} positions computes NeoX rotary at "
                                        f"base {computed.base:.10g}")
            elif (default := _default_base(modeling_sources(ckpt))) is not None:
                params["rope_theta"], source = default
            else:  # nothing shows the base the code uses: config.json's value, as before
                params["rope_theta"], source, unread = cfg["rope_theta"], Source("config", "config.json rope_theta"), None
        if unread is not None:
            source = Source(source.kind, f"{source.detail}; {unread}", source.expr)
        local = cfg.get("rope_local_base_freq")  # Gemma 3 configs of transformers 4
        if local is not None:
            sliding = _checked({"rope_type": "default", "rope_theta": local}, where)
            sliding_source = Source("config", "config.json rope_local_base_freq")
    sections = next((f"{key}.mrope_section = {kind['mrope_section']}" for key, kind in (("rope_parameters", params),
                                                                    ("sliding rope_parameters", sliding))
                     if "mrope_section" in kind), None)
    _frequency_order(ckpt, spec, params, sliding, per_type, sections, null_types)
    for kind in (params, sliding):
        # Ported as one row of positions (rope_position_rows): the sections are not vLLM's M-RoPE's to apply.
        kind.pop("mrope_section", None)
        kind.pop("mrope_interleaved", None)
    if sliding == params or not spec.layers_with_window:
        sliding, sliding_source = {}, Source("default", "sliding-window layers rotate as the others do")
    spec.set("sliding_rope_parameters", sliding, sliding_source)
    if isinstance(computed, rotaryfreq.ComputedBase) and computed.float16 and source.kind == "code":
        spec.set("rope_table_float16", True,
                 Source("code", f"{computed}: {computed.cls} rounds its cos/sin table to float16 (.half()) at every "
                                "length read"))
    else:
        spec.set("rope_table_float16", False, Source("default", "the cos/sin table as vLLM computes it"))
    params.setdefault("rope_type", "default")
    if (params["rope_type"] in NEEDS_ORIGINAL_MAX and "original_max_position_embeddings" not in params
            and isinstance(cfg.get("original_max_position_embeddings"), int)):
        # vLLM's get_rope reads it from the rope parameters; transformers from the config's top level.
        params["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
        source = Source(source.kind, f"{source.detail} + config.json original_max_position_embeddings")
    if not isinstance(params["rope_theta"], (int, float)) or params["rope_theta"] <= 0:
        raise CheckpointError(f"rope_theta must be a positive number, not {params['rope_theta']!r}.", where)
    params["rope_theta"] = float(params["rope_theta"])
    if params["rope_type"] not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedArchitecture(f"rope type {params['rope_type']!r} is not supported.", where)
    _proportional_unscaled(params, where)
    if params["rope_type"] == "longrope":
        source = _longrope_applied(ckpt, spec, params, source)
    factor = cfg.get("partial_rotary_factor", cfg.get("rotary_pct", params.get("partial_rotary_factor")))
    # The spec field partial_rotary_factor is the one source of truth; the template adds it back.
    params.pop("partial_rotary_factor", None)
    spec.set("rope_parameters", params, source)

    stored = _stored_frequencies(ckpt, spec)
    rotary_dim = _rotary_dim_key(ckpt, spec) if factor is None else None
    if factor is not None:
        if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
            raise CheckpointError(f"partial_rotary_factor must be in (0, 1], not {factor!r}.", where)
        spec.set("partial_rotary_factor", float(factor), Source("config", "config.json partial_rotary_factor"))
    elif rotary_dim is not None:
        found, dims = rotary_dim
        spec.set("partial_rotary_factor", dims / spec.head_dim,
                 Source("code", f"{found}: {found.expr} = {dims} of {spec.head_dim} head dims rotate", found.expr))
    elif stored is not None:
        name, count = stored
        spec.set("partial_rotary_factor", 2 * count / spec.head_dim,
                 Source("tensor", f"{name} holds {count} frequencies: {2 * count} of {spec.head_dim} head dims rotate"))
    else:
        spec.set("partial_rotary_factor", 1.0, Source("default", "rotary embedding over the whole head"))
    gptj = rotate_half_style(modeling_sources(ckpt))
    pairs = _adjacent_pairs(ckpt.sources) if gptj is None else None
    if pairs is None and gptj is None and not ckpt.sources and not _defines(modeling_sources(ckpt), "rotate_half"):
        # transformers' own file: one with no rotate_half at all rotates its own way (GPT-J's rotate_every_two);
        # one with both forms keeps the other behind a config flag (DeepSeek-V3's rope_interleave).
        pairs = _adjacent_pairs(modeling_sources(ckpt))
    if pairs is None and gptj is None:
        pairs = _attention_pairs(modeling_sources(ckpt), spec)
    interleave = cfg.get("rope_interleave")
    if isinstance(interleave, bool):
        # DeepSeek-V3's code keeps both forms and picks one by this flag.
        spec.set("rope_neox_style", not interleave,
                 Source("config", f"config.json rope_interleave = {str(interleave).lower()}: "
                                  + ("adjacent channels paired, GPT-J style" if interleave else "rotate_half")))
    elif gptj is not None:
        spec.set("rope_neox_style", False, Source("code", f"{gptj}: rotate_half pairs even and odd channels"))
    elif pairs is not None:
        spec.set("rope_neox_style", False, Source("code", f"{pairs}: the rotary function pairs adjacent channels, "
                                                          "GPT-J style"))
    else:
        spec.set("rope_neox_style", True, Source("default", "rotate_half (NeoX style) rotary embedding"))
    if (reversed_at := _reversed_rotation(modeling_sources(ckpt))) is not None:
        if not spec.rope_neox_style:
            raise unsupported(f"a rotary embedding that turns by -theta ({reversed_at}: the code swaps the "
                              "halves as (x2, -x1)) on adjacent channel pairs (GPT-J style), which vLLM's get_rope "
                              "does not compute", ckpt.config_file, spec.model_type)
        spec.set("rope_reversed", True,
                 Source("code", f"{reversed_at}: the halves swapped as cat((x2, -x1)), a rotation by -theta; "
                                "ported as NeoX rotary on q/k rows with each head's rotated halves swapped"))
    else:
        spec.set("rope_reversed", False, Source("default", "rotate_half returns cat((-x2, x1)): rotation by +theta"))

    if null_types:
        layer_types = cfg.get("layer_types")
        if not isinstance(layer_types, list) or len(layer_types) != spec.num_layers:
            raise CheckpointError(f"config key 'layer_types' must name the type of each of {spec.num_layers} layers "
                                  "where rope_parameters is null for a type.", where)
        expr = " and ".join(f"config.layer_types[layer_idx] != {t!r}" for t in null_types)
        spec.set("no_rope_layers", [i for i, t in enumerate(layer_types) if t in null_types],
                 Source("code", f"{null_check}: the code rotates a layer only where its type's rotary parameters are "
                                f"not None; config.json rope_parameters.{null_types[0]} is null", expr))
        return
    flags = cfg.get("no_rope_layers")
    if flags is None:
        guarded = _rotary_guard(ckpt, spec) if spec.position_scheme == "rotary" else None
        if guarded is not None:
            layers, source = guarded
            spec.set("no_rope_layers", layers, source)
            return
        spec.set("no_rope_layers", [], Source("default", "rotary embedding in every layer"))
        return
    if (not isinstance(flags, list) or len(flags) != spec.num_layers
            or any(f not in (0, 1) or isinstance(f, float) for f in flags)):
        raise CheckpointError(f"config key 'no_rope_layers' must list 0 or 1 for each of {spec.num_layers} layers.",
                              where)
    spec.set("no_rope_layers", [i for i, use in enumerate(flags) if not use],
             Source("config", "config.json no_rope_layers (0: the layer skips rotary)"))


def _longrope_applied(ckpt: Checkpoint, spec: Spec, params: dict, source: Source) -> Source:
    """LongRoPE as the modeling code applies it (scaffold.detect.longrope): where its module uses one set of factors
    at every position it serves (MiniCPM4's: chosen once by max_position_embeddings > original), both of vLLM's
    sets become that one and both mscales the code's scale, so vLLM computes the same whatever its max_model_len;
    a module that computes neither set is refused naming what it computes. A class built with no short and long
    factors (transformers' Phi-3, whose choice by sequence length is vLLM's own form) leaves the parameters as they
    are."""
    found = longrope.read(modeling_sources(ckpt), ckpt.config, spec.head_dim, params)
    if found is None:
        return source
    if isinstance(found, str):
        raise unsupported(f"a LongRoPE rotary embedding vLLM's Phi3LongRoPEScaledRotaryEmbedding does not compute "
                          f"({found})", ckpt.config_file, spec.model_type)
    factors = list(found.factors)
    params.update(short_factor=factors, long_factor=list(factors), short_mscale=found.mscale,
                  long_mscale=found.mscale)
    return Source(source.kind, f"{source.detail}; {found.describe()}: {CODE_LONGROPE} "
                               f"rope_scaling.{found.which}, both mscales {found.mscale:.9g}")


def _computed_base(ckpt: Checkpoint, spec: Spec) -> rotaryfreq.ComputedBase | str | None:
    """The base the rotary module computes where config.json names none (TeleChat's, from training_seqlen: 10000 *
    3 ** (d / (d - 2)) up to training_seqlen positions), the same at 40 and 256 positions (what verify runs) and at
    the port's max_position; a reason or None otherwise (rotaryfreq.read_computed_base)."""
    sources = modeling_sources(ckpt)
    if not sources or spec.head_dim <= 0 or spec.position_scheme != "rotary":
        return None
    lengths = tuple(sorted({40, 256, *([spec.max_position] if 256 < spec.max_position <= 1 << 16 else [])}))
    return rotaryfreq.read_computed_base(sources, ckpt.config, spec.head_dim, lengths)


def _null_rope_check(sources: dict[str, str]) -> str | None:
    """file:line where the code tests a layer type's rotary parameters against None (`... if
    self.config.rope_parameters[layer_type] is not None else None`: no rotary for that type), if it does."""
    for file, node in walk(sources):
        if (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Is, ast.IsNot))
                and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value is None
                and isinstance(node.left, ast.Subscript)
                and re.search(r"(^|\.)rope_parameters$", ast.unparse(node.left.value))):
            return f"{file}:{node.lineno}"
    return None


def _frequency_order(ckpt: Checkpoint, spec: Spec, params: dict, sliding: dict, per_type: dict | None,
                     sections: str | None, null_types: list[str]) -> None:
    """The order of the rotary frequencies, from running the code's rotary module over numbers
    (scaffold.detect.rotaryfreq): another order than the standard one is ported (rope_frequency_order); config.json's
    multimodal rotary sections (mrope_section) are ported where, for text, every row of positions holds the same
    positions and the module's table is NeoX rotary at the standard frequencies in some order; anything else is
    refused naming what the code computes."""
    where = ckpt.config_file
    what = f"multimodal rotary sections ({sections})" if sections else "a rotary embedding"
    sources = modeling_sources(ckpt)
    present = ckpt.config.get("layer_types")
    present = set(present) if isinstance(present, list) and all(isinstance(t, str) for t in present) else set(LAYER_TYPES)
    present -= set(null_types)  # layer types that take no rotary: the module computes no table for them
    kinds = ({t: dict(per_type[t]) for t in LAYER_TYPES if t in present} or {t: dict(per_type[t]) for t in LAYER_TYPES}
             if per_type is not None else {None: params})
    orders, reasons = {}, []
    for kind, kind_params in kinds.items():
        theta = kind_params.get("rope_theta")
        if not sources or not isinstance(theta, (int, float)) or isinstance(theta, bool) or spec.head_dim <= 0:
            reasons.append("no modeling code or rotary base to read it from")
            continue
        try:
            found = rotaryfreq.read_order(sources, ckpt.config, kind, spec.head_dim, float(theta))
        except RecursionError:
            found = "the rotary module nests too deep to read"
        if found is None:
            reasons.append("no rotary module built by the decoder stack (self.rotary_emb) to read")
        elif isinstance(found, str):
            reasons.append(found)
        else:
            orders[kind] = found
    if sections is None and (reasons or not any(o.permuted for o in orders.values())):
        # The module computes the standard order, or one the reader does not follow: the rotary is the config's.
        return
    if reasons:
        raise unsupported(f"{what}: {reasons[0]}", where, spec.model_type)
    if len({o.order for o in orders.values()}) > 1:
        raise unsupported(f"{what}: the layer types' rotary tables turn their columns in different orders "
                          f"({'; '.join(f'{k}: {list(o.order)}' for k, o in orders.items())})", where,
                          spec.model_type)
    found = next(iter(orders.values()))
    if sections is not None:
        rows = rotaryfreq.differing_rows(sources)
        if rows is not None:
            raise unsupported(f"{what}: the rows of positions are computed apart ({rows}), a multimodal M-RoPE "
                              "whose rows differ", where, spec.model_type)
        if any(k.get("rope_type", "default") != "default" for k in kinds.values()):
            raise unsupported(f"{what} with a scaled rope type", where, spec.model_type)
        spec.set("rope_position_rows", True,
                 Source("config", f"config.json {sections}: vLLM hands the model one row of positions per section; "
                                  f"for text every row holds the same positions ({found}: {found.cls} reads them so)"))
    if found.permuted:
        spec.set("rope_frequency_order", list(found.order),
                 Source("code", f"{found}: {found.cls} run over numbers with the same positions in every row "
                                f"computes NeoX rotary whose column j turns at {found.base:g} ** (-2 * order[j] / "
                                f"{spec.head_dim}), order {list(found.order)}"))


GUARD_NAMES = frozenset({"config", "layer_idx", "hasattr", "getattr"})  # what a per-layer rotary condition may
# read, in the port too


def _rotary_guard(ckpt: Checkpoint, spec: Spec) -> tuple[list[int], Source] | None:
    """The layers that skip the rotary embedding where the attention's code applies it under a condition on the
    layer (AfMoE's `if self.is_local_attention:`, set in __init__ to `config.layer_types[layer_idx] ==
    "sliding_attention"`: its full-attention layers take no positions); the source carries that condition as the
    port evaluates it at run time (config, layer_idx). None where the code rotates in every layer; refused where
    the condition reads anything else."""
    sources = modeling_sources(ckpt)
    if not sources or "layers" not in spec.names:
        return None
    try:
        flow = dataflow.analyze_layer(sources, ckpt.config, spec.names["layers"]) \
            or dataflow.analyze_layer(sources, ckpt.config)
    except RecursionError:
        return None
    attention = flow.attention_flow if flow is not None else None
    if attention is None or attention.rotary_guard is None:
        return None
    what = f"a rotary embedding applied under a condition ({attention.rotary_guard_evidence})"
    try:
        test = ast.parse(attention.rotary_guard.replace("self.config.", "config."), mode="eval").body
    except SyntaxError:
        test = None
    read = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)} if test is not None else {"?"}
    truth = [conditions.evaluate(test, ckpt.config, {"layer_idx": i}) if not read - GUARD_NAMES else None
             for i in range(spec.num_layers)]
    if None in truth:
        raise unsupported(f"{what} that the config and the layer's number do not decide", ckpt.config_file,
                          spec.model_type)
    expr = ast.unparse(test) if attention.rotary_guard_when else f"not ({ast.unparse(test)})"
    rotates = [t == attention.rotary_guard_when for t in truth]
    return ([i for i, r in enumerate(rotates) if not r],
            Source("code", f"{attention.rotary_guard_evidence}: {expr}", expr))


def _position_scheme(ckpt: Checkpoint, spec: Spec) -> None:
    """Rotary or ALiBi, from what the modeling code computes. Code that can compute both (Falcon's) is
    switched by config.json's `alibi` flag. Without modeling code the model is assumed to rotate."""
    sources = modeling_sources(ckpt)
    alibi, rotary = alibi_code(sources), rotary_code(sources)
    flag = ckpt.config.get("alibi")
    if "embed_positions" in spec.names and rotary is None and alibi is None:
        # The layout found a learned position table the code adds to the token embedding (GPT-2's wpe).
        learned = learned_positions(sources)
        spec.set("position_scheme", "learned",
                 Source("code", f"{learned}: {learned.tokens}(input_ids) + {learned.positions}(positions)"
                        if learned is not None else "a learned position table (names.embed_positions)"))
        return
    if rotary is None and alibi is None and (computed := computed_positions(sources)) is not None:
        _sinusoidal(ckpt, spec, sources, *computed)
        return
    if alibi is not None and rotary is not None:
        if not isinstance(flag, bool):
            raise UnsupportedArchitecture(
                f"the modeling source computes both ALiBi ({alibi}) and a rotary embedding ({rotary}), and "
                "config.json has no boolean 'alibi' key to say which this checkpoint uses. Set "
                '`position_scheme = "alibi"` or `"rotary"` in a --spec file.', ckpt.config_file)
        scheme, source = ("alibi" if flag else "rotary"), Source("config", f"config.json alibi = {flag}")
    elif alibi is not None:
        scheme, source = "alibi", Source("code", f"{alibi}: the code builds ALiBi attention biases, no rotary")
    elif rotary is not None:
        scheme, source = "rotary", Source("code", f"{rotary}: the code computes a rotary embedding")
    else:
        scheme, source = "rotary", Source("default", "no modeling source says otherwise: rotary embedding")
    spec.set("position_scheme", scheme, source)
    scaled = alibi_scaled(sources) if scheme == "alibi" else None
    spec.set("alibi_scaled", scaled is not None,
             Source("code", f"{scaled}: the ALiBi bias is scaled with the scores") if scaled is not None
             else Source("default", "the ALiBi bias is added to the scaled scores" if scheme == "alibi"
                         else "no ALiBi"))


def _sinusoidal(ckpt: Checkpoint, spec: Spec, sources: dict, found, kind: str) -> None:
    """Absolute positions from a table the code computes (positions.computed_positions) and adds to the token
    embedding: the table read by scaffold.detect.sinusoid, the position offset and the zeroed row from the module
    that holds it. Anything else is refused naming what the code computes."""
    what = f"absolute positions computed by {kind} ({found}: {found.positions} of the positions added to the token " \
           "embedding, no stored table)"
    classes = dict(_classes(sources))
    holder = classes.get(kind, (None, None))[1]
    table = sinusoid_table(sources, holder, kind)
    if not isinstance(table, SinusoidTable):
        raise UnsupportedArchitecture(f"{what}: {table or 'no function of the code builds it from sines and cosines'}"
                                      "; the generator cannot express this.", ckpt.config_file)
    if spec.hidden_size % 2:
        raise UnsupportedArchitecture(f"{what}: a sinusoidal table of odd width {spec.hidden_size}; the generator "
                                      "builds even ones only.", ckpt.config_file)
    offset = positions_offset(sources, kind) if holder is not None else 0
    where = f"{table}: {table.describe()}; {found}: {found.tokens}(input_ids) + {found.positions}"
    spec.set("position_scheme", "sinusoidal", Source("code", where))
    spec.set("sinusoid_base", table.base, Source("code", f"{table}: {table.describe()}"))
    spec.set("sinusoid_shift", table.shift, Source("code", f"{table}: {table.describe()}"))
    spec.set("sinusoid_interleaved", table.interleaved, Source("code", f"{table}: {table.describe()}"))
    spec.set("position_offset", offset,
             Source("code", f"{found}: {kind} looks up position + {offset}") if offset
             else Source("code", f"{found}: {found.positions} looks up the positions as they are"))
    if table.padding_param is None:
        return
    # The zeroed row is a parameter of the table's builder: what the model hands the holder's constructor for it.
    expr = None
    for file, func, _attr, call in codekeys.constructed(sources, (kind,), found.positions):
        index = codekeys.signatures(sources).get(kind, ()).index(table.padding_param) \
            if table.padding_param in codekeys.signatures(sources).get(kind, ()) else -1
        node = codekeys._arg(call, index, table.padding_param) if index >= 0 else None
        read = codekeys.config_expr(node, func) if node is not None else None
        if read is not None and re.fullmatch(r"config\.\w+", read[0]):
            expr = (read[0], f"{file}:{call.lineno}")
    if expr is None:
        raise UnsupportedArchitecture(f"{what}: its builder zeroes the row {table.padding_param} ({table}), which "
                                      "the reader does not trace to a config value.", ckpt.config_file)
    value = ckpt.config.get(expr[0].removeprefix("config."))
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise UnsupportedArchitecture(f"{what}: the zeroed row {expr[0]} is {value!r}, not a row number.",
                                      ckpt.config_file)
    spec.set("sinusoid_padding_row", value,
             Source("config", f"{expr[1]}: {table.padding_param}={expr[0]}, the row {table} zeroes", expr[0]))


def _checked(params: dict, where) -> dict:
    """Rotary parameters of one layer type, with a positive rope_theta and a supported type."""
    params.setdefault("rope_type", "default")
    theta = params.get("rope_theta")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise CheckpointError(f"rope_theta must be a positive number, not {theta!r}.", where)
    params["rope_theta"] = float(theta)
    if params["rope_type"] not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedArchitecture(f"rope type {params['rope_type']!r} is not supported.", where)
    _proportional_unscaled(params, where)
    factor = params.get("partial_rotary_factor")
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1):
        raise CheckpointError(f"partial_rotary_factor must be in (0, 1], not {factor!r}.", where)
    # A layer type's own partial_rotary_factor stays in its set: vLLM's get_rope reads it from there.
    return params


def _proportional_unscaled(params: dict, where) -> None:
    """Proportional rotary (Gemma 4's full-attention layers: frequencies over the whole head width, zero past the
    rotated share) as vLLM's get_rope builds it (Gemma4RotaryEmbedding), which reads no `factor`; transformers
    divides the frequencies by one, so a factor other than 1 is refused by name."""
    if params.get("rope_type") != "proportional":
        return
    factor = params.get("factor", 1.0)
    if factor != 1.0:
        raise UnsupportedArchitecture(f"proportional rotary with factor {factor!r}: transformers divides its "
                                      "frequencies by the factor, vLLM's Gemma4RotaryEmbedding reads none.", where)


ROPE_CONFIG_WORDS = ("rope_theta", "rope_parameters", "ROPE_INIT_FUNCTIONS", "rope_config_validation")


def _theta_unread(ckpt: Checkpoint) -> str | None:
    """Why config.json's rope_theta is inert, where it is: the checkpoint's own code computes its rotary embedding
    without ever naming rope_theta (InternLM's InternLMRotaryEmbedding(head_dim, max_position_embeddings) takes its
    base's default 10000 whatever config.json holds), nor rope_parameters or transformers' rope helpers, and imports
    no transformers model module that could read it. None where the code may read it (or there is no own code)."""
    if not ckpt.sources:
        return None
    for file, text in ckpt.sources.items():
        if any(word in text for word in ROPE_CONFIG_WORDS):
            return None
        tree = sourcecode.parse(text)
        if tree is None or any(
                isinstance(n, ast.ImportFrom) and (n.module or "").startswith("transformers.models")
                or isinstance(n, ast.Import) and any(a.name.startswith("transformers.models") for a in n.names)
                for n in ast.walk(tree)):
            return None
    if "rope_theta" in configreads.config_reads(dict(ckpt.sources)):
        return None
    return (f"{THETA_UNREAD} ({ckpt.config['rope_theta']!r}: no file of it, {', '.join(sorted(ckpt.sources))}, "
            "names rope_theta, rope_parameters or transformers' rope helpers)")


def _rotary_built(sources: dict[str, str]) -> tuple[str, ast.ClassDef, ast.FunctionDef, list[ast.Call]] | None:
    """(file, the rotary class, its __init__, the calls of the owner's __init__ that build it as its attribute), where
    the sources hold a rotary module built so (rotaryfreq.rotary_class); None otherwise."""
    found = rotaryfreq.rotary_class(sources)
    if found is None:
        return None
    file, cls, attr, owner = found
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    owner_init = next((f for f in owner.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    if init is None or owner_init is None:
        return None
    builds = [n.value for n in ast.walk(owner_init) if isinstance(n, ast.Assign) and len(n.targets) == 1
              and ast.unparse(n.targets[0]) == f"self.{attr}" and isinstance(n.value, ast.Call)]
    return file, cls, init, builds


def _default_base(sources: dict[str, str]) -> tuple[float, Source] | None:
    """(base, source) where the rotary module's class takes its base as an __init__ parameter with a numeric default
    (`def __init__(self, dim, max_position_embeddings=2048, base=10000, device=None)`), raises it to a power there
    (`base ** (torch.arange(0, dim, 2) / dim)`), and the one call building it passes no value for it."""
    built = _rotary_built(sources)
    if built is None:
        return None
    file, cls, init, builds = built
    if len(builds) != 1 or any(isinstance(a, ast.Starred) for a in builds[0].args) \
            or any(k.arg is None for k in builds[0].keywords):
        return None
    params = [a.arg for a in init.args.args][1:]
    defaults = dict(zip(params[len(params) - len(init.args.defaults):], init.args.defaults))
    powered = {ast.unparse(n.left) for n in ast.walk(init) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow)}
    for index, name in enumerate(params):
        if not re.fullmatch(r"(rope_|rotary_)?(base|theta)", name) or not ({name, f"self.{name}"} & powered):
            continue
        given = index < len(builds[0].args) or any(k.arg == name for k in builds[0].keywords)
        value = defaults.get(name)
        if given or not (isinstance(value, ast.Constant) and isinstance(value.value, (int, float))
                         and not isinstance(value.value, bool) and value.value > 0):
            return None
        return float(value.value), Source("code", f"{file}:{builds[0].lineno}: {cls.name}(...) is built without its "
                                                  f"{name}, whose default is {value.value} ({file}:{init.lineno})")
    return None


def _passed_base(sources: dict[str, str]) -> codekeys.CodeExpr | None:
    """config.K where the one call building the rotary module passes it for the __init__ parameter the class raises
    to a power (`inv_freq = 1.0 / (freq_constant ** (torch.arange(0, dim, 2) / dim))`), whatever that parameter is
    called (OpenELM's `OpenELMRotaryEmbedding(..., freq_constant=config.rope_freq_constant)`)."""
    built = _rotary_built(sources)
    if built is None:
        return None
    file, cls, init, builds = built
    if len(builds) != 1:
        return None
    params = [a.arg for a in init.args.args][1:]
    powered = {ast.unparse(n.left) for n in ast.walk(init) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow)}
    bases = [(i, name) for i, name in enumerate(params) if {name, f"self.{name}"} & powered]
    if len(bases) != 1:
        return None
    index, name = bases[0]
    call = builds[0]
    given = call.args[index] if index < len(call.args) and not any(
        isinstance(a, ast.Starred) for a in call.args[:index + 1]) else next(
        (k.value for k in call.keywords if k.arg == name), None)
    if isinstance(given, ast.Attribute) and codekeys._is_config(given.value):
        return codekeys.CodeExpr(f"config.{given.attr}", (given.attr,), file, call.lineno)
    return None


def _base_key(ckpt: Checkpoint) -> codekeys.CodeExpr | None:
    """The config key the code passes as the rotary base (`base=config.rotary_emb_base`), if one, present."""
    sources = codekeys.code_sources(ckpt)
    found = {f.expr: f for word in ("base", "theta", "rope_theta") for f in codekeys.keyword_reads(sources, word)
             if len(f.keys) == 1 and f.expr == f"config.{f.keys[0]}"}
    if not found:
        # Kept on the module first (`self.theta = config.theta`, `self.base = config.rotary_base`), then used.
        for file, _cls, _func, attr, value in codekeys.self_assignments(sources):
            key = value.attr if isinstance(value, ast.Attribute) and codekeys._is_config(value.value) else None
            if key and (re.fullmatch(r"(rope_|rotary_)?(theta|base)", attr) or re.search(r"theta|rot\w*_base", key)):
                found.setdefault(f"config.{key}", codekeys.CodeExpr(f"config.{key}", (key,), file, value.lineno))
    if not found and (passed := _passed_base(sources)) is not None:
        found[passed.expr] = passed
    if len(found) != 1:
        return None
    base = next(iter(found.values()))
    value = ckpt.config.get(base.keys[0])
    return base if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _stored_frequencies(ckpt: Checkpoint, spec: Spec) -> tuple[str, int] | None:
    """A stored rotary inv_freq buffer (one frequency per rotated pair) whose length says how many head dims
    rotate: chatglm rotates the first half of each head."""
    found = {(n, info.shape[0]) for n in spec.skipped_tensors
             if n.endswith(".inv_freq") and len((info := ckpt.tensors[n]).shape) == 1}
    if len(found) != 1:
        return None
    name, count = next(iter(found))
    return (name, count) if 0 < 2 * count <= spec.head_dim else None


def _adjacent_pairs(sources: dict[str, str]) -> Found | None:
    """Where a rotary function (its name says rotary or rotate) pairs adjacent channels: `x.reshape(..., 2)`, or
    the even and the odd channels taken apart (`x[..., ::2]`, GPT-J's rotate_every_two)."""
    for name, node in walk(sources):
        if isinstance(node, ast.FunctionDef) and re.search("rotary|rotate", node.name.lower()):
            found = _pairs_in(name, node)
            if found is not None:
                return found
    return None


def _pairs_in(file: str, function: ast.FunctionDef) -> Found | None:
    for sub in subtree(function):
        if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
                and sub.func.attr in ("reshape", "view") and len(sub.args) > 1
                and isinstance(sub.args[-1], ast.Constant) and sub.args[-1].value == 2):
            return Found("gptj", file, sub.lineno)
        if (isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Tuple) and sub.slice.elts
                and isinstance(last := sub.slice.elts[-1], ast.Slice) and last.upper is None
                and isinstance(last.step, ast.Constant) and last.step.value == 2):
            return Found("gptj", file, sub.lineno)
    return None


def _attention_pairs(sources: dict[str, str], spec: Spec) -> Found | None:
    """Where a file keeps both forms and no config flag picks one (DeepSeek-V3.2's: rotate_half for its indexer,
    which the port does not compute, adjacent pairs for the attention): the rotary function the attention's own
    forward calls, where it is the one it calls and pairs adjacent channels."""
    layers = spec.names.get("layers") if isinstance(spec.names, dict) else None
    attention = blocks.layer_module_class(sources, layers.rsplit(".", 1)[-1] if layers else None,
                                          spec.names.get("self_attn", "self_attn")) if sources else None
    classes = {n.name: (file, n) for file, n in walk(sources) if isinstance(n, ast.ClassDef)}
    functions = {n.name: (file, n) for file, tree in ((f, sourcecode.parse(t)) for f, t in sources.items())
                 if tree is not None for n in tree.body if isinstance(n, ast.FunctionDef)}
    if attention not in classes:
        return None
    forward = next((n for n in classes[attention][1].body if isinstance(n, ast.FunctionDef) and n.name == "forward"),
                   None)
    called = {n.func.id for n in subtree(forward) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
              and n.func.id in functions and re.search("rotary|rotate|rope", n.func.id.lower())} if forward else set()
    if len(called) != 1:
        return None
    file, function = functions[called.pop()]
    return _pairs_in(file, function)


def _reversed_rotation(sources: dict[str, str]) -> Found | None:
    """Where the code rotates by -theta: the two halves swapped with the second negated, cat((x2, -x1))
    (NanoChat's rotate_half), not cat((-x2, x1)). Read in a function whose name says rot (rotate_half, a nested
    `rot`) where the halves are names or slices, and in any function where they are slices of one tensor
    (`torch.cat([x[..., d:], -x[..., :d]], -1)` inline); the negation `-x` or `x * -1`."""
    for name, node in walk(sources):
        if not isinstance(node, ast.FunctionDef):
            continue
        named = "rot" in node.name.lower()
        for call in subtree(node):
            func = (call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
                    ) if isinstance(call, ast.Call) else ""
            if not (func in ("cat", "concat", "concatenate", "stack") and call.args
                    and isinstance(parts := call.args[0], (ast.Tuple, ast.List)) and len(parts.elts) == 2
                    and not _negated(parts.elts[0]) and _negated(parts.elts[1])):
                continue
            first, second = parts.elts[0], _plain(parts.elts[1])
            if (named and all(isinstance(p, (ast.Name, ast.Subscript)) for p in (first, second))
                    or all(isinstance(p, ast.Subscript) for p in (first, second))
                    and ast.unparse(first.value) == ast.unparse(second.value)):
                return Found(node.name, name, call.lineno)
    return None


def _negated(node: ast.AST) -> bool:
    """-x, or x * -1 / -1 * x."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return True
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)
            and any(isinstance(s, ast.UnaryOp) and isinstance(s.op, ast.USub) and isinstance(s.operand, ast.Constant)
                    and s.operand.value == 1 or isinstance(s, ast.Constant) and s.value == -1
                    for s in (node.left, node.right)))


def _plain(node: ast.AST) -> ast.AST:
    """The operand of a negation."""
    if isinstance(node, ast.UnaryOp):
        return node.operand
    if isinstance(node, ast.BinOp):
        return node.left if not isinstance(node.left, (ast.UnaryOp, ast.Constant)) else node.right
    return node


def _defines(sources: dict[str, str], function: str) -> bool:
    return any(isinstance(node, ast.FunctionDef) and node.name == function for _, node in walk(sources))


def _rotary_dim_key(ckpt: Checkpoint, spec: Spec) -> tuple[codekeys.CodeExpr, int] | None:
    """A count of rotated head dims under a config key the code keeps on a module (GPT-J's
    `self.rotary_dim = config.rotary_dim`), with its value, when it is less than the head."""
    found = {}
    for file, _cls, _func, attr, value in codekeys.self_assignments(modeling_sources(ckpt)):
        key = value.attr if isinstance(value, ast.Attribute) and codekeys._is_config(value.value) else None
        if key and re.search(r"rot\w*_(dim|ndims)$", attr) and re.search(r"rot\w*_(dim|ndims)$", key):
            found.setdefault(key, codekeys.CodeExpr(f"config.{key}", (key,), file, value.lineno))
    if len(found) != 1:
        return None
    key, expr = next(iter(found.items()))
    dims = ckpt.config.get(key)
    if isinstance(dims, bool) or not isinstance(dims, int) or not 0 < dims < spec.head_dim or dims % 2:
        return None
    return expr, dims
