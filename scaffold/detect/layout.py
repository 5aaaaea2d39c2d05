"""Tensor layout: module names, which projections are fused, the block, the norms, biases, ties.

The tensors are the ground truth here; config flags such as attention_bias only
say what the author meant. Which module inside a decoder layer plays which role
(q, k, v and how a fused q/k/v output is cut, the gate, up and down projections,
the norm before each sublayer) is read from what the layer's code computes
(scaffold.detect.dataflow: the checkpoint's own code, else transformers' modeling
file, parsed as text) and confirmed by the tensors; the table of known names
(CANDIDATES) decides only where there is no source or the code does not say.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace

from scaffold.checkpoint import MASK_DTYPES, Checkpoint, _short_list
from scaffold.detect import (
    altup,
    blocks,
    codekeys,
    dataflow,
    differential,
    formcode,
    forms,
    gatednorm,
    handoff,
    headsizes,
    headtransform,
    hyperconn,
    identitynorm,
    keybias,
    kvpairs,
    kvshare,
    latent,
    layerinputs,
    moa,
    moe,
    outbias,
    parallelmoe,
    policy,
    positions,
    renamings,
    subconfigs,
    submodules,
    temperature,
)
from scaffold.detect.activations import transformers_activations, vllm_registry
from scaffold.detect.common import BACKEND_HINT
from scaffold.detect.common import unsupported as _unsupported
from scaffold.detect.linears import built_with, linear_classes
from scaffold.detect.sourcecode import (
    _classes,
    _dotted,
    added_to_call,
    configured,
    interleaved_qkv,
    modeling_sources,
    norm_code,
    ruled_out,
    subtree,
    walk,
    weightless_norms,
)
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.spec import (
    GATE_ACTIVATIONS,
    PER_LAYER_INPUT_LAYER_ROLES,
    PER_LAYER_INPUT_MODEL_ROLES,
    Source,
    Spec,
    Undetermined,
    Unknown,
    attention_module,
)

# Tensor names that mean an architecture this generator cannot express.
UNSUPPORTED_MARKERS = (
    (re.compile(r"\.(mamba|ssm|mixer)\.|\.A_log$|\.dt_bias$|\.conv1d\."), "state-space (Mamba-style) blocks"),
    (re.compile(r"\.linear_attn\.|\.(recurrent|rwkv|time_mix)\w*\."), "linear or recurrent attention"),
)



# Module names a role goes by in the checkpoints the generator knows (first match wins).
CANDIDATES = {
    "self_attn": ("self_attn", "attention", "self_attention"),
    "qkv_proj": ("qkv_proj", "query_key_value", "W_pack"),
    "o_proj": ("o_proj", "dense"),
    "mlp": ("mlp",),
    "plain_up": ("c_fc", "dense_h_to_4h", "up_proj"),
    "down_proj": ("down_proj", "c_proj", "dense_4h_to_h"),
}
# The q/k norms' names where the attention's code does not name them (first pair present wins).
QK_NORM_HINTS = (("q_norm", "k_norm"), ("q_layernorm", "k_layernorm"), ("query_layernorm", "key_layernorm"))
# An attention whose projections sit inside a second module (GPT-Neo's attn.attention.q_proj), where no modeling
# code shows the wrapper that hands on to them (with code, dataflow reads the wrapper: names.attn_inner).
NESTED_ATTENTION = re.compile(r"\w+\.\w+\.(q_proj|k_proj|v_proj|qkv_proj|c_attn|query_key_value)\.weight\Z")
NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")




def layer_list(ckpt: Checkpoint, code: dict[str, str]) -> tuple[str, str]:
    """(base model prefix, path of the layer list under it): the one repeated numbered block of tensors,
    PREFIX.PATH.N.rest for any dotted PATH (model.layers, transformer.h, transformer.encoder.layers), confirmed
    by the code's `nn.ModuleList([...])` where the checkpoint ships its modeling source."""
    where = ckpt.config_file
    blocks: dict[str, int] = {}
    for name in ckpt.tensors:
        parts = name.split(".")
        # The first numbered component: an expert list inside a layer is part of that layer.
        index = next((i for i, p in enumerate(parts[:-1]) if i and p.isascii() and p.isdigit()), None)
        if index is not None:
            path = ".".join(parts[:index])
            blocks[path] = blocks.get(path, 0) + 1
    paths = sorted(p for p in blocks if "." in p)  # PREFIX.PATH: the base model holds the list
    built = {layers.attribute for layers in codekeys.layer_lists(code)}
    if len(paths) > 1 and built:
        paths = [p for p in paths if p.rsplit(".", 1)[-1] in built] or paths
    if len(paths) != 1:
        sample = ", ".join(sorted(ckpt.tensors)[:4])
        raise UnsupportedArchitecture(
            "the tensors do not follow a decoder layout the generator knows (PREFIX.PATH.N....); "
            f"found {'layer lists under ' + ', '.join(paths) if paths else 'no layer list'}, e.g. {sample}.",
            where,
        )
    prefix, layers = paths[0].split(".", 1)
    if built and layers.rsplit(".", 1)[-1] not in built:
        raise UnsupportedArchitecture(
            f"the tensors' numbered block is {paths[0]}.N but the modeling source builds its layer list as "
            f"{', '.join(sorted('self.' + b for b in built))} (nn.ModuleList); refusing to guess which is the "
            "decoder.", where)
    return prefix, layers


def _per_layer_inputs(ckpt: Checkpoint, spec: Spec, names: dict, prefix: str, top: dict):
    """Per-layer input embeddings as the port computes them (scaffold.detect.layerinputs.read; the policy refused
    any other form): their modules under names.per_layer_input_*, their sizes, scales and activation; their
    top-level tensors taken out of `top`. None where the model has none."""
    sources = modeling_sources(ckpt)
    stacked = altup.read(sources, ckpt.config, ckpt.tensors) if spec.altup_num_inputs else None
    form = layerinputs.read(sources, ckpt.config, ckpt.tensors, stacked)
    if form is None:
        spec.set("per_layer_input_size", 0, Source("default", "no per-layer input embeddings"))
        return None
    where = ckpt.config_file
    for role, attr in zip((*PER_LAYER_INPUT_MODEL_ROLES, *PER_LAYER_INPUT_LAYER_ROLES),
                          (form.table, form.model_projection, form.projection_norm, form.gate, form.projection,
                           form.post_norm)):
        names[role] = attr
    table = ckpt.tensors.get(f"{prefix}.{form.table}.weight")
    if table is None or len(table.shape) != 2 or table.shape[1] % spec.num_layers:
        raise _unsupported(f"per-layer input embeddings whose table {prefix}.{form.table} the checkpoint does not hold "
                           f"as [rows, {spec.num_layers} x width]", where, spec.model_type)
    width, rows = table.shape[1] // spec.num_layers, table.shape[0]
    keyed = {k: v for k, v in ckpt.config.items() if isinstance(v, int) and not isinstance(v, bool)}
    size_key = next((k for k in ("hidden_size_per_layer_input",) if keyed.get(k) == width), None) or next(
        (k for k, v in keyed.items() if v == width and "per_layer" in k), None)
    vocab_key = next((k for k in ("vocab_size_per_layer_input",) if keyed.get(k) == rows), None)
    spec.set("per_layer_input_size", width,
             Source("tensor", f"{prefix}.{form.table}.weight: {spec.num_layers} x {width} wide ({form.evidence})",
                    f"config.{size_key}" if size_key else None))
    spec.set("per_layer_input_vocab", rows, Source("tensor", f"{prefix}.{form.table}.weight: {rows} rows",
                                                   f"config.{vocab_key}" if vocab_key else None))
    for field, const, what in (("per_layer_input_table_scale", form.table_scale, f"{form.table}'s lookup"),
                               ("per_layer_input_model_scale", form.model_scale, f"{form.model_projection}'s output"),
                               ("per_layer_input_scale", form.input_scale, "the sum")):
        spec.set(field, const.value, Source("code", f"{form.found.call_where}: {what} times {const.value:.6g}",
                                            const.expr if const.expr and "config." in const.expr else None))
    act = form.act.lower()
    registry = vllm_registry()
    if registry is not None and act not in registry.plain:
        raise _unsupported(f"per-layer input gate activation {form.act!r} is not in vLLM's activation registry", where,
                           spec.model_type)
    spec.set("per_layer_input_act", act, Source("config" if form.act_expr else "code",
                                                f"config.json {form.act_expr}" if form.act_expr
                                                else f"{form.evidence}: ACT2FN[{form.act!r}]"))
    # The table, the projection and its norm are the port's, not the token embedding's or the final norm.
    for attr in (form.table, form.model_projection, form.projection_norm):
        for n in [n for n in top if n.startswith(f"{prefix}.{attr}.")]:
            del top[n]
    return form


def top_modules(ckpt: Checkpoint, spec: Spec, prefix: str, top: dict, inside: dict,
                 code: dict[str, str]) -> tuple[str, str, str]:
    """The embedding and final norm (module paths under `prefix`) and the head (from the root).

    Most checkpoints keep the embedding and the final norm directly under the base model and the head beside
    it. Where the code says otherwise (chatglm's transformer.embedding.word_embeddings, its head
    transformer.output_layer inside the base model), they are found anywhere in the tree, by the module
    class the code builds them with (nn.Embedding, nn.Linear) and the final norm's shape.
    """
    where = ckpt.config_file
    hidden = spec.hidden_size
    kinds = codekeys.module_kinds(code)

    def module(name: str) -> str:
        return name.rsplit(".", 1)[0]

    def built_as(path: str, kind: str) -> bool:
        return kind in kinds.get(path.rsplit(".", 1)[-1], ())

    shallow = {n: i for n, i in inside.items() if n.count(".") == 1}
    if not code and not (sum(1 for n, i in shallow.items() if n.endswith(".weight") and len(i.shape) == 2) == 1):
        # Not the usual layout: transformers' modeling file says where the modules are (OPT's model.decoder).
        code = modeling_sources(ckpt)
        kinds = codekeys.module_kinds(code)
    embeds = sorted(module(n) for n, i in shallow.items() if n.endswith(".weight") and len(i.shape) == 2)
    norms = sorted(module(n) for n, i in shallow.items() if n.endswith(".weight") and i.shape == (hidden,))
    heads = sorted(module(n) for n, i in top.items()
                   if n.count(".") == 1 and n.endswith(".weight") and len(i.shape) == 2)
    flat = len(embeds) == 1 and len(norms) == 1 and len(heads) <= 1
    # The usual layout stands unless it does not fit or the code builds that "embedding" as something else.
    contradicted = flat and embeds[0] in kinds and not built_as(embeds[0], "Embedding")
    if code and (not flat or contradicted):
        matrices = sorted(module(n) for n, i in top.items() if n.endswith(".weight") and len(i.shape) == 2)
        embeds = [m[len(prefix) + 1:] for m in matrices if m.startswith(prefix + ".") and built_as(m, "Embedding")]
        heads = [m for m in matrices if not built_as(m, "Embedding") and (built_as(m, "Linear") or "." not in m)]
        norms = sorted(module(n) for n, i in inside.items() if n.endswith(".weight") and i.shape == (hidden,))
        where_text = f"under {prefix!r} (built with nn.Embedding in the modeling source)"
    else:
        where_text = f"directly under {prefix!r}"
    if len(embeds) != 1:
        raise UnsupportedArchitecture(f"expected one embedding matrix {where_text}, found {embeds or 'none'}.",
                                      where)
    if not norms:
        # A final norm with no parameter (OLMo's): the one such norm the class holding the layer list builds.
        source = code or modeling_sources(ckpt)
        owners = {ll.owner for ll in codekeys.layer_lists(source)}
        weightless = weightless_norms(source)
        norms = sorted({attr for _f, cls, _fn, attr, value in codekeys.self_assignments(source)
                        if cls.name in owners and isinstance(value, ast.Call)
                        and codekeys.callee(value) in weightless})
    if not norms and _no_final_norm(code or modeling_sources(ckpt), ckpt.config):
        return embeds[0], None, (heads[0] if heads else "lm_head"), None, None
    embed_norm = None
    if len(norms) == 2:
        # A norm of its own on the embeddings (BLOOM's word_embeddings_layernorm): the one the base model's
        # forward applies before its layers; the other is the final norm.
        before = _norms_before_layers(code or modeling_sources(ckpt), {n.rsplit(".", 1)[-1] for n in norms})
        if len(before) == 1:
            embed_norm = next(n for n in norms if n.rsplit(".", 1)[-1] == before[0][0])
            norms = [n for n in norms if n != embed_norm]
        elif not before:
            # Or a norm inside the module that embeds the tokens (ModernBERT-decoder's embeddings.norm), which the
            # base model calls before its layers.
            inner = [path for path, _file, _line in _embedding_module_norms(code or modeling_sources(ckpt))
                     if path in norms]
            if len(inner) == 1:
                embed_norm = inner[0]
                norms = [n for n in norms if n != embed_norm]
    if len(norms) != 1:
        raise UnsupportedArchitecture(f"expected one final norm {where_text.split(' (')[0]}, found "
                                      f"{norms or 'none'}.", where)
    transform = None
    if len(heads) > 1 or any("." in h for h in heads):
        # A transform before the head (ModernBERT-decoder's prediction head): its own linear map is no head, and
        # the head it feeds may be tied to the embedding (no tensor of its own).
        transform = headtransform.find(code or modeling_sources(ckpt), None, ckpt.config)  # Refused: by name
        if transform is not None:
            heads = [h for h in heads if not h.startswith(transform.module + ".")] or [transform.head]
    if len(heads) > 1:
        raise UnsupportedArchitecture(f"expected at most one output head beside {prefix!r}, found {heads}.", where)
    head = heads[0] if heads else "lm_head"
    attributes = [embeds[0].rsplit(".", 1)[-1], norms[0].rsplit(".", 1)[-1]]
    if embed_norm is not None:
        attributes.append(embed_norm.rsplit(".", 1)[-1])
    if len(set(attributes)) != len(attributes) or head.rsplit(".", 1)[-1] == prefix:
        raise UnsupportedArchitecture(f"the embedding {embeds[0]!r}, final norm {norms[0]!r}"
                                      f"{f', embedding norm {embed_norm!r}' if embed_norm else ''} and head {head!r} "
                                      "end in the same name; the port names its modules after their last "
                                      "component.", where)
    return embeds[0], norms[0], head, embed_norm, transform


def _no_final_norm(sources: dict, config: dict | None = None) -> str:
    """FILE:LINE where the forward of the one class holding the layer list ends its loop over the layers and
    then calls no module of its own, and that class builds no norm (GPT-1's OpenAIGPTModel: the last layer's
    output is the model's), or builds it only in a branch config.json rules out (OPT-350m's
    `if config.do_layer_norm_before ...: self.final_layer_norm = ... else: None`); "" where the code does not
    say so."""
    lists = codekeys.layer_lists(sources)
    if len({(ll.owner, ll.attribute) for ll in lists}) != 1:
        return ""
    ll = lists[0]
    owners = {id(c): c for _f, c, _fn in codekeys.methods(sources) if c.name == ll.owner}
    off = {i for c in owners.values() for i in ruled_out(c, config)}
    built = [(a, v) for _f, c, _fn, a, v in codekeys.self_assignments(sources)
             if c.name == ll.owner and id(v) not in off]
    if any(isinstance(v, ast.Call) and "norm" in codekeys.callee(v).lower() for _a, v in built):
        return ""
    modules = {a for a, v in built if isinstance(v, ast.Call)}
    forwards = [(file, func) for file, cls, func in codekeys.methods(sources)
                if cls.name == ll.owner and func.name == "forward"]
    if len(forwards) != 1:
        return ""
    file, func = forwards[0]
    loops = [n for n in subtree(func) if isinstance(n, ast.For) and f"self.{ll.attribute}" in ast.unparse(n.iter)]
    if len(loops) != 1:
        return ""
    end = loops[0].end_lineno
    after = [n for n in subtree(func) if isinstance(n, ast.Call) and n.lineno > end
             and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
             and n.func.value.id == "self" and n.func.attr in modules]
    if after:
        return ""
    return f"{file}:{end}: {ll.owner}.forward calls none of its modules after its loop over self.{ll.attribute}"


def _norms_before_layers(sources: dict, candidates, layers: str | None = None,
                         config: dict | None = None) -> list[tuple[str, str, int]]:
    """(attribute, file, line) of each norm the forward of the class holding the layer list (`layers`, any when
    None) calls on self before its loop over the layers: a norm applied to the embeddings. `candidates`: the
    attributes to look for, or a function of the class holding the layer list that gives them. With `config`, a
    call in a branch config.json rules out does not count (TeleChat's `if self.config.embed_layernorm:` with
    embed_layernorm false)."""
    found = []
    for ll in codekeys.layer_lists(sources):
        if layers is not None and ll.attribute != layers:
            continue
        wanted = candidates(ll) if callable(candidates) else candidates
        for file, cls, func in codekeys.methods(sources):
            if cls.name != ll.owner or func.name != "forward":
                continue
            loops = [n.lineno for n in subtree(func) if isinstance(n, ast.For)
                     and f"self.{ll.attribute}" in ast.unparse(n.iter)]
            if not loops:
                continue
            off = ruled_out(cls, config)
            found += [(n.func.attr, file, n.lineno) for n in subtree(func) if isinstance(n, ast.Call)
                      and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                      and n.func.value.id == "self" and n.func.attr in wanted and n.lineno < min(loops)
                      and id(n) not in off]
    return sorted(set(found), key=lambda f: (f[2], f[0], f[1]))


def _embedding_module_norms(sources: dict, layers: str | None = None) -> list[tuple[str, str, int]]:
    """(MODULE.NORM, file, line) where the forward of the class holding the layer list calls `self.MODULE(...)`
    before its loop over the layers, MODULE's class builds the token embedding (nn.Embedding), and its forward
    returns what `self.NORM` makes of it: a norm on the embeddings inside the module that embeds the tokens
    (ModernBERT-decoder's `self.drop(self.norm(self.tok_embeddings(input_ids)))`)."""
    classes = _classes(sources)
    built = {(c.name, a): v for _f, c, fn, a, v in codekeys.self_assignments(sources) if fn.name == "__init__"}
    found = []
    for ll in codekeys.layer_lists(sources):
        if layers is not None and ll.attribute != layers:
            continue
        for attr, _file, _line in _calls_before_layers(sources, ll):
            value = built.get((ll.owner, attr))
            if not isinstance(value, ast.Call) or codekeys.callee(value) not in classes:
                continue
            file, cls = classes[codekeys.callee(value)]
            own = {a: v for (c, a), v in built.items() if c == cls.name}
            if not any(isinstance(v, ast.Call) and codekeys.callee(v) == "Embedding" for v in own.values()):
                continue
            forward = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
            for node in subtree(forward) if forward is not None else ():
                # self.NORM(self.EMBED(...)), or self.NORM(x) after x = self.EMBED(...): the norm reads the token
                # embedding.
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and _dotted(node.func.value) == "self" and node.args
                        and "norm" in codekeys.callee(own.get(node.func.attr)).lower()):
                    continue
                arg = node.args[0]
                if isinstance(arg, ast.Name):
                    arg = headtransform.last_value(forward, arg.id, node.lineno)
                if (isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute)
                        and _dotted(arg.func.value) == "self" and codekeys.callee(own.get(arg.func.attr)) == "Embedding"):
                    found.append((f"{attr}.{node.func.attr}", file, node.lineno))
    return sorted(set(found), key=lambda f: (f[2], f[0], f[1]))


def _calls_before_layers(sources: dict, ll) -> list[tuple[str, str, int]]:
    """(attribute, file, line) of each `self.X(...)` the forward of the class holding the layer list `ll` calls
    before its loop over the layers."""
    found = []
    for file, cls, func in codekeys.methods(sources):
        if cls.name != ll.owner or func.name != "forward":
            continue
        loops = [n.lineno for n in subtree(func) if isinstance(n, ast.For)
                 and f"self.{ll.attribute}" in ast.unparse(n.iter)]
        if loops:
            found += [(n.func.attr, file, n.lineno) for n in subtree(func) if isinstance(n, ast.Call)
                      and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                      and n.func.value.id == "self" and n.lineno < min(loops)]
    return found


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    where = ckpt.config_file
    for pattern, feature in UNSUPPORTED_MARKERS:
        hits = sorted(n for n in ckpt.tensors if pattern.search(n))
        if hits and pattern is UNSUPPORTED_MARKERS[0][0]:
            hits = policy.not_code_attention(ckpt, hits)
        if hits:
            raise UnsupportedArchitecture(
                f"the checkpoint uses {feature} (e.g. tensor {hits[0]!r}), which the generator cannot express "
                "yet.",
                where,
                hint=BACKEND_HINT,
            )
    names: dict[str, str] = {}
    code = codekeys.code_sources(ckpt)
    try:
        prefix, layers_path = layer_list(ckpt, code)
    except UnsupportedArchitecture as exc:  # unknown, not refused: a spec file may name them
        raise Undetermined(*(Unknown(f"names.{role}", exc.problem.rstrip("."))
                             for role in ("model", "layers"))) from None
    names["model"], names["layers"] = prefix, layers_path
    tail = re.compile(rf"({re.escape(prefix)})\.{re.escape(layers_path)}\.(\d+)\.(.+)\Z")
    matches = {n: m for n in ckpt.tensors if (m := tail.match(n))}  # the tensors inside decoder layers
    layer_ids = {int(m.group(2)) for m in matches.values()}
    # Layers 0..num_layers-1, each present, compared without building that range (the count is untrusted).
    if len(layer_ids) != spec.num_layers or min(layer_ids) != 0 or max(layer_ids) != spec.num_layers - 1:
        raise CheckpointError(
            f"config.json says {spec.num_layers} layers but the tensors hold layers "
            f"{min(layer_ids)}..{max(layer_ids)} ({len(layer_ids)} of them).",
            where,
        )

    # Modules a layer runs only on an encoder's states (cross-attention), whose tensors the checkpoint holds: the
    # decoder half of an encoder-decoder (TrOCR's encoder_attn, built because its causal-LM class sets
    # config.is_decoder). A port would drop them; refused by name.
    layer0_names = {m.group(3) for m in matches.values() if m.group(2) == "0"}
    held = {attr: why for attr, why in dataflow.encoder_only_modules(modeling_sources(ckpt),
                                                                     layers_path.rsplit(".", 1)[-1]).items()
            if any(n.startswith(attr + ".") for n in layer0_names)}
    if held:
        attr, why = next(iter(held.items()))
        raise _unsupported(f"cross-attention to an encoder's states in every layer ({', '.join(held)}: {why}), "
                           f"whose tensors the checkpoint holds (e.g. {prefix}.{layers_path}.0.{attr}.*): the "
                           "decoder half of an encoder-decoder", where, spec.model_type)
    # Top level: the embedding, the final norm and the head, wherever the tree holds them.
    vocab = spec.vocab_size
    # Buffers the code registers and saves with the weights; inside the layers only boolean ones (a CodeGen-style
    # attn.causal_mask), which no weight of a port can be.
    skipped = sorted(codekeys.stored_buffers(code, [n for n, info in ckpt.tensors.items()
                                                    if n not in matches or info.dtype in MASK_DTYPES]))
    matches = {n: m for n, m in matches.items() if n not in skipped}
    top = {n: info for n, info in ckpt.tensors.items() if n not in matches and n not in skipped}
    # GPT-2 layouts: the learned position table is an embedding too, but not the token embedding.
    positions_table = _position_table(ckpt, spec, prefix, top)
    if positions_table is not None:
        names["embed_positions"] = positions_table
        del top[f"{prefix}.{positions_table}.weight"]
    # Per-layer input embeddings (Gemma 4's PLE): their table, projection and norm are not the token embedding's.
    per_layer_inputs = _per_layer_inputs(ckpt, spec, names, prefix, top)
    inside = {n[len(prefix) + 1:]: i for n, i in top.items() if n.startswith(prefix + ".")}
    try:
        embed, norm, head, embed_norm, transform = top_modules(ckpt, spec, prefix, top, inside, code)
    except headtransform.Refused as exc:  # a form the code shows and the port cannot compute: refused, not unknown
        raise _unsupported(f"a transform of the final hidden states before the head: {exc}", where,
                           spec.model_type) from None
    except UnsupportedArchitecture as exc:
        raise Undetermined(*(Unknown(f"names.{role}", exc.problem.rstrip("."))
                             for role in ("embed_tokens", "norm", "lm_head"))) from None
    names["embed_tokens"] = embed
    no_final_norm = _no_final_norm(code or modeling_sources(ckpt), ckpt.config) if norm is None else ""
    if norm is not None:  # None: the base model applies no final norm (GPT-1's)
        names["norm"] = norm
    names["lm_head"] = head
    if embed_norm is not None:
        names["embed_norm"] = embed_norm
    if transform is not None:
        _head_transform(ckpt, spec, names, transform)
        head_norm_built = transform.norm_built
    spec.set("skipped_tensors", skipped,
             Source("code", "buffers the code registers (register_buffer), recomputed by the port") if skipped
             else Source("default", "the checkpoint stores no buffers"))
    embed_name, head_name = f"{prefix}.{embed}.weight", f"{head}.weight"

    # Layer 0: which module plays which role.
    per_layer: dict[int, dict] = {i: {} for i in layer_ids}
    for n, m in matches.items():
        per_layer[int(m.group(2))][m.group(3)] = ckpt.tensors[n]
    layer0 = per_layer[0]

    def has(rest: str, tensors: dict = layer0) -> bool:
        return rest in tensors

    def src(rest: str, layer: int = 0) -> Source:
        return Source("tensor", f"{prefix}.{names['layers']}.{layer}.{rest}")

    def first(role: str, inside_of: str = "", tensors: dict = layer0) -> str | None:
        for cand in CANDIDATES[role]:
            path = f"{inside_of}.{cand}" if inside_of else cand
            if has(f"{path}.weight", tensors) or any(r.startswith(path + ".") for r in tensors):
                return cand
        return None

    # The roles come from what the layer's code computes (scaffold.detect.dataflow); the
    # name table CANDIDATES is a hint for checkpoints without source, or where the code
    # does not decide.
    sources = modeling_sources(ckpt)
    gated_inner = _gated_norms(ckpt, spec, names, sources, per_layer, f"{prefix}.{names['layers']}", where)
    weightless = weightless_norm_attributes(sources)  # norms no tensor can show: the code alone says they exist
    identities = _identity_norms(sources, ckpt, spec, names["layers"], per_layer, weightless)
    streams_modules = frozenset(m for m in (spec.altup_module, spec.laurel_module) if m)  # read by altup.view
    flow = _layer_flow(sources, ckpt, names["layers"], layer0, weightless, identities, streams_modules)
    if "attn_norm" in identities:
        found = identities["attn_norm"]
        spec.set("unnormed_attn_layers", found.layers, Source("code", found.evidence))
    # The norms' tensors as a layer that builds them all holds them.
    norm_ref = next(i for i in sorted(per_layer) if all(i not in f.layers for f in identities.values()))
    code_attn = flow.attention_flow if flow is not None else None
    if sources and (branches := dataflow.attention_layer_branches(sources, ckpt.config,
                                                                 names["layers"].rsplit(".", 1)[-1])):
        # Gemma 4's KV-shared layers (keys and values of an earlier layer) and keys reused as values (k_eq_v): read
        # layer by layer (kvshare.py); any other difference between the layers stays refused.
        found = kvshare.read(sources, ckpt.config, names["layers"].rsplit(".", 1)[-1])
        if not isinstance(found, kvshare.LayerSources):
            raise _unsupported(f"attention that computes differently from layer to layer: {branches}"
                               f"{f' ({found})' if found else ''}; the port builds every layer's attention alike",
                               where, spec.model_type)
        _layer_sources(ckpt, spec, found)
    if sources and not spec.kv_share_layers:
        # Cross-layer attention (Hunyuan-Large's CLA): keys and values a layer hands later layers through the
        # model's loop, read layer by layer (handoff.py).
        attn_path = flow.attention_path if flow is not None else None
        found = handoff.read(sources, ckpt.config, names["layers"].rsplit(".", 1)[-1],
                             lambda i, module: any(module in n.split(".")[:-1] and (
                                 attn_path is None or n.startswith(f"{attn_path}.")) for n in per_layer.get(i, {})))
        if isinstance(found, str):
            raise _unsupported(f"keys and values handed from layer to layer: {found}", where, spec.model_type)
        if found is not None:
            _layer_sources(ckpt, spec, found)

    # `attn`: the module holding the projections, as the checkpoint names it (attn.attention behind GPT-Neo's
    # wrapper, whose projections the port keeps on the wrapper's own module: names.attn_inner).
    attn = flow.attention_path if code_attn is not None else first("self_attn")
    if attn is None:
        nested = sorted(r for r in layer0 if NESTED_ATTENTION.match(r))
        if nested:  # attn.attention.q_proj without code that reads attn as a wrapper of attention
            raise _unsupported(f"layer 0's attention projections sit two modules deep ({nested[0]})", where,
                               spec.model_type)
        block = blocks.norm_attention_block(sources, names["layers"].rsplit(".", 1)[-1], layer0,
                                            configured(sources, ckpt.config)) if sources else None
        if block is not None:  # DBRX's norm_attn_norm: norms and the attention in one module around them
            raise _unsupported(block, where, spec.model_type)
        raise Undetermined(Unknown("names.self_attn", "layer 0 has no attention module the generator knows"
                                   f"{_undecided(flow)}",
                                   tuple((c, "no tensor of layer 0 under it") for c in CANDIDATES["self_attn"])))
    names["self_attn"] = attn
    if code_attn is not None and flow.attention_inner is not None:
        names["self_attn"], names["attn_inner"] = flow.attention, flow.attention_inner
    per_layer_read = _per_layer_attention_argument(sources, flow, flow.attention) if code_attn is not None else None
    read_heads = (attn.split(".")[0], per_layer_read.key) if per_layer_read is not None else None
    # The MLP's width per layer, read by detect.sizes (layer_intermediate_sizes) and checked by detect.mlp.
    widths = spec.source("layer_intermediate_sizes").expr if spec.layer_intermediate_sizes else None
    # The attention's heads per layer, read by detect.sizes where the attention reads them itself (OpenELM's).
    own_heads = {spec.source(f).expr for f in ("layer_num_heads", "layer_num_kv_heads") if getattr(spec, f)}
    for module, key, counts in policy.layer_sized_modules(ckpt):
        if widths in (key, f"config.{key}[layer_idx]") and counts == spec.layer_intermediate_sizes:
            continue
        if own_heads & {f"config.{key}", f"config.{key}[layer_idx]"} or (
                widths and f"config.{key}[layer_idx]" in widths):
            continue  # each layer's heads (layerheads) or MLP width (an expression over config.K[layer_idx])
        if len(set(counts)) > 1 and (module, key) != read_heads:
            # The policy check let this module's tensors differ between layers; only the attention's heads are read.
            read = f"config.{key}[layer_idx]" if key.isidentifier() else key  # a key, or the code's expression
            raise _unsupported(f"per-layer sizes: the code builds each layer's {module} with {read}, "
                               f"a value of its own for each layer ({_short_list(list(counts))}), and the port "
                               "builds it from one config value", where, spec.model_type)
    indexed = sorted(f"{prefix}.{names['layers']}.{i}.{n}" for i, tensors in per_layer.items() for n in tensors
                     if n.startswith(f"{attn}.indexer."))
    if indexed and not latent.present(layer0, attn):  # latent.detect names DeepSeek-V3.2's own
        # MiniMax-M3's sparse layers: a top-k token indexer inside the attention of some layers.
        raise _unsupported(f"sparse attention: a top-k token indexer ({indexed[0]}) chooses the keys each query "
                           "sees", where, spec.model_type)
    latent_modules: set[str] = set()
    try:  # JetMoE's mixture of attention heads: queries and output routed per token, keys and values shared
        routed = moa.read(sources, ckpt.config, layer0, attn) if sources and not latent.present(layer0, attn) \
            else None
    except moa.Refused as exc:
        raise _unsupported(f"routed attention (a mixture of attention heads): {exc}; the port computes JetMoE's "
                           "form only", where, spec.model_type) from None
    if routed is None and sources and not latent.present(layer0, attn) \
            and (found := forms.routed_attention(sources, ckpt.config)):
        # Routed per token, but not with the tensors moa reads under this attention module: not ported.
        raise _unsupported(f"{found} (not read under layer 0's {attn})", where, spec.model_type)
    if routed is not None:
        latent_modules = _routed_attention(ckpt, spec, names, routed, attn)
    elif latent.present(layer0, attn):  # DeepSeek-V2's multi-head latent attention
        latent_modules = latent.detect(ckpt, spec, names, attn, layer0, f"{prefix}.{names['layers']}.0.{attn}",
                                       code_attn.o if code_attn is not None and code_attn.o else first("o_proj", attn),
                                       sources, code_attn.cls if code_attn is not None else
                                       blocks.layer_module_class(sources, names["layers"].rsplit(".", 1)[-1], attn)
                                       if sources else None)
    elif code_attn is not None:
        _code_qkv(ckpt, spec, names, code_attn, f"{prefix}.{names['layers']}.0.{attn}", layer0)
    elif all(has(f"{attn}.{p}.weight") for p in ("q_proj", "k_proj", "v_proj")):
        names.update(q_proj="q_proj", k_proj="k_proj", v_proj="v_proj", qkv_proj="qkv_proj")
        spec.set("qkv_layout", "separate", src(f"{attn}.q_proj.weight"))
        qkv_bias = has(f"{attn}.q_proj.bias")
        spec.set("qkv_bias", qkv_bias, src(f"{attn}.q_proj.bias"))
    elif (fused := first("qkv_proj", attn)) is not None:
        names["qkv_proj"] = fused
        found = interleaved_qkv(sources, fused, ckpt.config)
        rows = layer0[f"{attn}.{fused}.weight"].shape[0] if has(f"{attn}.{fused}.weight") else None
        if (found is not None and found.value == "interleaved" and spec.num_kv_heads != spec.num_heads
                and rows == (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim):
            # Grouped KV heads cannot be stored per head; the per-head view is the code's other branch
            # (chatglm views per head only without multi_query_attention).
            found = None
        if found is not None and found.value == "grouped":
            spec.set("qkv_layout", "grouped",
                     Source("code", f"{found}: {fused} output viewed as [KV groups, heads // KV heads + 2, "
                                    "head_size]"))
            _grouped_rows(ckpt, spec, f"{prefix}.{names['layers']}.0.{attn}.{fused}.weight")
        elif found is not None:
            spec.set("qkv_layout", "interleaved",
                     Source("code", f"{found}: {fused} output viewed as [heads, 3 * head_size]"))
            _one_kv_head_per_head(ckpt, spec, f"{prefix}.{names['layers']}.0.{attn}.{fused}.weight")
        else:
            detail = "q, k, v rows one after another" + (
                "" if sources else " (no modeling source to say otherwise)")
            spec.set("qkv_layout", "fused",
                     Source("tensor", f"{prefix}.{names['layers']}.0.{attn}.{fused}.weight: {detail}"))
            _fused_kv_heads(ckpt, spec, f"{prefix}.{names['layers']}.0.{attn}.{fused}.weight")
        spec.set("qkv_bias", has(f"{attn}.{fused}.bias"), src(f"{attn}.{fused}.bias"))
    else:
        attn_cls = blocks.layer_module_class(sources, names["layers"].rsplit(".", 1)[-1], attn) if sources else None
        if attn_cls and (kv := _fused_kv_only(spec, layer0, attn, first("o_proj", attn), sources, attn_cls)):
            refusal, pairs = kv
            found = _kv_pairs(sources, ckpt.config, attn_cls, pairs)
            if found is None:
                raise _unsupported(refusal, where, spec.model_type)
            if isinstance(found, str):
                raise _unsupported(f"{refusal.split(';')[0]}: {found}", where, spec.model_type)
            _kv_pairs_layout(ckpt, spec, names, f"{prefix}.{names['layers']}.0.{attn}", *found)
            spec.set("qkv_bias", has(f"{attn}.{names['q_proj']}.bias") or has(f"{attn}.{names['kv_proj']}.bias"),
                     src(f"{attn}.{names['q_proj']}.bias"))
        else:
            raise Undetermined(Unknown("qkv_layout", f"layer 0's {attn} has no q_proj/k_proj/v_proj and no fused "
                                       f"q/k/v weight{_undecided(flow)}",
                                       (("q_proj, k_proj, v_proj", "not all present"),
                                        *((c, "absent") for c in CANDIDATES["qkv_proj"]))))
    if code_attn is not None and code_attn.qkv_clamp:
        _qkv_clip(spec, code_attn, bool(latent_modules), where)
    o_proj = code_attn.o if code_attn is not None and code_attn.o else first("o_proj", attn)
    if routed is not None:
        o_proj = "o_proj"  # no module: the output is the routed module's (names.moa_o_bank); named for the port
    if o_proj is None:
        raise Undetermined(Unknown("names.o_proj", f"layer 0's {attn} has no output projection the generator knows",
                                   tuple((c, "absent") for c in CANDIDATES["o_proj"])))
    names["o_proj"] = o_proj
    spec.set("o_bias", has(f"{attn}.{o_proj}.bias"), src(f"{attn}.{o_proj}.bias"))
    if per_layer_read is not None:
        _layer_heads(ckpt, spec, names, per_layer_read, per_layer, attn, f"{prefix}.{names['layers']}", where)
    _own_output_bias(ckpt, spec, sources, per_layer, attn, o_proj, code_attn, where)
    _sinks(ckpt, spec, sources, per_layer, attn, where)
    _output_gate(spec, names, code_attn, layer0, attn, f"{prefix}.{names['layers']}.0.{attn}", where)
    # The q/k norms: the modules the attention's code applies to the queries and to the keys alone, whatever
    # their names (HunYuan's query_layernorm); where the code does not say, names common families use (hints).
    q_norm, k_norm = next(((q, k) for q, k in QK_NORM_HINTS if has(f"{attn}.{q}.weight")), QK_NORM_HINTS[0])
    if (code_attn is not None and code_attn.q_norm and code_attn.q_norm != code_attn.k_norm
            and has(f"{attn}.{code_attn.q_norm}.weight")):
        q_norm, k_norm = code_attn.q_norm, code_attn.k_norm
    built = _qk_norm_built(sources, code_attn, ckpt.config, where, spec.model_type) if code_attn else None
    if (code_attn is not None and code_attn.q_norm and not has(f"{attn}.{code_attn.q_norm}.weight")
            and {code_attn.q_norm, code_attn.k_norm} <= weightless and (built is None or built[0] is not False)):
        if built is not None and built[0] is None:
            raise _unsupported(built[1], where, spec.model_type)
        # q/k norms that hold no parameter (NanoChat's; Llama 4's one L2 norm for both): the code alone says they
        # are there, and where __init__ builds them.
        names.update(q_norm=code_attn.q_norm, k_norm=code_attn.k_norm)
        kind = "per_head" if code_attn.qk_norm_per_head else "full"
        qk_code = norm_code(sources, code_attn.q_norm, ckpt.config)
        if built is not None and (qk_code is None or qk_code.centered or kind != "per_head"):
            raise _unsupported(f"q/k norms without parameters that are not an RMS norm over each head "
                               f"({code_attn.qk_norm_evidence})", where, spec.model_type)
        spec.set("qk_norm", kind, Source("code", f"{code_attn.qk_norm_evidence} (norms without parameters, "
                                                 f"{'per head' if kind == 'per_head' else 'over all heads'})"))
        spec.set("qk_norm_after_rope", bool(code_attn.qk_norm_after_rope), Source("code", code_attn.qk_norm_evidence))
        spec.set("qk_norm_weightless", True, Source("code", f"{code_attn.qk_norm_evidence}: no parameter"))
        spec.set("qk_norm_rope_layers_only", built[1] is not None,
                 Source("code", built[1]) if built[1] else Source("default", "q/k norms in every layer"))
    elif (code_attn is not None and code_attn.q_norm and code_attn.q_norm == code_attn.k_norm
          and built is not None and built[0] is False):
        spec.set("qk_norm", "none", Source("code", built[1]))
    elif has(f"{attn}.{q_norm}.weight"):
        info = layer0[f"{attn}.{q_norm}.weight"]
        if len(info.shape) != 1 or not has(f"{attn}.{k_norm}.weight"):
            raise _unsupported(f"q/k norm weights of shape {list(info.shape)} (one norm per head)", where,
                               spec.model_type)
        kind = "per_head" if info.shape[0] == spec.head_dim else "full"
        names.update(q_norm=q_norm, k_norm=k_norm)
        spec.set("qk_norm", kind, Source("tensor", f"{prefix}.{names['layers']}.0.{attn}.{q_norm}.weight has "
                                                   f"{info.shape[0]} rows"))
        after = code_attn is not None and code_attn.q_norm == q_norm and code_attn.qk_norm_after_rope
        spec.set("qk_norm_after_rope", bool(after),
                 Source("code", code_attn.qk_norm_evidence) if code_attn is not None and code_attn.q_norm == q_norm
                 else Source("default", "q/k norms before the rotary embedding (the code did not say)"))
    else:
        spec.set("qk_norm", "none", src(f"{attn}.{q_norm}.weight (absent)"))
    if spec.layer_num_heads and spec.qk_norm == "full":
        raise _unsupported(f"per-layer attention sizes ({spec.source('layer_num_heads').expr}[layer_idx] heads) with "
                           "q/k norms over all heads, whose width differs per layer", where, spec.model_type)

    _value_norm(spec, sources, code_attn, layer0, attn, ckpt.config, where)
    _temperature(spec, sources, code_attn, ckpt.config, where)

    # The MLP: dense in layer 0, or a mixture of experts whose dense parts (the MLP of
    # the layers without experts, or the shared expert) are read like a dense MLP.
    expert_modules = moe.find_layout(ckpt, spec, names, prefix, per_layer)
    ref, ref_layer, ref_name = layer0, 0, "layer 0"
    if expert_modules is not None:
        sparse = min(set(per_layer) - set(spec.dense_layers))
        if spec.dense_layers:
            ref_layer = spec.dense_layers[0]
            ref, ref_name = per_layer[ref_layer], f"layer {ref_layer}"
        elif "shared_expert" in names:
            ref, ref_layer = moe.shared_expert_tensors(per_layer[sparse], names, spec.shared_expert_on_layer), sparse
            ref_name = f"layer {sparse}'s shared expert"
        else:
            ref = None
    code_mlp = flow.mlp_flow if flow is not None and expert_modules is None else None
    if spec.shared_expert_on_layer and flow is not None and flow.mlp == names.get("shared_expert"):
        # The shared MLP the decoder layer holds beside its MoE block: read from its class's code, like a dense
        # MLP's (GraniteMoE-Shared's input_linear holds gate and up, cut by chunk(2)).
        code_mlp = flow.mlp_flow
    # OPT-style layouts: the MLP's projections are the layer's own; the port keeps them in a module `mlp`.
    on_layer = code_mlp is not None and flow.mlp_on_layer and not any(r.startswith("mlp.") for r in layer0)
    mlp = (names["mlp"] if expert_modules is not None else ("mlp" if on_layer else flow.mlp)
           if code_mlp is not None else first("mlp"))
    if mlp is None:
        flat = sorted(r.split(".")[0] for r, info in layer0.items()
                      if r.count(".") == 1 and r.endswith(".weight") and len(info.shape) == 2)
        if flat:  # OPT's and BioGPT's fc1, fc2: the MLP's projections are the layer's own
            raise _unsupported(f"layer 0's MLP projections ({', '.join(flat)}) sit directly on the decoder layer, "
                               "with no MLP module", where, spec.model_type)
        raise Undetermined(Unknown("names.mlp", "layer 0 has no MLP module the generator knows",
                                   tuple((c, "absent") for c in CANDIDATES["mlp"])))
    names["mlp"] = mlp
    if on_layer:
        own = (code_mlp.up, code_mlp.down)
        ref = {f"{mlp}.{r}" if r.split(".", 1)[0] in own else r: info for r, info in layer0.items()}
        spec.set("mlp_on_layer", True, Source("code", f"{code_mlp.evidence}: the decoder layer's own modules"))
    extra = []
    if ref is None:
        # Experts only: the dense roles keep their conventional names and are not used.
        names.update(gate_proj="gate_proj", up_proj="up_proj", gate_up_proj="gate_up_proj", down_proj="down_proj")
        spec.set("mlp_kind", "gated", Source("tensor", f"{prefix}.{names['layers']}.{sparse}.{mlp}.experts: gated experts"))
        spec.set("gate_up_layout", "separate", Source("default", "no dense MLP"))
        spec.set("mlp_bias", False, Source("default", "no dense MLP"))
    else:
        try:
            # The MLP's tensors as the code names them where transformers renames them on load (HY-V4's
            # mlp.linear_gate for the code's mlp.gate_proj); the port then keeps the checkpoint's names.
            coded = moe.code_names(ckpt, f"{prefix}.{names['layers']}.{ref_layer}.")
            as_code = {coded(r) if r.startswith(f"{mlp}.") else r: info for r, info in ref.items()}
            _dense_mlp(spec, names, mlp, as_code if len(as_code) == len(ref) else ref, ref_layer, ref_name, first,
                       src, where, code_mlp)
            for role in ("gate_proj", "up_proj", "down_proj"):
                if role in names:
                    names[role] = moe.stored_projection(ref, mlp, names[role], coded)
        except Undetermined:
            # Experts stored flattened (DBRX's w1, v1, w2: one 2-D parameter per projection holding every expert's
            # rows): no MLP and no expert layout the port has; named rather than left unknown.
            flat = subconfigs.flattened_experts(sources, {r: i for r, i in ref.items() if r.startswith(f"{mlp}.")}
                                                ) if sources and ref is not None else None
            if flat is not None:
                raise _unsupported(f"experts stored flattened ({flat.describe()}): the port's experts load one "
                                   "matrix per expert or a 3-D tensor", where, spec.model_type) from None
            raise
        # A 1-D tensor on the MLP besides the projections: an extra bias the code adds somewhere.
        extra = sorted(rest.split(".", 1)[1] for rest in ref if rest.startswith(mlp + ".") and rest.count(".") == 1)
    for name in extra:
        found = added_to_call(ckpt, names.get("gate_proj", "gate_proj"), name)
        if found is None:
            raise UnsupportedArchitecture(
                f"tensor {prefix}.{names['layers']}.0.{mlp}.{name} has no home in the port: the modeling source does not "
                "show it added to gate_proj's output, and the generator does not know where else it would go.",
                where,
            )
        spec.set("gate_extra_bias", name, Source("code", f"{found}: added to gate_proj(x)"))

    # An activation module holding tensors of its own (Apertus' xIELU), read from what the MLP's code applies.
    act_module = None
    if code_mlp is not None and not on_layer and ref is not None:
        try:
            act_module = submodules.activation_module(sources, ckpt.config, code_mlp, mlp, ref)
        except submodules.Unmatched as exc:
            raise _unsupported(str(exc), where, spec.model_type) from None
    if act_module is not None:
        names["act_fn"] = act_module.attr
        spec.set("act_tensors", list(act_module.tensors), Source("code", act_module.evidence))

    _norms_and_block(ckpt, spec, names, per_layer[norm_ref], sources, inside, weightless, flow, norm_ref,
                     gated_inner)
    # Routed experts beside the dense MLP (Gemma 4's enable_moe_block): their modules, norms and router.
    beside = parallelmoe.detect(ckpt, spec, names, sources, formcode._decoder_layer(sources) if sources else None,
                                per_layer)
    if transform is not None:
        _head_norm(ckpt, spec, names, sources, flow, head_norm_built)
    scalar = layer_output_scalar(sources, names["layers"].rsplit(".", 1)[-1], layer0) if sources else None
    spec.set("layer_scalar", scalar[0] if scalar else "",
             Source("code", f"{scalar[1]}: the layer's output times a one-element tensor of its own") if scalar
             else Source("default", "the layer's output as its residual adds leave it"))
    _key_bias_and_residuals(ckpt, spec, names, sources, layer0, attn, where)
    _transposed(ckpt, spec, names, sources, flow, f"{prefix}.{names['layers']}.0")
    # Norms inside the sublayers (BitNet's attn_sub_norm before o_proj, ffn_sub_norm before down_proj).
    try:
        sub_norms = submodules.sub_norms(spec, names, flow if code_attn is not None else None, sources, ckpt.config,
                                         layer0, attn, mlp if code_mlp is not None and not on_layer else None)
    except submodules.Unmatched as exc:
        raise _unsupported(str(exc), where, spec.model_type) from None

    # Whatever a layer holds that no role claimed would be dropped: refuse instead.
    claimed = {f"{attn}.{names[r]}" for r in ("q_proj", "k_proj", "v_proj", "kv_proj", "o_proj", "q_norm", "k_norm")
               if r in names}
    claimed.add(f"{attn}.{names['qkv_proj']}")
    claimed |= latent_modules
    if spec.attention_sinks:
        claimed.add(f"{attn}.{spec.attention_sinks}")
    if spec.o_bias_param:
        claimed.add(f"{attn}.{spec.o_bias_param}")
    if "attn_gate" in names:
        claimed.add(f"{attn}.{names['attn_gate']}")
    claimed |= {names[r] for r in ("attn_norm", "attn_post_norm", "mlp_norm", "mlp_post_norm") if r in names}
    claimed |= beside
    if spec.layer_scalar:
        claimed.add(spec.layer_scalar)
    if per_layer_inputs is not None:
        claimed |= {names[r] for r in PER_LAYER_INPUT_LAYER_ROLES}
    claimed |= {f"{attn}.{m}" for m in (spec.key_bias_proj, spec.key_bias_param) if m}
    claimed |= {m for m in (spec.residual_scale_attn, spec.residual_scale_mlp) if m}
    # Hyper-connections' stream mixers (scaffold.detect.hyperconn): their matrix, bias and scales.
    hyper = hyperconn.ported(sources, ckpt.config) if sources else None
    if hyper is not None:
        claimed |= {f"{m.attr}.{p}" for m in (hyper.attn, hyper.mlp) for p in m.params}
        claimed |= {old[1:] for old in hyperconn.renamed(ckpt, hyper, prefix, names["layers"])}
    if spec.qkv_layout == "latent":
        _latent_gate_and_sinks(ckpt, spec, names, sources, code_attn, layer0, attn, claimed, prefix, where)
        if spec.latent_out_gate:
            claimed.add(f"{attn}.{spec.latent_out_gate}")
    dense = {f"{mlp}.{names[r]}" for r in ("gate_proj", "up_proj", "gate_up_proj", "down_proj") if r in names}
    dense |= {f"{mlp}.{e}" for e in extra}
    if act_module is not None:
        dense.add(f"{mlp}.{act_module.attr}")
    claimed |= {m for m in sub_norms if m.startswith(f"{attn}.")}
    dense |= {m for m in sub_norms if m.startswith(f"{mlp}.")}
    if on_layer:
        dense |= {names["up_proj"], names["down_proj"]}  # as the checkpoint names them
    sparse_layers = sorted(set(per_layer) - set(spec.dense_layers)) if expert_modules is not None else []
    checked = {0: claimed | (expert_modules if 0 in sparse_layers else dense)}
    for layer in sparse_layers[:1] + spec.dense_layers[:1]:
        checked[layer] = claimed | (expert_modules if layer in sparse_layers else dense)
    stack = f"{prefix}.{names['layers']}"
    own = _differential(ckpt, spec, names, sources, code_attn, per_layer, attn, checked, where)
    checked = {layer: mine | own for layer, mine in checked.items()}
    for layer, mine in checked.items():
        stray = sorted(r for r in per_layer[layer] if r.rsplit(".", 1)[0] not in mine and r not in mine
                       and "rotary_emb." not in r)
        attn_cls = code_attn.cls if code_attn is not None else \
            blocks.layer_module_class(sources, names["layers"].rsplit(".", 1)[-1], attn) if sources and stray else None
        if stray and attn_cls and (differential := blocks.differential_attention(
                sources, attn_cls, [r.split(".", 1)[1] for r in stray if r.startswith(f"{attn}.")])):
            raise _unsupported(f"{differential} (layer {layer} holds "
                               f"{', '.join(f'{stack}.{layer}.{s}' for s in stray[:4])})", where, spec.model_type)
        coded = moe.code_names(ckpt, f"{stack}.{layer}.")
        if stray and attn_cls and spec.qkv_layout == "latent" and (gated := _latent_output_gate(
                sources, attn_cls, {coded(r).split(".", 1)[1].rsplit(".", 1)[0]: r for r in stray
                                    if r.startswith(f"{attn}.") and coded(r).startswith(f"{attn}.")})):
            raise _unsupported(f"{gated.what} with latent attention, in a form the port does not compute: "
                               f"{_latent_gate_problem(spec, gated, per_layer[layer], attn)}", where, spec.model_type)
        if stray:
            raise _unsupported(f"layer {layer} holds tensor(s) that no part of the port computes with "
                               f"({', '.join(f'{stack}.{layer}.{s}' for s in stray[:3])})", where,
                               spec.model_type)
    spec.set("names", names, Source("tensor", "module names of the embedding, layer 0 and the head"
                                    + ("" if "norm" in names else f"; no final norm ({no_final_norm})")))

    key = "tie_word_embeddings"
    tied_value = ckpt.config.get(key)
    head = head_name in ckpt.tensors
    if not head:
        if tied_value is False:
            raise CheckpointError(
                f"config.json says tie_word_embeddings is false but the checkpoint has no {head_name}: "
                "the output head would have no weights.",
                where,
            )
        spec.set("tie_word_embeddings", True, Source("tensor", f"no {head_name}: the head is the embedding"))
    else:
        spec.set("tie_word_embeddings", bool(tied_value),
                 Source("config", f"config.json {key}" if tied_value is not None else f"{head_name} present"))
    spec.set("lm_head_bias", f"{names['lm_head']}.bias" in ckpt.tensors, Source("tensor", f"{names['lm_head']}.bias"))

    embed_rows = ckpt.tensors[embed_name].shape[0]
    said = f"vocab_size {vocab} ({spec.source('vocab_size')})"  # from config.json, or from the user's spec file
    if embed_rows != vocab:
        raise CheckpointError(f"{said} but {embed_name} has {embed_rows} rows.", where)
    if head and ckpt.tensors[head_name].shape[0] != vocab:
        raise CheckpointError(f"{said} but {head_name} has {ckpt.tensors[head_name].shape[0]} rows.", where)


def _key_bias_and_residuals(ckpt: Checkpoint, spec: Spec, names: dict, sources: dict, layer0: dict, attn: str,
                            where) -> None:
    """A bias per key computed from its values (keybias.key_bias: Doge's dt_proj and A) and residuals scaled by
    parameters of the layer (keybias.residual_scales), checked against layer 0's tensors."""
    found = keybias.key_bias(sources, ckpt.config) if sources else None  # forms.check refused what it names
    if found is None:
        for name in ("key_bias_proj", "key_bias_param"):
            spec.set(name, "", Source("default", "no bias per key"))
        spec.set("key_bias_proj_bias", False, Source("default", "no bias per key"))
        spec.set("key_bias_window", None, Source("default", "no top-k of the keys"))
    else:
        kv, dim = spec.num_kv_heads, spec.head_dim
        weight = layer0.get(f"{attn}.{found.proj}.weight")
        param = layer0.get(f"{attn}.{found.param}")
        if weight is None or tuple(weight.shape) != (kv, kv * dim) or param is None or tuple(param.shape) != (kv,):
            raise _unsupported(
                f"a bias per key ({found.evidence}) whose tensors are not one number per KV head from every KV "
                f"head's values ({attn}.{found.proj}.weight {tuple(weight.shape) if weight is not None else 'absent'}, "
                f"{attn}.{found.param} {tuple(param.shape) if param is not None else 'absent'}; the port expects "
                f"[{kv}, {kv * dim}] and [{kv}])", where, spec.model_type)
        spec.set("key_bias_proj", found.proj, Source("code", found.evidence))
        spec.set("key_bias_param", found.param, Source("code", found.evidence))
        spec.set("key_bias_proj_bias", f"{attn}.{found.proj}.bias" in layer0,
                 Source("tensor", f"{attn}.{found.proj}.bias"))
        if found.window is not None:
            value = ckpt.config.get(found.window)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise _unsupported(f"a top-k of the keys beyond config.{found.window}, which config.json sets to "
                                   f"{value!r}, not a positive count ({found.evidence})", where, spec.model_type)
            spec.set("key_bias_window", value, Source("config", f"config.json {found.window} ({found.evidence})",
                                                      f"config.{found.window}"))
        else:
            spec.set("key_bias_window", found.window_value,
                     Source("code", found.evidence) if found.window_value is not None
                     else Source("default", "no top-k of the keys"))
    try:
        scales = keybias.residual_scales(sources, attn, names["mlp"]) if sources else None
    except keybias.Unmatched as exc:  # forms.check names these first
        raise _unsupported(f"learned residual scales: {exc}", where, spec.model_type) from None
    for role in ("attn", "mlp"):
        name = (scales or {}).get(role, "")
        if name:
            tensor = layer0.get(name)
            if tensor is None or tuple(tensor.shape) != (spec.hidden_size,):
                raise _unsupported(f"the residual scaled by {name}, which layer 0 holds as "
                                   f"{tuple(tensor.shape) if tensor is not None else 'no tensor'}, not one number per "
                                   f"channel ({spec.hidden_size})", where, spec.model_type)
        spec.set(f"residual_scale_{role}", name,
                 Source("code", f"the decoder layer's forward: self.{name} * residual + the {role} output") if name
                 else Source("default", "the residual added as it is"))


def _differential(ckpt: Checkpoint, spec: Spec, names: dict, sources: dict, code_attn, per_layer: dict, attn: str,
                  checked: dict, where) -> set[str]:
    """Differential attention (DiffLlama's): where the attention's forward subtracts two attention outputs, the
    second weighted by a value of its own parameters (blocks.differential_attention), read what it computes
    (scaffold.detect.differential) and set diff_*; the parameters it claims. Refused naming what differs."""
    stray = sorted(r.split(".", 1)[1] for r in per_layer[0] if r.startswith(f"{attn}.") and r.count(".") == 1
                   and r.rsplit(".", 1)[0] not in checked[0] and r not in checked[0])
    attn_cls = code_attn.cls if code_attn is not None else \
        blocks.layer_module_class(sources, names["layers"].rsplit(".", 1)[-1], attn) if sources and stray else None
    if not stray or not attn_cls or not (found := blocks.differential_attention(sources, attn_cls, stray)):
        return set()
    roles = ("q_proj", "k_proj", "v_proj", "o_proj")
    if not all(r in names for r in roles):
        raise _unsupported(f"{found}; its q, k and v come from one fused projection ({names.get('qkv_proj')}), which "
                           "the reader of differential attention does not follow", where, spec.model_type)
    read = differential.read(sources, attn_cls, ckpt.config, tuple(names[r] for r in roles), stray)
    if isinstance(read, str):
        raise _unsupported(f"{found}; not the form the port computes: {read}", where, spec.model_type)
    kv = spec.num_kv_heads
    if kv % 2 or spec.num_heads % 2:
        raise _unsupported(f"differential attention over {spec.num_heads} query heads and {kv} KV heads: the value "
                           "heads are cut in two and the heads paired, which needs even counts", where,
                           spec.model_type)
    shapes = {p: per_layer[0][f"{attn}.{p}"].shape for p in read.lambdas}
    if any(list(s) != [spec.head_dim] for s in shapes.values()):
        raise _unsupported(f"differential attention's vectors are not of head_dim {spec.head_dim}: {shapes}", where,
                           spec.model_type)
    detail = f"{read.where}: the attention's forward, interpreted over numbers, computes differential attention"
    spec.set("diff_lambdas", list(read.lambdas), Source("code", f"{detail}: weight exp(sum({read.lambdas[0]} * "
                                                                 f"{read.lambdas[1]})) - exp(sum({read.lambdas[2]} * "
                                                                 f"{read.lambdas[3]})) + init"))
    spec.set("diff_lambda_init", read.init, Source("code", f"{read.init_line}: init = {read.init}"))
    spec.set("diff_norm_eps", read.eps,
             Source("config", f"the norm {read.norm}'s eps ({read.eps_expr})", read.eps_expr) if read.eps_expr
             else Source("code", f"{read.where}: the norm {read.norm}'s eps"))
    return {f"{attn}.{p}" for p in read.lambdas}


@dataclass(frozen=True)
class PerLayerRead:
    """`config.KEY[layer_idx]` handed to the attention's constructor in the decoder layer's __init__."""

    key: str
    code: str  # the subscript as the code writes it
    where: str  # FILE:LINE

    def __str__(self) -> str:
        return f"{self.code} ({self.where})"


def _routed_attention(ckpt: Checkpoint, spec: Spec, names: dict, routed: moa.MoA, attn: str) -> set[str]:
    """JetMoE's mixture of attention heads (scaffold.detect.moa): its names, sizes and tensors (claimed)."""
    where = f"{names['model']}.{names['layers']}.0.{attn}.{routed.attr}"
    names.update(qkv_proj=routed.kv_proj, moa=routed.attr, moa_router=routed.router, moa_q_bank=routed.q_bank,
                 moa_o_bank=routed.o_bank, moa_bias=routed.bias)
    spec.set("qkv_layout", "routed", Source("code", routed.evidence))
    spec.set("qkv_bias", False, Source("tensor", f"{names['model']}.{names['layers']}.0.{attn}.{routed.kv_proj}.bias "
                                                 "(absent)"))
    top_k = ckpt.config.get(routed.top_k[len("config."):]) if routed.top_k.startswith("config.") else None
    experts = ckpt.config.get(routed.experts_expr[len("config."):]) \
        if routed.experts_expr.startswith("config.") else None
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1 or experts != routed.num_experts:
        raise _unsupported(f"routed attention (a mixture of attention heads): the experts per token "
                           f"({routed.top_k} = {top_k!r}) or the experts ({routed.experts_expr} = {experts!r}, "
                           f"{where}.{routed.q_bank}.weight holds {routed.num_experts}) are not read from config.json",
                           ckpt.config_file, spec.model_type)
    spec.set("moa_top_k", top_k, Source("config", f"config.json {routed.top_k[len('config.'):]} ({routed.evidence})",
                                        routed.top_k))
    spec.set("moa_num_experts", experts, Source("config", f"config.json {routed.experts_expr[len('config.'):]} "
                                                          f"({where}.{routed.q_bank}.weight: {experts} experts)",
                                                routed.experts_expr))
    if spec.num_heads != top_k * spec.num_kv_heads:
        raise _unsupported(f"routed attention (a mixture of attention heads): {spec.num_heads} query heads, not the "
                           f"top-k {top_k} x {spec.num_kv_heads} KV heads the routed queries make", ckpt.config_file,
                           spec.model_type)
    inside = f"{attn}.{routed.attr}"
    return {f"{inside}.{routed.router}", f"{inside}.{routed.q_bank}", f"{inside}.{routed.o_bank}",
            f"{inside}.{routed.bias}"}


def _per_layer_attention_argument(sources: dict, flow: dataflow.Layer, attn: str) -> PerLayerRead | None:
    """`config.KEY[layer_idx]` handed to the attention's constructor in the decoder layer's __init__ (Laguna's
    `LagunaAttention(config, layer_idx, config.num_attention_heads_per_layer[layer_idx])`)."""
    tree = codekeys.parse(sources.get(flow.file, ""))
    for node in subtree(tree) if tree is not None else ():
        if not (isinstance(node, ast.ClassDef) and node.name == flow.cls):
            continue
        for sub in subtree(node):
            if not (isinstance(sub, ast.Assign) and len(sub.targets) == 1
                    and ast.unparse(sub.targets[0]) == f"self.{attn}" and isinstance(sub.value, ast.Call)):
                continue
            for arg in [*sub.value.args, *(k.value for k in sub.value.keywords)]:
                if (isinstance(arg, ast.Subscript) and isinstance(arg.slice, ast.Name)
                        and isinstance(arg.value, ast.Attribute)
                        and ast.unparse(arg.value).startswith(("config.", "self.config."))):
                    return PerLayerRead(arg.value.attr, ast.unparse(arg), f"{flow.file}:{arg.lineno}")
    return None


def _layer_heads(ckpt: Checkpoint, spec: Spec, names: dict, read: PerLayerRead, per_layer: dict[int, dict],
                 attn: str, layers: str, where) -> None:
    """The decoder layer builds its attention with `config.KEY[layer_idx]` (`read`): a value of its own per layer.
    It is each layer's query head count where every layer's tensors say so: q_proj has KEY[i] x head_dim rows and
    o_proj as many columns, in every layer i (k and v keep num_kv_heads, which the attention checks). The port
    then builds each layer's attention with config.KEY[layer_idx] heads; anything else stays refused."""
    refusal = (f"per-layer attention sizes: the decoder layer builds {attn} with {read}, a value of its own for "
               "each layer")
    value = ckpt.config.get(read.key)
    if not (isinstance(value, list) and len(value) == spec.num_layers
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        raise _unsupported(f"{refusal}, but config.json's {read.key} is not one positive count per layer "
                           f"({spec.num_layers})", where, spec.model_type)
    if spec.qkv_layout != "separate" or spec.attn_output_gate == "in_query":
        raise _unsupported(f"{refusal}, with q, k, v {spec.qkv_layout} (the port builds per-layer head counts from "
                           "separate q, k, v projections only)", where, spec.model_type)
    dim, q, o = spec.head_dim, names["q_proj"], names["o_proj"]
    for layer, heads in enumerate(value):
        tensors = per_layer.get(layer, {})
        rows = tensors.get(f"{attn}.{q}.weight")
        cols = tensors.get(f"{attn}.{o}.weight")
        if (rows is None or cols is None or tuple(rows.shape) != (heads * dim, spec.hidden_size)
                or tuple(cols.shape) != (spec.hidden_size, heads * dim)):
            found = [list(t.shape) if t is not None else None for t in (rows, cols)]
            raise _unsupported(f"{refusal}, but layer {layer}'s {q} and {o} (shapes {found[0]} and {found[1]}) are "
                               f"not {read.key}[{layer}] = {heads} heads of {dim}: the value sizes something the "
                               "port does not build per layer", where, spec.model_type)
        if heads % spec.num_kv_heads:
            raise CheckpointError(f"layer {layer}'s {heads} heads ({read.key}) cannot share {spec.num_kv_heads} KV "
                                  "heads.", where)
    spec.set("layer_num_heads", list(value),
             Source("code", f"{read}: each layer's attention has config.{read.key}[layer_idx] query heads; "
                            f"{layers}.N.{attn}.{q} has that many x head_dim {dim} rows in every layer",
                    f"config.{read.key}"))


def _qkv_clip(spec: Spec, code: dataflow.Attention, latent_attention: bool, where) -> None:
    """q, k and v clamped to [-c, c] as the projections give them (dataflow.Attention.qkv_clamp: OLMo's and DBRX's
    clip_qkv), the port clamping its fused qkv output with the config value the code reads; refused by name where
    the code clamps otherwise (after a norm, some of q, k, v, bounds of their own) or the attention is latent."""
    problem = code.qkv_clamp_problem or ("latent attention: the port has no q, k, v projection outputs to clamp"
                                         if latent_attention else "")
    if not problem and code.query_gate:
        problem = "the query projection also holds an output gate, which the port would clamp with it"
    if problem:
        raise _unsupported(f"q, k and v clamped, not in the form the port computes ({code.qkv_clamp}: {problem})",
                           where, spec.model_type)
    spec.set("qkv_clip", code.qkv_clamp_value,
             Source("code", f"{code.qkv_clamp}: q, k and v clamped to [-c, c], c = {code.qkv_clamp_bound}",
                    code.qkv_clamp_bound or None))


def _latent_gate_problem(spec: Spec, gate: LatentGate, layer: dict, attn: str) -> str:
    """Why the port does not compute the gate `gate` on a latent attention's output; "" where it does."""
    weight = layer.get(f"{attn}.{gate.stored.rsplit('.', 2)[-2]}.weight")
    rows = spec.num_heads * spec.v_head_dim
    if not spec.q_lora_rank:
        return "the latent attention has no low-rank query (the port computes the query itself only from one)"
    if gate.act not in GATE_ACTIVATIONS:
        return f"its activation {gate.act} is none of {', '.join(GATE_ACTIVATIONS)}"
    if not gate.flows:
        return "the reader does not follow its product from the attention call's output to the output projection"
    if weight is None or list(weight.shape) != [rows, spec.hidden_size]:
        return (f"{gate.stored} has shape {list(weight.shape) if weight is not None else None}, not [{rows}, "
                f"{spec.hidden_size}] (one gate per head and value column: {spec.num_heads} x {spec.v_head_dim})")
    if f"{attn}.{gate.stored.rsplit('.', 2)[-2]}.bias" in layer:
        return f"{gate.stored.rsplit('.', 1)[0]} has a bias"
    return ""


def _latent_gate_and_sinks(ckpt: Checkpoint, spec: Spec, names: dict, sources: dict, code_attn, layer0: dict,
                           attn: str, claimed: set[str], prefix: str, where) -> None:
    """A latent attention's output gated element by element by a projection of its input (HY-V4's gate_proj, stored
    as linear_gate), read from the attention's forward (_latent_output_gate) and the gate's shape; and its sinks,
    which vLLM's MLAAttention does not take: the port then runs each head's decompressed key and value through a
    plain Attention with them (latent_sink_decompressed)."""
    if spec.attention_sinks and not spec.q_lora_rank:
        raise _unsupported(f"attention sinks ({attn}.{spec.attention_sinks}: {spec.source('attention_sinks').detail}) "
                           "with latent attention without a low-rank query (the port computes the query itself only "
                           "from q_lora_rank's)", where, spec.model_type)
    if spec.attention_sinks:
        spec.set("latent_sink_decompressed", True,
                 Source("code", f"{attn}.{spec.attention_sinks} with latent attention "
                                f"({spec.source('attention_sinks').detail}): vLLM's MLAAttention takes no sinks"))
    attn_cls = code_attn.cls if code_attn is not None else \
        blocks.layer_module_class(sources, names["layers"].rsplit(".", 1)[-1], attn) if sources else None
    if not attn_cls:
        return
    coded = moe.code_names(ckpt, f"{prefix}.{names['layers']}.0.")
    free = {coded(r).split(".", 1)[1].rsplit(".", 1)[0]: r for r in layer0
            if r.startswith(f"{attn}.") and coded(r).startswith(f"{attn}.") and r.endswith(".weight")
            and r.rsplit(".", 1)[0] not in claimed and r.count(".") == attn.count(".") + 2}
    gate = _latent_output_gate(sources, attn_cls, free, names.get("o_proj", "o_proj"))
    if gate is None or _latent_gate_problem(spec, gate, layer0, attn):
        return  # refused by name where the layer's tensors are checked
    stored = gate.stored.rsplit(".", 2)[-2]
    spec.set("latent_out_gate", stored, Source("code", f"{gate.what}: {spec.num_heads} heads x v_head_dim "
                                                       f"{spec.v_head_dim} rows"))
    spec.set("latent_out_gate_act", gate.act, Source("code", gate.what))


@dataclass(frozen=True)
class LatentGate:
    """A gate on a latent attention's output read by _latent_output_gate."""
    what: str  # the gated attention, named with its file:line
    code: str  # the gate module's name in the code (gate_proj)
    stored: str  # the checkpoint's tensor (self_attn.linear_gate.weight)
    act: str  # the activation's last name (sigmoid)
    flows: bool  # the product is of the attention call's output and reaches the output projection


def _latent_output_gate(sources: dict, attn_cls: str, modules: dict[str, str], o_proj: str = "o_proj"
                        ) -> LatentGate | None:
    """A gate on a latent attention's output the dataflow reader did not follow (HY-V4's): in `attn_cls`'s forward,
    a call of one of `modules` (code name -> the checkpoint's tensor), whose value, activated, multiplies the
    attention's output before the output projection; None where there is none. `flows`: the other factor is what an
    attention call (a call of q, k, v and more, not a module of the class) returns, and the product reaches
    self.`o_proj`'s call."""
    found = _classes(sources).get(attn_cls)
    forward = next((n for n in found[1].body if isinstance(n, ast.FunctionDef) and n.name == "forward"),
                   None) if found else None
    if forward is None or not modules:
        return None
    derived: dict[str, str] = {}  # local -> the gate module its value comes from
    attended: set[str] = set()  # locals an attention call returns
    statements = sorted((n for n in ast.walk(forward) if isinstance(n, (ast.Assign, ast.Return))),
                        key=lambda n: n.lineno)
    for index, node in enumerate(statements):
        if isinstance(node, ast.Return):
            continue
        value = node.value
        if (isinstance(value, ast.Call) and not (isinstance(value.func, ast.Attribute)
                                                 and _dotted(value.func.value) == "self")
                and len([a for a in value.args if not (isinstance(a, ast.Name) and a.id == "self")]) >= 3):
            for target in node.targets:
                first = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else target
                if isinstance(first, ast.Name):
                    attended.add(first.id)
        source = next((c.func.attr for c in ast.walk(value) if isinstance(c, ast.Call)
                       and isinstance(c.func, ast.Attribute) and _dotted(c.func.value) == "self"
                       and c.func.attr in modules), None)
        source = source or next((derived[n.id] for n in ast.walk(value)
                                 if isinstance(n, ast.Name) and n.id in derived), None)
        if source is None:
            continue
        for product in (n for n in ast.walk(value) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)):
            for gate, other in ((product.right, product.left), (product.left, product.right)):
                if not (isinstance(gate, ast.Call) and gate.args and isinstance(gate.args[0], ast.Name)
                        and gate.args[0].id in derived and isinstance(other, ast.Name) and other.id not in derived):
                    continue
                module = derived[gate.args[0].id]
                act = _dotted(gate.func).rsplit(".", 1)[-1]
                what = (f"gated attention ({found[0]}:{node.lineno}: {ast.unparse(node)[:80]}: {act} of "
                        f"self.{module}(x), {modules[module]} in the checkpoint, scales the attention's output "
                        "before the output projection)")
                # Where the product goes: the locals assigned from it, up to a call of the output projection.
                carried = {t.id for t in node.targets if isinstance(t, ast.Name)}
                reaches = False
                for later in statements[index + 1:]:
                    names_in = {n.id for n in ast.walk(later.value) if isinstance(n, ast.Name)} \
                        if later.value is not None else set()
                    if not names_in & carried:
                        continue
                    if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == o_proj
                           and _dotted(c.func.value) == "self"
                           and {n.id for a in c.args for n in ast.walk(a) if isinstance(n, ast.Name)} & carried
                           for c in ast.walk(later.value)):
                        reaches = True
                        break
                    if isinstance(later, ast.Assign):
                        carried |= {t.id for t in later.targets if isinstance(t, ast.Name)}
                return LatentGate(what, module, modules[module], act, other.id in attended and reaches)
        for target in node.targets:
            if isinstance(target, ast.Name):
                derived[target.id] = source
    return None


def _output_gate(spec: Spec, names: dict, code: dataflow.Attention | None, layer0: dict, attn: str, module: str,
                 where) -> None:
    """A gate on the attention output (dataflow: a projection of the attention's input whose activation multiplies
    the attention output before o_proj): its name, its activation, and whether it gives one value per output
    element or per head, from its weight's rows (heads x head_dim, or heads: the product could not broadcast
    otherwise)."""
    if spec.qkv_layout == "latent" and spec.attn_output_gate == "in_query":
        return  # in the latent query's rows, as latent.detect read it (A.X-K2's)
    if code is not None and code.query_gate_refusal:
        raise _unsupported(f"an output gate folded into the query projection, not in the form the port builds "
                           f"({code.query_gate_refusal})", where, spec.model_type)
    if code is not None and code.query_gate:
        _query_gate(spec, names, code, layer0, attn, module, where)
        return
    gate = code.output_gate if code is not None else None
    weight = f"{attn}.{gate}.weight"
    if gate is None or weight not in layer0:
        spec.set("attn_output_gate", "none", Source("default", "no gate on the attention output"))
        return
    what = f"gated attention ({code.output_gate_evidence}: an activation of {attn}.{gate}(x) scales the attention " \
           f"output before {names['o_proj']})"
    if spec.qkv_layout == "latent":
        raise _unsupported(f"{what} with latent attention", where, spec.model_type)
    act = code.output_gate_act
    if act not in GATE_ACTIVATIONS:
        file = code.output_gate_evidence.rsplit(":", 1)[0]
        raise _unsupported(f"{what}, through an activation the reader does not name as one of "
                           f"{', '.join(GATE_ACTIVATIONS)} ({file}:{code.output_gate_act_line}: {act or 'unnamed'})",
                           where, spec.model_type)
    shape = tuple(layer0[weight].shape)
    heads, dim = spec.heads_of(0), spec.head_dim
    if len(shape) != 2 or shape[1] != spec.hidden_size or shape[0] not in (heads * dim, heads):
        raise _unsupported(f"{what}, its weight {module}.{gate}.weight of shape {list(shape)} neither one row per "
                           f"head ({heads}) nor per output element ({heads} x {dim}) over hidden_size "
                           f"{spec.hidden_size}", where, spec.model_type)
    per_head = shape[0] == heads and heads != heads * dim
    names["attn_gate"] = gate
    evidence = code.output_gate_evidence
    spec.set("attn_output_gate", "per_head" if per_head else "elementwise",
             Source("code", f"{evidence}: {act}({gate}(x)) scales the attention output before {names['o_proj']}; "
                            f"{module}.{gate}.weight has {shape[0]} rows: one per "
                            + ("head" if per_head else "output element")))
    file = evidence.rsplit(":", 1)[0]
    spec.set("attn_gate_act", act, Source("code", f"{file}:{code.output_gate_act_line}: {act} of {gate}(x)"))
    spec.set("attn_gate_bias", f"{attn}.{gate}.bias" in layer0, Source("tensor", f"{module}.{gate}.bias"))


def _query_gate(spec: Spec, names: dict, code: dataflow.Attention, layer0: dict, attn: str, module: str,
                where) -> None:
    """The output gate folded into the query projection (Qwen3-Next's): q_proj's rows hold, per head, the query's
    head_dim rows then the gate's; the port builds q_proj as 2 x heads query "heads" of QKVParallelLinear (each
    rank takes its heads' pairs) and cuts each pair in two after the projection, as vLLM's qwen3_next.py does."""
    what = f"an output gate folded into the query projection ({code.query_gate})"
    if spec.qkv_layout != "separate":
        raise _unsupported(f"{what} with qkv_layout {spec.qkv_layout}", where, spec.model_type)
    act = code.output_gate_act
    file = code.output_gate_evidence.rsplit(":", 1)[0]
    if act not in GATE_ACTIVATIONS:
        raise _unsupported(f"{what}, through an activation the reader does not name as one of "
                           f"{', '.join(GATE_ACTIVATIONS)} ({file}:{code.output_gate_act_line}: {act or 'unnamed'})",
                           where, spec.model_type)
    weight = f"{attn}.{names['q_proj']}.weight"
    shape = list(layer0[weight].shape) if weight in layer0 else None
    rows = 2 * spec.num_heads * spec.head_dim
    if shape != [rows, spec.hidden_size]:
        raise _unsupported(f"{what}, but {module}.{names['q_proj']}.weight has shape {shape}, not [{rows}, "
                           f"{spec.hidden_size}] ({spec.num_heads} heads x 2 x head_dim {spec.head_dim}: query and "
                           "gate rows per head)", where, spec.model_type)
    spec.set("attn_output_gate", "in_query",
             Source("code", f"{code.query_gate}; {module}.{names['q_proj']}.weight has {rows} rows: "
                            f"{spec.num_heads} heads x [query | gate] x {spec.head_dim}"))
    spec.set("attn_gate_act", act, Source("code", f"{file}:{code.output_gate_act_line}: {act} of the gate half"))
    spec.set("attn_gate_bias", False, Source("code", f"the gate's bias, if any, is {names['q_proj']}'s (qkv_bias)"))


def _sinks(ckpt: Checkpoint, spec: Spec, sources: dict, per_layer: dict[int, dict], attn: str, where) -> None:
    """The attention sinks (_attention_sinks), in every layer or in the layers whose attention's __init__ builds
    them under a condition (MiMo-V2's sliding layers: headsizes.sinks_condition), which the port evaluates."""
    layer = next((i for i in sorted(per_layer)
                  if _attention_sinks(sources, per_layer[i], attn, spec.heads_of(i), moe.code_names(
                      ckpt, f"{spec.names['model']}.{spec.names['layers']}.{i}."))), None)
    if layer is None:
        spec.set("attention_sinks", None, Source("default", "no attention sinks"))
        return
    code = moe.code_names(ckpt, f"{spec.names['model']}.{spec.names['layers']}.{layer}.")
    param, code_param, evidence = _attention_sinks(sources, per_layer[layer], attn, spec.heads_of(layer), code)
    spec.set("attention_sinks", param, Source("code", evidence))
    holding = [i for i in sorted(per_layer) if f"{attn}.{param}" in per_layer[i]]
    if holding == list(range(spec.num_layers)):
        return
    found = headsizes.sinks_condition(sources, ckpt.config, spec.names["layers"].rsplit(".", 1)[-1], code_param,
                                      spec.num_layers)
    if found is None or found[1] != holding:
        said = (f"the code builds them where {found[0]} ({found[2]}): layers {found[1]}" if found is not None
                else "under no condition the reader follows to the config and the layer's number")
        raise _unsupported(f"attention sinks ({attn}.{param}) in layers {holding} only, where {said}", where,
                           spec.model_type)
    expr, layers, line = found
    spec.set("attention_sinks_layers", layers,
             Source("code", f"{line}: self.{code_param} built where {expr}", expr))


def _attention_sinks(sources: dict, tensors: dict, attn: str, heads: int,
                     code=str) -> tuple[str, str, str] | None:
    """(parameter as the checkpoint names it, as the code names it, evidence) of the attention sinks: a tensor of
    one value per head kept on the attention module itself (`tensors`: one layer's), which the code hands the
    attention function as its sinks (`s_aux=self.sinks`, transformers' convention for a logit added to each
    softmax's denominator); `code` renames a tensor as transformers does on load (MiMo-V2's attention_sink_bias
    is the code's sinks)."""
    held = {code(rest).split(".", 1)[1]: rest.split(".", 1)[1] for rest, info in tensors.items()
            if rest.startswith(f"{attn}.") and rest.count(".") == 1 and tuple(info.shape) == (heads,)}
    if not held:
        return None
    for file, node in walk(sources):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                value = keyword.value
                if (keyword.arg in ("s_aux", "sinks") and isinstance(value, ast.Attribute)
                        and isinstance(value.value, ast.Name) and value.value.id == "self" and value.attr in held):
                    evidence = (f"{file}:{node.lineno}: {keyword.arg}=self.{value.attr} (a logit per head added "
                                "to the softmax's denominator)")
                    return held[value.attr], value.attr, evidence
    return None


def _position_table(ckpt: Checkpoint, spec: Spec, prefix: str, top: dict) -> str | None:
    """The module path (under `prefix`) of a learned absolute position table the code adds to the token
    embedding (positions.learned_positions), with spec.position_offset; None where the code has none."""
    learned = positions.learned_positions(modeling_sources(ckpt))
    if learned is None:
        return None
    found = sorted(n[len(prefix) + 1:-len(".weight")] for n, info in top.items()
                   if n.startswith(prefix + ".") and n.endswith(f"{learned.positions}.weight")
                   and n[len(prefix) + 1:-len(".weight")].rsplit(".", 1)[-1] == learned.positions
                   and len(info.shape) == 2)
    if len(found) != 1:
        return None
    table = found[0]
    rows = top[f"{prefix}.{table}.weight"].shape[0]
    if rows != spec.max_position + learned.offset:
        offset = f" plus the offset {learned.offset}" if learned.offset else ""
        raise CheckpointError(f"{prefix}.{table}.weight has {rows} rows, not the {spec.max_position} positions "
                              f"({spec.source('max_position')}){offset} the port builds it with.", ckpt.config_file)
    spec.set("position_offset", learned.offset,
             Source("code", f"{learned}: {learned.positions} looks up position + {learned.offset}") if learned.offset
             else Source("code", f"{learned}: {learned.positions} looks up the positions as they are"))
    return table


# Projection roles by the sublayer whose class builds them.
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj")
MLP_PROJECTIONS = ("gate_proj", "up_proj", "gate_up_proj", "down_proj")


def _transposed(ckpt: Checkpoint, spec: Spec, names: dict, sources: dict, flow: dataflow.Layer | None,
                layer: str) -> None:
    """The projections whose class stores its weight [in, out] (GPT-2's Conv1D), read from the class the
    attention's and the MLP's code build each with (scaffold.detect.linears)."""
    classes = linear_classes(sources) if sources else {}
    owners = []
    if flow is not None and flow.attention_flow is not None:
        owners.append((flow.attention_flow.cls, attention_module(names), ATTENTION_PROJECTIONS))
    if flow is not None and flow.mlp_flow is not None:
        owners.append((flow.mlp_flow.cls, names["mlp"], MLP_PROJECTIONS))
    roles, evidence = [], set()
    for owner, module, projections in owners:
        for role in projections:
            attr = names.get(role)
            built = built_with(sources, owner, attr) if attr else None
            kind = classes.get(built) if built else None
            if kind is not None and kind.transposed and f"{layer}.{module}.{attr}.weight" in ckpt.tensors:
                roles.append(role)
                evidence.add(kind.where)
    if roles:  # a feature, like the extra gate bias: a spec file adds it by name; left out, there is none
        spec.set("transposed_roles", roles, Source("code", "; ".join(sorted(evidence))))


def _dense_mlp(spec: Spec, names: dict, mlp: str, ref: dict, layer: int, ref_name: str, first, src,
               where, code: dataflow.Mlp | None = None) -> None:
    """The dense MLP's kind, layout, names and biases: from what its code computes (`code`), else read from the
    tensors `ref` of one layer by the names the generator knows."""
    prefix = names["model"]

    def has(rest: str) -> bool:
        return rest in ref

    down = code.down if code is not None else first("down_proj", mlp, ref)
    if code is not None and code.kind == "gated" and not code.fused:
        names.update(gate_proj=code.gate, up_proj=code.up, gate_up_proj="gate_up_proj")
        spec.set("mlp_kind", "gated", Source("code", code.evidence))
        spec.set("gate_up_layout", "separate", Source("code", code.evidence))
        up = code.gate
    elif code is not None and code.kind == "gated":
        names["gate_up_proj"] = code.gate
        order = "up rows, then gate rows" if code.up_first else "gate rows, then up rows"
        spec.set("mlp_kind", "gated", Source("code", code.evidence))
        spec.set("gate_up_layout", "fused", Source("code", f"{code.evidence} ({order})"))
        spec.set("gate_up_order", "up_first" if code.up_first else "gate_first", Source("code", code.evidence))
        up = code.gate
    elif code is not None and (wide := _twice_as_wide(ref, mlp, code.up, code.down)):
        # The code reads as a plain MLP, but its up projection has twice the rows its down projection takes: a
        # gated MLP whose halves the code cuts in a way the analysis does not follow (an unflatten and a select,
        # a kernel's reference path). Which half is the gate stays open; scaffold.settle runs the MLP to tell.
        names["gate_up_proj"] = up = code.up
        why = (f"{mlp}.{code.up} has {wide[0]} output rows, twice the {wide[1]} inputs of {mlp}.{code.down} "
               f"({code.evidence}): a gated MLP whose gate half the code analysis could not tell")
        spec.set("mlp_kind", "gated", Source("tensor", why))
        spec.set("gate_up_layout", "fused", Source("tensor", why))
        spec.unknown("gate_up_order", f"which half of {mlp}.{code.up} is the gate: reading the code does not tell, "
                                      f"running it with --trust-remote-code would; {why}",
                     (("gate_first", "the gate rows first: not decided by reading the code"),
                      ("up_first", "the up rows first: not decided by reading the code")))
    elif code is not None:
        names["up_proj"] = up = code.up
        spec.set("mlp_kind", "plain", Source("code", code.evidence))
        spec.set("gate_up_layout", "separate", Source("default", "no gate"))
    elif has(f"{mlp}.gate_proj.weight") and has(f"{mlp}.up_proj.weight"):
        names.update(gate_proj="gate_proj", up_proj="up_proj", gate_up_proj="gate_up_proj")
        spec.set("mlp_kind", "gated", src(f"{mlp}.gate_proj.weight", layer))
        spec.set("gate_up_layout", "separate", src(f"{mlp}.gate_proj.weight", layer))
        up = "gate_proj"
    elif has(f"{mlp}.gate_up_proj.weight"):
        names["gate_up_proj"] = "gate_up_proj"
        spec.set("mlp_kind", "gated", src(f"{mlp}.gate_up_proj.weight", layer))
        spec.set("gate_up_layout", "fused", Source("tensor", f"{prefix}.{names['layers']}.{layer}.{mlp}.gate_up_proj.weight: "
                                                             "gate rows, then up rows"))
        up = "gate_up_proj"
    elif ((up := first("plain_up", mlp, ref)) is not None and down is not None
          and getattr(ref.get(f"{mlp}.{up}.weight"), "shape", (0,))[0] == 2 * spec.intermediate_size):
        # An up projection twice the MLP width feeding a down projection of that width: gate rows, then up
        # rows (chatglm's dense_h_to_4h: swiglu's chunk(2), silu(x[0]) * x[1]).
        names["gate_up_proj"] = up
        spec.set("mlp_kind", "gated", src(f"{mlp}.{up}.weight", layer))
        spec.set("gate_up_layout", "fused", Source("tensor", f"{prefix}.{names['layers']}.{layer}.{mlp}.{up}.weight: "
                                                             f"2 * {spec.intermediate_size} rows, gate then up"))
    elif (up := first("plain_up", mlp, ref)) is not None and down is not None:
        names["up_proj"] = up
        spec.set("mlp_kind", "plain", Source("tensor", f"{prefix}.{names['layers']}.{layer}.{mlp}.{up}.weight without a gate"))
        spec.set("gate_up_layout", "separate", Source("default", "no gate"))
    else:
        raise Undetermined(Unknown("mlp_kind", f"{ref_name}'s {mlp} is neither a gated MLP (gate_proj, up_proj, "
                                   "down_proj) nor a plain one (an up projection and a down projection)",
                                   (("gated", "no gate_proj and up_proj, no gate_up_proj"),
                                    ("plain", "no up projection among " + ", ".join(CANDIDATES["plain_up"])
                                     + " with a down projection"))))
    if down is None:
        raise Undetermined(Unknown("names.down_proj", f"{ref_name}'s {mlp} has no down projection the generator "
                                   "knows", tuple((c, "absent") for c in CANDIDATES["down_proj"])))
    names["down_proj"] = down
    spec.set("mlp_bias", has(f"{mlp}.{up}.bias") or has(f"{mlp}.{down}.bias"), src(f"{mlp}.{down}.bias", layer))
    inputs = [p for p in (names.get("gate_proj") if spec.mlp_kind == "gated" and spec.gate_up_layout == "separate"
                          else None, up) if p]
    down_only = has(f"{mlp}.{down}.bias") and not any(has(f"{mlp}.{p}.bias") for p in inputs)
    spec.set("mlp_down_bias_only", down_only,
             src(f"{mlp}.{down}.bias", layer) if not down_only else
             Source("tensor", f"{ref_name}'s {mlp}.{down}.bias, and no bias of {', '.join(inputs)}"))
    if "shared_expert" in names and spec.mlp_kind != "gated":
        raise UnsupportedArchitecture(f"{ref_name}'s {mlp} is not a gated MLP; the generator's mixture-of-experts "
                                      "layers are gated.", where)


def _twice_as_wide(ref: dict, mlp: str, up: str, down: str) -> tuple[int, int] | None:
    """(up rows, down inputs) when the up projection's [out, in] weight has twice the rows the down projection's
    weight takes as inputs, else None."""
    up_w, down_w = ref.get(f"{mlp}.{up}.weight"), ref.get(f"{mlp}.{down}.weight")
    if up_w is None or down_w is None or len(up_w.shape) != 2 or len(down_w.shape) != 2:
        return None
    return (up_w.shape[0], down_w.shape[1]) if up_w.shape[0] == 2 * down_w.shape[1] else None


def _code_block(norms: dict, parallel, code_parallel: bool | None = None,
                residual_norm: str = "") -> tuple[str, str, dict] | None:
    """(block, detail, norm roles) from the norms the layer's forward applies; None for a combination the code
    analysis does not settle (the tensor names decide then)."""
    roles = set(norms)
    if residual_norm:
        if roles != {"attn_post_norm", "mlp_post_norm"}:
            return None
        return "residual_norm", residual_norm, dict(norms)
    ordered = {r: norms[r] for r in ("attn_norm", "attn_post_norm", "mlp_norm", "mlp_post_norm") if r in norms}
    if roles == {"attn_norm", "mlp_norm"} and norms["attn_norm"] == norms["mlp_norm"]:
        return "parallel", "one norm per layer: attention and MLP both read its output", {"attn_norm": norms["attn_norm"]}
    if roles == {"attn_norm", "mlp_norm"}:
        if parallel is True:
            return "parallel", "config.json use_parallel_residual: attention and MLP both read the input", ordered
        if parallel is None and code_parallel is True:
            return "parallel", (f"{norms['mlp_norm']} reads the layer's input, not the attention's output: attention "
                                "and MLP both add to the input"), ordered
        return "pre_norm", f"{norms['attn_norm']} before attention, {norms['mlp_norm']} before MLP", ordered
    if roles == {"attn_norm", "mlp_norm", "attn_post_norm", "mlp_post_norm"}:
        return "sandwich", "norms before and after both attention and MLP", ordered
    if roles == {"attn_post_norm", "mlp_post_norm"}:
        return "post_norm", "norms after attention and after MLP, none before", ordered
    return None


def _layer_flow(sources: dict, ckpt: Checkpoint, layers: str, layer0: dict,
                weightless: set[str], identities: dict | None = None, skip: frozenset = frozenset()
                ) -> dataflow.Layer | None:
    """What the decoder layer's code computes, with every role it names confirmed by a tensor of layer 0; None
    without source. Roles the tensors do not confirm are dropped (the name table decides those); a norm the code
    builds as an identity in layer 0 (`identities`, checked against the tensors) is kept."""
    identities = identities or {}
    if not sources:
        return None
    try:
        config = configured(sources, ckpt.config)
        flow = dataflow.analyze_layer(sources, config, layers, skip) or dataflow.analyze_layer(sources, config,
                                                                                             skip=skip)
    except RecursionError:
        return None
    if flow is None:
        return None

    def present(module: str | None, *projections: str | None) -> bool:
        return module is not None and all(f"{module}.{p}.weight" in layer0 for p in projections if p)

    attn = flow.attention_flow
    if attn is not None and not present(flow.attention_path, attn.q, attn.k, attn.v):
        attn = None
    mlp = flow.mlp_flow
    if flow.mlp_on_layer and mlp is not None:
        if not all(f"{p}.weight" in layer0 for p in (mlp.up, mlp.down)):
            mlp = None
    elif mlp is not None and not present(flow.mlp, mlp.gate, mlp.up, mlp.down):
        mlp = None
    norms = {role: a for role, a in flow.norms.items() if f"{a}.weight" in layer0 or a in weightless
             or role in identities}
    return replace(flow, attention_flow=attn, mlp_flow=mlp, norms=norms)


def _identity_norms(sources: dict, ckpt: Checkpoint, spec: Spec, layers: str, per_layer: dict[int, dict],
                    weightless: set[str]) -> dict[str, identitynorm.Identity]:
    """role -> the layers whose decoder layer builds that norm as nn.Identity() (scaffold.detect.identitynorm),
    where the checkpoint holds the norm's scale in every other layer and in none of those. Only the attention's
    input norm may be one (the port's sequential layer reads it as an identity there); another is refused by name,
    and so is a checkpoint whose tensors say otherwise."""
    if not sources:
        return {}
    try:
        flow = dataflow.analyze_layer(sources, configured(sources, ckpt.config), layers) or dataflow.analyze_layer(
            sources, configured(sources, ckpt.config))
    except RecursionError:
        return None
    out = {}
    for role, attr in (flow.norms.items() if flow is not None else ()):
        if attr in weightless:
            continue
        found = identitynorm.identity_layers(sources, ckpt.config, layers, attr, spec.num_layers, ckpt.config_file,
                                             spec.model_type)
        if found is None:
            continue
        holding = [i for i, tensors in per_layer.items() if f"{attr}.weight" in tensors]
        if sorted(holding) != [i for i in range(spec.num_layers) if i not in found.layers]:
            raise _unsupported(f"a layer norm built as an identity on layers {found.layers} ({found.evidence}), but "
                               f"the checkpoint holds {layers}.N.{attr}.weight in layers {sorted(holding)}",
                               ckpt.config_file, spec.model_type)
        if role != "attn_norm":
            raise _unsupported(f"the {role.replace('_', ' ')} built as an identity on layers {found.layers} "
                               f"({found.evidence}); the port leaves out only the attention's input norm",
                               ckpt.config_file, spec.model_type)
        out[role] = found
    return out


def _qk_norm_built(sources: dict, attn: dataflow.Attention, config: dict, where,
                   model_type: str | None) -> tuple[bool | None, str | None] | None:
    """Whether the attention's __init__ builds its q/k norm for this config, and the layers it builds it in: (False,
    why) where a condition config.json decides is false (Llama 4's `config.use_qk_norm`); (True, evidence) where
    the rest of the condition is the one the rotary embedding runs under (`self.use_rope`: the norm only in layers
    that rotate); (True, None) where it is built unconditionally; (None, why) for a condition on anything else,
    which the caller refuses by name for a norm the code alone shows. None where the class or the assignment is
    not found."""
    found = _classes(sources).get(attn.cls)
    init = next((f for f in found[1].body if isinstance(f, ast.FunctionDef) and f.name == "__init__"),
                None) if found else None
    if init is None or not attn.q_norm:
        return None
    assigned = {_dotted(n.targets[0])[5:]: n.value for n in subtree(init) if isinstance(n, ast.Assign)
                and len(n.targets) == 1 and _dotted(n.targets[0]).startswith("self.")}
    guards: list[ast.expr] = []

    def visit(body: list, tests: list) -> bool:
        for stmt in body:
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and _dotted(stmt.targets[0]) in (f"self.{attn.q_norm}", f"self.{attn.k_norm}")):
                guards.extend(tests)
                return True
            if isinstance(stmt, ast.If) and (visit(stmt.body, [*tests, stmt.test]) or visit(stmt.orelse, tests)):
                return True
        return False

    if not visit(init.body, []):
        return None
    conjuncts = [c for g in guards for c in (g.values if isinstance(g, ast.BoolOp) and isinstance(g.op, ast.And)
                                              else [g])]
    rotary: list[ast.expr] = []
    for test in conjuncts:
        key = _dotted(test)
        if key.startswith("self.") and key.count(".") == 1 and key[5:] in assigned:
            key = _dotted(assigned[key[5:]]) or key  # Cohere's `self.use_qk_norm = config.use_qk_norm`
        if key.startswith(("config.", "self.config.")) and key.count(".") == key.startswith("self.") + 1:
            value = config.get(key.rsplit(".", 1)[-1])
            if value is False or value is None:
                return False, (f"{found[0]}:{test.lineno}: {attn.cls} builds {attn.q_norm} only under "
                               f"`{ast.unparse(test)}`, false in config.json")
            if value is True:
                continue
        resolved = ast.unparse(assigned[key[5:]]) if key.startswith("self.") and key[5:] in assigned else key
        if attn.rotary_guard and attn.rotary_guard_when and resolved == attn.rotary_guard:
            rotary.append(test)
            continue
        return None, (f"q/k norms built under a condition the config does not decide ({found[0]}:{test.lineno}: "
                      f"`{ast.unparse(test)}`)")
    if rotary:
        return True, (f"{found[0]}:{rotary[0].lineno}: {attn.cls} builds {attn.q_norm} only where "
                      f"`{ast.unparse(rotary[0])}`, the condition its rotary embedding runs under")
    return True, None


def _temperature(spec: Spec, sources: dict, attn: dataflow.Attention | None, config: dict, where) -> None:
    """Temperature tuning (Llama 4's): the attention's queries scaled by a function of the positions, read by
    scaffold.detect.temperature; the scale's config keys read by the port at run time."""
    found = _classes(sources).get(attn.cls) if attn is not None else None
    try:
        tuning = temperature.read_temperature(found[1], found[0], attn.q, config,
                                              attn.rotary_guard if attn.rotary_guard_when else None) if found else None
    except temperature.Refused as refused:
        raise _unsupported(str(refused), where, spec.model_type) from None
    if tuning is None or tuning.switch is not None and config.get(tuning.switch) is False:
        why = (Source("code", f"{tuning.evidence}, only under config.{tuning.switch}, false in config.json")
               if tuning is not None else Source("default", "queries not scaled by position"))
        for name in ("attn_temperature_floor_scale", "attn_temperature_scale"):
            spec.set(name, None, why)
        spec.set("attn_temperature_nope_only", False, why)
        return
    for name, key in (("attn_temperature_floor_scale", tuning.floor_key), ("attn_temperature_scale", tuning.scale_key)):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or name.endswith("floor_scale") and value <= 0:
            raise CheckpointError(f"config key {key!r} must be a {'positive ' if 'floor' in name else ''}number, "
                                  f"not {value!r} ({tuning.evidence}).", where)
        spec.set(name, float(value), Source("code", f"{tuning.evidence}: config.json {key}", f"config.{key}"))
    spec.set("attn_temperature_nope_only", tuning.nope_only,
             Source("code", f"{tuning.evidence}, only where the rotary embedding does not run" if tuning.nope_only
                    else f"{tuning.evidence}, in every layer"))


def layer_output_scalar(sources: dict, layers_attr: str | None, layer0: dict) -> tuple[str, str] | None:
    """(attribute, evidence) where the decoder layer's forward multiplies the value it returns, last, by a tensor of
    its own that the checkpoint holds with one element (Gemma 4's `hidden_states *= self.layer_scalar`, a buffer):
    the statement that last assigns the returned name before the return (`x *= self.s`, `x = x * self.s`), or the
    return itself (`return x * self.s`). None where the layer's output is not so scaled."""
    found = dataflow.layer_class(sources, layers_attr) or dataflow.layer_class(sources)
    if found is None:
        return None
    file, cls, _ = found
    forward = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
    if forward is None or not forward.body or not isinstance(forward.body[-1], ast.Return):
        return None
    ret = forward.body[-1]

    def own(node: ast.AST) -> str | None:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            info = layer0.get(node.attr)
            if info is not None and tuple(info.shape) in ((1,), ()):
                return node.attr
        return None

    def product(node: ast.AST, name: str | None) -> str | None:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for a, b in ((node.left, node.right), (node.right, node.left)):
                if own(b) and (name is None or (isinstance(a, ast.Name) and a.id == name)):
                    return own(b)
        return None

    if (attr := product(ret.value, None)) is not None:
        return attr, f"{file}:{ret.lineno}: {ast.unparse(ret)}"
    if not isinstance(ret.value, ast.Name):
        return None
    name = ret.value.id
    last = next((stmt for stmt in reversed(forward.body[:-1]) if any(
        isinstance(t, ast.Name) and t.id == name
        for t in (stmt.targets if isinstance(stmt, ast.Assign) else
                  [stmt.target] if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) else []))), None)
    attr = None
    if isinstance(last, ast.AugAssign) and isinstance(last.op, ast.Mult):
        attr = own(last.value)
    elif isinstance(last, ast.Assign):
        attr = product(last.value, name)
    return (attr, f"{file}:{last.lineno}: {ast.unparse(last)}") if attr else None


def _value_norm(spec: Spec, sources: dict, code_attn, layer0: dict, attn: str, config: dict, where) -> None:
    """The module the attention's code applies to the values alone (Gemma 4's v_norm): ported as an RMS norm over each
    value head without a scale where the checkpoint holds no tensor of it and its class computes an RMS norm;
    refused by name otherwise (a scale of its own, a centered norm), never dropped."""
    v_norm = code_attn.v_norm if code_attn is not None else None
    if not v_norm:
        spec.set("v_norm", "", Source("default", "values as the value projection gives them"))
        return
    held = sorted(r for r in layer0 if r.startswith(f"{attn}.{v_norm}."))
    code = norm_code(sources, v_norm, config)
    if held or code is None or code.centered:
        what = f"holds {', '.join(held)}" if held else "is not an RMS norm the code shows"
        raise _unsupported(f"a norm over the values ({code_attn.v_norm_evidence}) that {what}; the port norms the "
                           "values only as an RMS norm over each head without a scale", where, spec.model_type)
    spec.set("v_norm", v_norm, Source("code", f"{code_attn.v_norm_evidence} ({code.cls}, an RMS norm; the checkpoint "
                                              f"holds no tensor of it: no scale), over each value head"))


def weightless_norm_attributes(sources: dict) -> set[str]:
    """The attributes the code builds with a norm class that holds no parameter (OLMo's OlmoLayerNorm), which
    no tensor of the checkpoint can confirm."""
    classes = weightless_norms(sources)
    return {attr for _f, _c, _fn, attr, value in codekeys.self_assignments(sources)
            if isinstance(value, ast.Call) and codekeys.callee(value) in classes}


def _fused_kv_only(spec: Spec, layer0: dict, attn: str, o_proj: str | None, sources: dict,
                   attn_cls: str) -> tuple[str, list[tuple[str, str, int]]] | None:
    """Keys and values fused in one projection, the queries in another (TeleChat's `query` beside `key_value`): the
    attention holds no q/k/v-sized tensor but one [2 x KV heads x head_dim, hidden] tensor, the KV heads dividing
    the query heads, beside one [heads x head_dim, hidden] tensor other than the output projection; and the
    attention's class builds no other nn.Linear (a Llama attention whose v_proj tensor is missing is a broken
    checkpoint, not this form). Returns the refusal naming the pair, and the (key-value, query, KV heads)
    readings the shapes allow (two where both are as tall): the code (kvpairs) says which it is and how the pair's
    rows are cut; where it does not, the form is refused by what the tensors and the code show, not left as an
    unknown field that no spec file could set either."""
    hidden, dim, heads = spec.hidden_size, spec.head_dim, spec.num_heads
    if not dim:
        return None
    mats = {rest[len(attn) + 1:-len(".weight")]: info.shape[0] for rest, info in layer0.items()
            if rest.startswith(attn + ".") and rest.endswith(".weight") and rest.count(".") == attn.count(".") + 2
            and len(info.shape) == 2 and info.shape[1] == hidden and rest != f"{attn}.{o_proj}.weight"}
    kv = [(name, rows // (2 * dim)) for name, rows in mats.items()
          if rows != heads * dim and rows % (2 * dim) == 0 and rows and heads % (rows // (2 * dim)) == 0]
    queries = sorted(name for name, rows in mats.items() if rows == heads * dim)
    linears = {attr for _f, cls, _fn, attr, value in codekeys.self_assignments(sources)
               if cls.name == attn_cls and isinstance(value, ast.Call) and codekeys.callee(value) == "Linear"}
    if linears - {o_proj} != set(mats):
        return None
    said = "; the port fills its fused q/k/v projection from q, k and v tensors or one tensor holding all three"
    if not kv and len(queries) == 2 and 2 * spec.num_kv_heads == heads:
        # As tall as each other (KV heads half the query heads): the shapes cannot say which is which.
        refusal = (f"keys and values fused in one projection without the queries: layer 0's {attn}.{queries[0]} "
                   f"and {attn}.{queries[1]} both hold {heads * dim} rows, the {heads} query heads of {dim} in one, "
                   f"keys and values for {spec.num_kv_heads} KV heads in the other{said}")
        return refusal, [(queries[0], queries[1], spec.num_kv_heads), (queries[1], queries[0], spec.num_kv_heads)]
    if len(kv) != 1 or len(queries) != 1 or any(rows == (heads + 2 * kv[0][1]) * dim for rows in mats.values()):
        return None
    name, kv_heads = kv[0]
    refusal = (f"keys and values fused in one projection without the queries: layer 0's {attn}.{name} holds "
               f"{2 * kv_heads * dim} rows, keys and values for {kv_heads} KV head(s) of {dim}, beside "
               f"{attn}.{queries[0]} with the {heads * dim} rows of the {heads} query heads{said}")
    return refusal, [(name, queries[0], kv_heads)]


def _kv_pairs(sources: dict, config: dict, attn_cls: str,
              readings: list[tuple[str, str, int]]) -> tuple[kvpairs.Pairs, str, str, int] | str | None:
    """The one reading of the key-value / query pair whose key-value output the attention's code views per KV head
    and cuts in two (kvpairs.read), with what it read; the code's reason where it cuts one but does not say which
    half is the key; None where no reading is cut so (the pair stays refused)."""
    found = [(read, kv, query, kv_heads) for kv, query, kv_heads in readings
             if (read := kvpairs.read(sources, attn_cls, kv, query, config)) is not None]
    if len(found) != 1:
        return None
    read = found[0][0]
    return read if isinstance(read, str) else found[0]


def _kv_pairs_layout(ckpt: Checkpoint, spec: Spec, names: dict, module: str, read: kvpairs.Pairs, kv: str,
                     query: str, kv_heads: int) -> None:
    """qkv_layout "kv_pairs": the queries from `query`, the keys and values from `kv`, whose rows hold per KV head
    its key rows then its value rows (or the values first), as the code cuts them."""
    if not read.key_first:
        raise _unsupported(f"keys and values fused in one projection, each KV head's value rows before its key rows "
                           f"({read}: {module}.{kv}); the port cuts each head's key rows first", ckpt.config_file,
                           spec.model_type)
    names.update(q_proj=query, kv_proj=kv, qkv_proj="qkv_proj")
    names.pop("k_proj", None)
    names.pop("v_proj", None)
    spec.set("qkv_layout", "kv_pairs",
             Source("code", f"{read}: {read.cls} views {kv}'s output per KV head as [..., heads, 2 * head_dim] and "
                            f"cuts each head's row into its key, then its value; the queries from {query}"))
    if kv_heads != spec.num_kv_heads:
        spec.set("num_kv_heads", kv_heads,
                 Source("tensor", f"{module}.{kv}.weight holds {2 * kv_heads * spec.head_dim} rows: a key and a "
                                  f"value of {spec.head_dim} for each of {kv_heads} KV heads"))


def _undecided(flow: dataflow.Layer | None) -> str:
    """Why the code did not decide, for an error message."""
    if flow is None or not flow.undecided:
        return ""
    return f"; its code does not say which projection is which: {'; '.join(flow.undecided)}"


def _code_qkv(ckpt: Checkpoint, spec: Spec, names: dict, code: dataflow.Attention, module: str,
              layer0: dict) -> None:
    """q/k/v names, layout and bias from the attention's code."""
    attn = attention_module(names)
    source = Source("code", code.evidence)
    if code.layout == "separate":
        names.update(q_proj=code.q, k_proj=code.k, v_proj=code.v, qkv_proj="qkv_proj")
    else:
        names["qkv_proj"] = code.q
    spec.set("qkv_layout", code.layout, source)
    if code.layout == "fused":
        _fused_kv_heads(ckpt, spec, f"{module}.{code.q}.weight")
    elif code.layout == "interleaved":
        _one_kv_head_per_head(ckpt, spec, f"{module}.{code.q}.weight")
    elif code.layout == "grouped":
        _grouped_rows(ckpt, spec, f"{module}.{code.q}.weight")
    elif code.layout == "blocked":
        _blocked_rows(ckpt, spec, f"{module}.{code.q}.weight", code.qkv_blocks)
        spec.set("qkv_blocks", code.qkv_blocks, source)
        spec.set("qkv_block_order", code.qkv_block_order, source)
    spec.set("qkv_bias", f"{attn}.{code.q}.bias" in layer0, Source("tensor", f"{module}.{code.q}.bias"))


def _fused_kv_heads(ckpt: Checkpoint, spec: Spec, tensor: str) -> None:
    """q, k, v one after another: the KV head count the rows hold, where the config's differs (multi-query
    c_attn, q then one k and one v head, under a config flag such as gpt_bigcode's multi_query)."""
    shape = ckpt.tensors[tensor].shape
    if len(shape) != 2 or spec.hidden_size not in shape:
        return
    rows = shape[1] if shape[0] == spec.hidden_size and shape[1] != spec.hidden_size else shape[0]  # [in, out]?
    q, dim = spec.num_heads * spec.head_dim, spec.head_dim
    if rows == q + 2 * spec.num_kv_heads * dim or rows <= q or (rows - q) % (2 * dim):
        return  # as the config says, or rows the attention's shape check will name
    kv = (rows - q) // (2 * dim)
    if kv and spec.num_heads % kv == 0:
        spec.set("num_kv_heads", kv, Source("tensor", f"{tensor}: {q} query rows, then {kv} key and {kv} value "
                                                      f"head(s) of {dim}"))


def _grouped_rows(ckpt: Checkpoint, spec: Spec, tensor: str) -> None:
    """Grouped per KV head: each of num_kv_heads groups holds its heads / kv_heads query heads, a key and a value."""
    rows = ckpt.tensors[tensor].shape[0]
    heads, kv, dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
    if kv <= 0 or heads % kv or rows != (heads + 2 * kv) * dim:
        raise CheckpointError(f"tensor {tensor} has {rows} rows; q, k, v grouped per KV head over {heads} heads and "
                              f"{kv} KV heads of size {dim} needs {(heads + 2 * kv) * dim}.", ckpt.config_file)


def _blocked_rows(ckpt: Checkpoint, spec: Spec, tensor: str, blocks: int) -> None:
    """q, k, v in `blocks` equal blocks, each cut into three equal parts: as many KV heads as query heads, and
    whole heads in every part."""
    _one_kv_head_per_head(ckpt, spec, tensor)
    if blocks <= 0 or spec.num_heads % blocks:
        raise CheckpointError(f"tensor {tensor}: the code cuts it into {blocks} blocks of q, k and v parts, which "
                              f"do not hold whole heads of {spec.num_heads}.", ckpt.config_file)


def _one_kv_head_per_head(ckpt: Checkpoint, spec: Spec, tensor: str) -> None:
    """Per-head interleaved q/k/v has as many KV heads as query heads, whatever the config says."""
    rows = ckpt.tensors[tensor].shape[0]
    if rows != 3 * spec.num_heads * spec.head_dim:
        raise CheckpointError(f"tensor {tensor} has {rows} rows; per-head q/k/v over {spec.num_heads} heads of "
                              f"size {spec.head_dim} needs {3 * spec.num_heads * spec.head_dim}.", ckpt.config_file)
    spec.set("num_kv_heads", spec.num_heads, Source("tensor", f"{tensor}: q, k and v rows for every head",
                                                    spec.source("num_heads").expr))


def _gated_norms(ckpt: Checkpoint, spec: Spec, names: dict, sources: dict, per_layer: dict, stack: str,
                 where: str) -> str | None:
    """Norms gated by a small MLP of their own output (scaffold.detect.gatednorm, A.X-K2's): the layers' tensors
    are read from here on as the plain norm's (`input_layernorm.norm.weight` as `input_layernorm.weight`), the gate
    MLP's linears checked against the code's form and set aside; the spec keeps the names to build them under."""
    try:
        found = gatednorm.read(sources, ckpt.config, names["layers"].rsplit(".", 1)[-1], len(per_layer)) \
            if sources else None
    except gatednorm.Refused as exc:
        raise _unsupported(f"a norm gated by a module of its own output, not in the form the port builds ({exc})",
                           where, spec.model_type) from None
    none = Source("default", "the layer's norms are plain")
    if found is None:
        for field in ("gated_norms", "gated_norms_conditional", "gated_norm_layers", "gated_norm_parts",
                      "gated_norm_acts"):
            spec.set(field, [], none)
        spec.set("gated_norm_condition", "", none)
        spec.set("gated_norm_rank", "", none)
        return None
    inner, gate, up, down = found.parts
    table = renamings.renamings(ckpt)  # transformers' renames on load (A.X-K2's W_down -> mlp.fc1)
    held = f"{gate}." if gate else ""  # the gate's linears in a module of their own, or the norm's
    code_parts = {f"{inner}.weight": "inner", f"{held}{up}.weight": "up", f"{held}{down}.weight": "down"}
    hidden = rank = None
    ckpt_parts: dict[str, str] = {}
    for attr, layers in found.layers.items():
        for i, tensors in per_layer.items():
            mine = sorted(r for r in tensors if r.startswith(f"{attr}."))
            as_code = {renamings.code_name(table, f"{stack}.{i}.{r}")[len(f"{stack}.{i}.{attr}."):]: r for r in mine}
            if i not in layers:
                if set(as_code) & set(code_parts):
                    raise _unsupported(f"layer {i} holds a gated norm's tensors at {stack}.{i}.{attr} where the code "
                                       f"builds a plain norm ({found.evidence})", where, spec.model_type)
                continue
            if set(as_code) != set(code_parts):
                raise _unsupported(f"layer {i}'s gated norm {stack}.{i}.{attr} holds {mine}, not the norm's weight and "
                                   f"the gate's two linears the code builds ({found.evidence})", where,
                                   spec.model_type)
            names_here = {code_parts[c]: r for c, r in as_code.items()}
            up_shape = tuple(tensors[names_here["up"]].shape)
            down_shape = tuple(tensors[names_here["down"]].shape)
            norm_shape = tuple(tensors[names_here["inner"]].shape)
            if len(up_shape) != 2 or down_shape != up_shape[::-1] or norm_shape != up_shape[1:]:
                raise _unsupported(f"layer {i}'s gated norm {stack}.{i}.{attr}: its gate's linears {up_shape}, "
                                   f"{down_shape} do not map the norm's {norm_shape} width to a rank and back",
                                   where, spec.model_type)
            hidden, rank = up_shape[1], up_shape[0]
            for part, rest in names_here.items():
                ckpt_parts[part] = rest[len(attr) + 1:].removesuffix(".weight")
            tensors[f"{attr}.weight"] = tensors.pop(names_here["inner"])
            del tensors[names_here["up"]], tensors[names_here["down"]]
    # The port keeps the checkpoint's names: the gate's linears in a module of their own (the code's `mlp.fc1`)
    # or held by the norm itself (A.X-K2's checkpoints: `W_down`, `W_up`).
    up_path, down_path = ckpt_parts["up"].split("."), ckpt_parts["down"].split(".")
    if ("." in ckpt_parts["inner"] or len(up_path) != len(down_path) or len(up_path) > 2
            or up_path[:-1] != down_path[:-1]):
        raise _unsupported(f"the gated norm's tensors sit at {ckpt_parts['inner']}, {ckpt_parts['up']}, "
                           f"{ckpt_parts['down']}, deeper than the port's gated norm builds them", where,
                           spec.model_type)
    port_parts = [ckpt_parts["inner"], up_path[0] if len(up_path) == 2 else "", up_path[-1], down_path[-1]]
    conditional = list(found.conditional)
    every = [a for a in found.attrs if a not in conditional]
    key = found.rank.removeprefix("config.")
    if not key.isidentifier() or ckpt.config.get(key) != rank:
        raise _unsupported(f"the gated norm's MLP is {rank} wide in the checkpoint, and the code builds it "
                           f"{found.rank} wide ({ckpt.config.get(key) if key.isidentifier() else '?'} in config.json)",
                           where, spec.model_type)
    source = Source("code", found.evidence)
    spec.set("gated_norms", every, source)
    spec.set("gated_norms_conditional", conditional, source)
    spec.set("gated_norm_condition", found.condition if conditional else "",
             Source("code", found.evidence, found.condition) if conditional else source)
    spec.set("gated_norm_layers", found.layers[conditional[0]] if conditional else [], source)
    spec.set("gated_norm_parts", port_parts, Source("code", f"{found.evidence}; as the checkpoint names them"))
    spec.set("gated_norm_acts", [found.mlp_act, found.gate_act], source)
    spec.set("gated_norm_rank", found.rank, Source("code", f"{found.evidence}; {stack}.*.{found.attrs[0]}."
                                                           f"{ckpt_parts['up']}.weight: [{rank}, {hidden}]", found.rank))
    return found.norm_class


def _norms_and_block(ckpt: Checkpoint, spec: Spec, names: dict, layer0: dict, sources: dict, inside: dict,
                     weightless_attributes: set[str], flow: dataflow.Layer | None = None, ref: int = 0,
                     gated_inner: str | None = None) -> None:
    """The block and the norms' kind, read from the tensors of layer `ref` (`layer0`: the first layer that builds
    every norm, 0 unless some are identities there)."""
    where = ckpt.config_file
    have = {n for n in NORMS if f"{n}.weight" in layer0}
    parallel = ckpt.config.get("use_parallel_residual")
    from_code = _code_block(flow.norms if flow is not None else {}, parallel,
                            flow.mlp_norm_parallel if flow is not None else None,
                            flow.residual_norm if flow is not None else "")
    if from_code is not None:
        # The layer's forward says which norm each sublayer reads, and which follow them.
        block, detail, roles = from_code
        names.update(roles)
    elif have == set(NORMS):
        block, detail = "sandwich", "norms before and after both attention and MLP"
        names.update(attn_norm="input_layernorm", attn_post_norm="post_attention_layernorm",
                     mlp_norm="pre_feedforward_layernorm", mlp_post_norm="post_feedforward_layernorm")
    elif have == {"post_attention_layernorm", "post_feedforward_layernorm"}:
        block, detail = "post_norm", "norms after attention and after MLP, none before"
        names.update(attn_post_norm="post_attention_layernorm", mlp_post_norm="post_feedforward_layernorm")
    elif have == {"input_layernorm", "post_attention_layernorm"}:
        names.update(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm")
        if parallel is True:
            block, detail = "parallel", "config.json use_parallel_residual: attention and MLP both read the input"
        else:
            block, detail = "pre_norm", "input_layernorm before attention, post_attention_layernorm before MLP"
    elif have == {"input_layernorm"}:
        names["attn_norm"] = "input_layernorm"
        block, detail = "parallel", "one norm per layer: attention and MLP both read its output"
    else:
        raise Undetermined(Unknown("block", f"layer 0 has the norms {sorted(have) or 'none'}, a block layout the "
                                   "generator does not know", tuple((n, "absent") for n in NORMS if n not in have)))
    if parallel is False and block == "parallel":
        raise _unsupported("config.json use_parallel_residual is false but each layer has one norm", where,
                           spec.model_type)
    if ckpt.config.get("do_layer_norm_before") is False and block != "residual_norm":
        # OPT-350m: each norm applies to the sum of the residual and the sublayer's output. Ported where the
        # layer's code shows that (block residual_norm); a layout read from names alone would put them before.
        raise _unsupported("layer norms applied after each residual add (post-LN: config.json "
                           "do_layer_norm_before = false), which the layer's code does not show", where,
                           spec.model_type)
    spec.set("block", block, Source("code", detail) if block == "residual_norm" else Source("tensor", detail))

    norm_attr = names.get("attn_norm") or names.get("attn_post_norm")
    gated = norm_attr in (*spec.gated_norms, *spec.gated_norms_conditional)
    # A gated norm computes as the norm inside it (gatednorm), the gate apart.
    code = norm_code(sources, norm_attr, ckpt.config, gated_inner if gated else None)
    has_bias = f"{norm_attr}.bias" in layer0
    if code is not None:
        kind = "layer" if code.centered else "rms"
        spec.set("norm_kind", kind, Source("code", f"{code.where}: {code.cls} "
                                                   f"{'subtracts the mean' if code.centered else 'is an RMS norm'}"))
        spec.set("norm_offset", code.weight_offset,
                 Source("code", f"{code.where}: {code.cls} scales by "
                                f"{'(1 + weight)' if code.weight_offset else 'weight'}"))
    else:
        spec.set("norm_kind", "layer" if has_bias else "rms",
                 Source("tensor", f"{norm_attr}.bias {'present' if has_bias else 'absent'} (no modeling source)"))
        spec.set("norm_offset", 0.0, Source("default", "norm output is x_normed * weight"))
    if has_bias and spec.norm_kind == "rms":
        raise _unsupported(f"{norm_attr} has a bias but its code is an RMS norm", where, spec.model_type)
    spec.set("norm_bias", has_bias, Source("tensor", f"{names['model']}.{names['layers']}.{ref}.{norm_attr}.bias"))
    weightless = f"{norm_attr}.weight" not in layer0 and norm_attr in weightless_attributes
    spec.set("norm_weightless", weightless,
             Source("code", f"{code.where}: {code.cls} holds no parameter") if weightless and code is not None
             else Source("tensor", f"{names['model']}.{names['layers']}.{ref}.{norm_attr}.weight"))
    if weightless and code is not None:
        spec.set("norm_offset", 0.0, Source("code", f"{code.where}: {code.cls} has no scale"))
    qk_weightless = spec.qk_norm != "none" and f"{attention_module(names)}.{names['q_norm']}.weight" not in layer0
    # Weightless q/k norms beside layer norms with a scale are their own field (Llama 4's); the other way is not.
    if spec.qk_norm != "none" and qk_weightless != weightless and not (qk_weightless and spec.qk_norm_weightless):
        raise _unsupported("q/k norms and layer norms that differ in holding parameters", where, spec.model_type)
    final_bias = f"{names['norm']}.bias" in inside if "norm" in names else has_bias
    if final_bias != has_bias:
        raise _unsupported("the final norm and the layer norms differ in having a bias", where, spec.model_type)
    _embedding_norm(spec, sources, names, where, weightless_attributes, ckpt.config)


def _head_transform(ckpt: Checkpoint, spec: Spec, names: dict, transform) -> None:
    """names and fields of a transform before the head (scaffold.detect.headtransform); its activation must be one
    vLLM's registry and transformers' ACT2FN both know. Its norm is checked against the layers' in _norms_and_block."""
    where = ckpt.config_file
    names.update(head_transform=transform.module, head_dense=transform.dense, head_norm=transform.norm)
    said = f"{transform.where}: the head reads {transform.cls}'s norm(act(linear(h)))"
    if transform.act_key is not None:
        spec.set("head_act", transform.act_name, Source("config", f"config.json {transform.act_key} ({said})",
                                                        f"config.{transform.act_key}"))
    else:
        spec.set("head_act", transform.act_name, Source("code", said))
    registry, known = vllm_registry(), transformers_activations()
    if registry is not None and (transform.act_name.lower() not in registry.plain
                                 or known is not None and transform.act_name not in known):
        raise _unsupported(f"the activation {transform.act_name!r} of the transform before the head "
                           f"({transform.cls}.{transform.act}) is not one vLLM's activation registry and "
                           "transformers' ACT2FN both know", where, spec.model_type)
    dense = f"{transform.module}.{transform.dense}"
    info = ckpt.tensors.get(f"{dense}.weight")
    if info is None or info.shape != (spec.hidden_size, spec.hidden_size):
        raise CheckpointError(f"tensor {dense}.weight must exist with shape [{spec.hidden_size}, "
                              f"{spec.hidden_size}] (the transform before the head maps the hidden width to "
                              "itself).", where)
    built = f" (built with bias={transform.dense_bias})" if transform.dense_bias else ""
    spec.set("head_dense_bias", f"{dense}.bias" in ckpt.tensors, Source("tensor", f"{dense}.bias{built}"))


def _head_norm(ckpt: Checkpoint, spec: Spec, names: dict, sources: dict, flow, built: tuple) -> None:
    """The norm of a transform before the head is built as the layers' norms are (the port builds it so): the same
    class and arguments, and a bias where they have one."""
    where = ckpt.config_file
    norm = f"{names['head_transform']}.{names['head_norm']}"
    layer = dataflow._class(sources, flow.cls) if flow is not None else None
    layer_norms = {submodules.constructor(layer[1], a) for a in flow.norms.values()} - {None} if layer else set()
    if layer_norms != {built}:
        shown = ", ".join(f"{c}({', '.join(('...',) + a)})" for c, a in sorted(layer_norms)) or "unknown"
        raise _unsupported(f"the norm {norm} of the transform before the head is built as {built[0]}"
                           f"({', '.join(('...',) + built[1])}), the layers' norms as {shown}; the port builds them "
                           "alike", where, spec.model_type)
    if (f"{norm}.bias" in ckpt.tensors) != spec.norm_bias or f"{norm}.weight" not in ckpt.tensors:
        raise _unsupported(f"the norm {norm} of the transform before the head differs from the layers' norms in its "
                           "tensors (weight, bias)", where, spec.model_type)


def _embedding_norm(spec: Spec, sources: dict, names: dict, where, weightless: set[str],
                    config: dict | None = None) -> None:
    """Whether the base model's forward normalizes the embeddings before the layers: with a norm of its own
    (names.embed_norm, BLOOM's word_embeddings_layernorm) or with its final norm (NanoChat's
    `hidden_states = self.norm(inputs_embeds)`); another norm there is refused by name."""
    if "embed_norm" in names:
        attr = names["embed_norm"].rsplit(".", 1)[-1]
        found = _norms_before_layers(sources, {attr}) if "." not in names["embed_norm"] else [
            (path, file, line) for path, file, line in _embedding_module_norms(sources) if path == names["embed_norm"]]
        said = f"{found[0][1]}:{found[0][2]}: self.{attr}" if found else f"names.embed_norm ({attr})"
        spec.set("embedding_norm", True, Source("code" if found else "default",
                                                f"{said}, a norm of its own, normalizes the embeddings before the "
                                                "first layer"))
        return
    final = names["norm"].rsplit(".", 1)[-1] if "norm" in names else None

    embed = names["embed_tokens"].rsplit(".", 1)[-1] if "embed_tokens" in names else None

    def norms(ll) -> set[str]:
        # The final norm, and what else the class builds as a norm (a parameter-free norm class, or a class whose
        # name says norm: a hint, the call's place before the loop is what counts). Only in a class that builds
        # the token embedding: a vision tower's layer list in the same file (MiniMax-M3-VL's pre_layrnorm before
        # its encoder layers) is not the language model's.
        built = {a for _f, c, _fn, a, _v in codekeys.self_assignments(sources) if c.name == ll.owner}
        if embed is not None and embed not in built:
            return set()
        return {final} | {a for _f, c, _fn, a, v in codekeys.self_assignments(sources)
                          if c.name == ll.owner and isinstance(v, ast.Call)
                          and (a in weightless or "norm" in codekeys.callee(v).lower())}

    found = _norms_before_layers(sources, norms, names["layers"].rsplit(".", 1)[-1], config)
    if not found:
        spec.set("embedding_norm", False, Source("default", "the embeddings reach the first layer as they are"))
        return
    attr, file, line = found[0]
    if attr != final:
        raise _unsupported(f"a norm on the embeddings ({attr}) other than the final norm", where, spec.model_type)
    spec.set("embedding_norm", True, Source("code", f"{file}:{line}: self.{attr} normalizes the embeddings "
                                                    "before the first layer"))


def _own_output_bias(ckpt: Checkpoint, spec: Spec, sources: dict, per_layer: dict, attn: str, o_proj: str,
                     code_attn, where) -> None:
    """An output bias the attention holds as a parameter of its own, beside an output projection without one, and
    the decoder layer adds (GPT-NeoX-Japanese's dense_bias, last layer only): scaffold.detect.outbias."""
    # Set only where found (the fields' defaults say none): a layout stopped early names no such field as unknown.
    held = sorted({rest.split(".", 2)[1] for tensors in per_layer.values() for rest, info in tensors.items()
                   if rest.startswith(f"{attn}.") and rest.count(".") == 1 and len(info.shape) == 1
                   and info.shape[0] == spec.hidden_size and rest.split(".", 1)[1] not in ("weight", "bias")
                   and rest.split(".", 1)[1] != spec.attention_sinks})
    if code_attn is None or not sources or len(held) != 1 or spec.o_bias:
        return
    param = held[0]
    layers = [i for i, tensors in per_layer.items() if f"{attn}.{param}" in tensors]
    found = outbias.code_output_bias(sources, ckpt.config, spec.names["layers"].rsplit(".", 1)[-1], o_proj,
                                     spec.num_layers, layers, param, where, spec.model_type)
    if found is None:
        return
    spec.set("o_bias_param", param, Source("code", found.evidence))
    spec.set("o_bias_layers", found.layers, Source("code", f"{found.evidence}: the layers where {found.expr}",
                                                   found.expr))


def _layer_sources(ckpt: Checkpoint, spec: Spec, found) -> None:
    """The spec's KV-shared layers (their source layers) and keys-as-values layers, as kvshare or handoff read them."""
    if found.shared:
        spec.set("kv_share_layers", sorted(found.shared), Source("code", found.evidence))
        spec.set("kv_share_sources", [found.shared[i] for i in sorted(found.shared)],
                 Source("code", found.store_line or found.evidence))
    if found.k_eq_v:
        spec.set("k_eq_v_layers", found.k_eq_v, Source("code", found.evidence))
    if found.shared or found.k_eq_v:
        read = {key: ckpt.config[key] for key in found.config_keys if _plain_value(ckpt.config.get(key))}
        spec.set("kv_share_config", read, Source("config", f"config.json {', '.join(read)}: what the reading of "
                                                           f"the layers' keys and values followed"))


def _plain_value(value) -> bool:
    """A number, a string or a list of them (what a port can compare with its config's attribute)."""
    scalar = (bool, int, float, str)
    return isinstance(value, scalar) or isinstance(value, list) and all(isinstance(v, scalar) for v in value)
