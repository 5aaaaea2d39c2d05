"""What a generated port can express, checked on the checkpoint as read: policy, kept out of the reader.

The reader (scaffold.checkpoint) makes sure files are what they claim and bounded; this module refuses what no
native port computes (state-space and linear-attention blocks, named as such before detection stumbles on them)
and the shapes config.json fixes for a decoder of the common (Llama) layout. `check` runs both; detection
(scaffold.detect.understand) and the choice between generators (scaffold.choose) run it first.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from scaffold.checkpoint import Checkpoint, TensorInfo
from scaffold.detect import (
    altup,
    branches,
    codekeys,
    dataflow,
    forms,
    headsizes,
    hyperconn,
    kvshare,
    layerheads,
    layerinputs,
    layerwidths,
    sourcecode,
    streams,
)
from scaffold.detect.common import config_value, unsupported
from scaffold.errors import CheckpointError, UnsupportedArchitecture


def check(ckpt: Checkpoint) -> None:
    """Refuse a checkpoint no native port expresses, or whose tensors contradict its config.json."""
    unsupported_blocks(ckpt.config, ckpt.tensors, ckpt.config_file, lambda hits: not_code_attention(ckpt, hits))
    try:
        check_shapes(ckpt.config, ckpt.tensors, ckpt.config_file, layer_sized_modules(ckpt), layer_sizes(ckpt))
    except CheckpointError as exc:
        # Attention tensors that contradict heads x head_dim: where the code builds them so, that is the feature.
        sizes = head_sizes(ckpt) if ".self_attn." in exc.problem else None
        if sizes is not None and sizes.problems:
            raise unsupported(f"attention sizes the port does not build: {sizes.cls} ({sizes.file}:{sizes.line}) "
                              f"has {'; '.join(sizes.problems)} ({exc.problem.rstrip('.')})", ckpt.config_file,
                              ckpt.config.get("model_type")) from None
        if sizes is not None:
            # KV heads of each layer's own, value heads of their own width (MiMo-V2's), read from the code: the
            # shapes are checked against those, layer by layer (scaffold.detect.attention checks each projection).
            check_shapes(ckpt.config, ckpt.tensors, ckpt.config_file, layer_sized_modules(ckpt), sizes)
            return
        explained = attention_sizes_explained(ckpt) if ".self_attn." in exc.problem else None
        if explained is None and (by_layer := _sized_by_layer(ckpt, exc.problem)):
            raise unsupported(f"a module sized from the layer's index: {by_layer} ({exc.problem.rstrip('.')}); the "
                              "port builds that module alike in every layer", ckpt.config_file,
                              ckpt.config.get("model_type")) from None
        if explained is None:
            raise
        # The other form of its own the model holds, named too: porting the sizes alone would not make it port.
        besides = layerinputs.per_layer_inputs(sourcecode.modeling_sources(ckpt), ckpt.tensors)
        raise unsupported(f"{explained} ({exc.problem.rstrip('.')})"
                          + (f"; besides, {besides.short()}" if besides else ""), ckpt.config_file,
                          ckpt.config.get("model_type")) from None
    # Several copies of the residual stream handed through the layers (Gemma-3n's AltUp, hyper-connections' streams):
    # the port's layers carry one, and the forms a layer computes on one copy are read only where it has one.
    sources = sourcecode.modeling_sources(ckpt)
    several = streams.read(sources)
    form = None  # Gemma-3n's AltUp, where the stacked copies are read as it (altup.read)
    if several is not None and several.expanded:
        # Hyper-connections: ported where the mixers, the layer and the head compute the port's form
        # (scaffold.detect.hyperconn), refused naming what differs otherwise.
        try:
            hyperconn.read(sources, ckpt.config)
        except hyperconn.Refused as exc:
            raise unsupported(str(exc) + _behind_streams(ckpt, sources), ckpt.config_file,
                              ckpt.config.get("model_type")) from None
    elif several is not None:
        # Stacked copies: ported where the model and its layers compute vLLM's Gemma-3n AltUp (scaffold.detect.altup).
        try:
            form = altup.read(sources, ckpt.config, ckpt.tensors)
        except altup.Refused as exc:
            raise unsupported(f"{several}; {exc}" + _behind_streams(ckpt, sources), ckpt.config_file,
                              ckpt.config.get("model_type")) from None
        if form is None:
            raise unsupported(str(several) + _behind_streams(ckpt, sources), ckpt.config_file,
                              ckpt.config.get("model_type"))
    # A second embedding of the token ids handed to each decoder layer (Gemma 3n's and Gemma 4's PLE): ported where
    # the code computes vLLM's form of it (scaffold.detect.layerinputs.read), refused naming what differs otherwise.
    try:
        layerinputs.read(sourcecode.modeling_sources(ckpt), ckpt.config, ckpt.tensors,
                         form)
    except layerinputs.Refused as exc:
        raise unsupported(str(exc), ckpt.config_file, ckpt.config.get("model_type")) from None


def _behind_streams(ckpt: Checkpoint, sources: dict) -> str:
    """What else the layers compute that the port does not, named behind the copies of the residual stream: the
    per-layer inputs where the port computes them otherwise, a low-rank residual branch, a cutoff on a projection's
    output on the layers config.json takes it (scaffold.detect.branches), keys and values a module of the attention
    appends (DeepSeek-V4's compressor, forms.appended_keys)."""
    behind = []
    try:
        layerinputs.read(sources, ckpt.config, ckpt.tensors)
    except layerinputs.Refused as exc:
        behind.append(str(exc))
    layers = ckpt.config.get("num_hidden_layers")
    behind += [found for found in (branches.low_rank_branch(sources),
                                   branches.gate_cutoff(sources, ckpt.config, layers) if _is_int(layers) else None,
                                   forms.appended_keys(sources, ckpt.config))
               if found]
    return f"; behind it, {'; '.join(behind)}" if behind else ""


def _sized_by_layer(ckpt: Checkpoint, problem: str) -> str | None:
    """For check_shapes' 'the same module must have the same shape in every layer': where the decoder layer's
    submodule holding the two tensors computes a size of its own from the layer's index (kvshare.sizes_by_layer)."""
    names = re.findall(r"'([^']+)'", problem)
    parts = [_LAYER_PARTS.match(n) for n in names[:2]]
    sources = sourcecode.modeling_sources(ckpt)
    if len(parts) != 2 or not all(parts) or not sources:
        return None
    module = parts[0].group(3).split(".", 1)[0]
    return kvshare.sizes_by_layer(sources, ckpt.config, module, (int(parts[1].group(2)), int(parts[0].group(2))))


def head_sizes(ckpt: Checkpoint) -> headsizes.HeadSizes | None:
    """The attention's KV heads per layer and value head width as its __init__ builds them (scaffold.detect.
    headsizes), where the code sizes some layer's KV heads or the values otherwise than heads x head_dim (with
    the problems that keep the port from building them, if any); None otherwise."""
    sources = sourcecode.modeling_sources(ckpt)
    layers = ckpt.config.get("num_hidden_layers")
    if not sources or not _is_int(layers) or layers <= 0:
        return None
    sizes = headsizes.read(sources, ckpt.config, None, layers)
    if sizes is None or not (sizes.kv_expr or sizes.v_width or sizes.problems):
        return None
    return sizes


def layer_sized_modules(ckpt: Checkpoint) -> list[tuple[str, str, list[int]]]:
    """(module, KEY, one count per layer) wherever a decoder layer's __init__ builds `self.<module> = Class(...,
    config.KEY[layer_idx], ...)` and config.json's KEY holds one positive count per layer (Laguna's
    `self.self_attn = LagunaAttention(config, layer_idx, config.num_attention_heads_per_layer[layer_idx])`): that
    module's tensors may differ from layer to layer. scaffold.detect.layout reads what the count sizes (the
    attention's query heads) and refuses any other such module; for self_attn the count is the heads o_proj takes."""
    layers = _layer_count(ckpt)
    found = []
    for _file, tree in sourcecode._parsed(sourcecode.modeling_sources(ckpt)):
        for node in sourcecode.subtree(tree):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call)
                    and isinstance(node.targets[0], ast.Attribute)
                    and ast.unparse(node.targets[0].value) == "self"):
                continue
            for arg in [*node.value.args, *(k.value for k in node.value.keywords)]:
                if not (isinstance(arg, ast.Subscript) and isinstance(arg.slice, ast.Name)
                        and isinstance(arg.value, ast.Attribute)
                        and ast.unparse(arg.value.value) in ("config", "self.config")):
                    continue
                value = ckpt.config.get(arg.value.attr)
                if (isinstance(value, list) and len(value) == layers
                        and all(_is_int(v) and v > 0 for v in value)):
                    found.append((node.targets[0].attr, arg.value.attr, value))
    # A module whose own __init__ takes its width from config.KEY[layer_idx] (Gemma-3n's MLP; scaffold.detect.sizes
    # checks each layer's tensors against its width).
    for attr, key, _where in layerwidths.per_layer_widths(sourcecode.modeling_sources(ckpt), "config.hidden_size"):
        value = ckpt.config.get(key)
        if isinstance(value, list) and len(value) == layers and all(_is_int(v) and v > 0 for v in value):
            found.append((attr, key, value))
    # A module whose own __init__ reads config.KEY[layer_idx] (OpenELM's attention its query and KV heads, its FFN a
    # width multiplier): scaffold.detect.sizes and .layout read what each sizes, and check every layer against it.
    for attr, key, _where in layerwidths.layer_reads(sourcecode.modeling_sources(ckpt)):
        value = ckpt.config.get(key)
        if (isinstance(value, list) and len(value) == layers and (attr, key, value) not in found
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value)):
            found.append((attr, key, value))
    # A module whose own __init__ computes its width from one config value and the layer's index (Gemma 4's
    # double-wide MLP in its KV-shared layers): KEY is that expression (scaffold.detect.sizes ports it).
    widths = config_value(ckpt, "intermediate_size")[0] if isinstance(layers, int) else None
    # The attention's heads of each layer's own size its projections, not an MLP width (detect.layerheads).
    heads = layerheads.read(sourcecode.modeling_sources(ckpt), ckpt.config, "config.hidden_size", layers) \
        if isinstance(layers, int) else None
    for attr, expr, values, _where in (layerwidths.layer_dependent_widths(
            sourcecode.modeling_sources(ckpt), "config.hidden_size", widths, ckpt.config, layers,
            frozenset({heads.attr}) if heads else frozenset()) if widths else ()):
        found.append((attr, expr, values))
    return found


def _layer_count(ckpt: Checkpoint) -> int | None:
    """config.json's num_hidden_layers, else the layers the tensors hold (OpenELM's num_transformer_layers)."""
    layers = ckpt.config.get("num_hidden_layers")
    if _is_int(layers):
        return layers
    numbers = {int(m.group(2)) for name in ckpt.tensors if (m := _LAYER_PARTS.match(name))}
    return max(numbers) + 1 if numbers else None


# Blocks whose computation a generated port cannot express; named in the error.
STATE_SPACE = "state-space (Mamba-style) blocks"
LINEAR_ATTENTION = "linear or recurrent attention"
UNSUPPORTED_TENSORS = (
    (re.compile(r"\.(mamba|ssm|mixer)\.|\.A_log$|\.dt_bias$|\.conv1d\."), STATE_SPACE),
    (re.compile(r"\.(linear_attn|linear_attention)\.|\.(recurrent|rwkv|time_mix|retention)\w*\."), LINEAR_ATTENTION),
)
UNSUPPORTED_CONFIG_KEYS = (
    (("ssm_cfg", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_n_heads", "ssm_state_size"), STATE_SPACE),
    (("linear_conv_kernel_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
      "linear_attn_config"), LINEAR_ATTENTION),
)
UNSUPPORTED_LAYER_TYPES = (
    (re.compile(r"mamba|ssm|state_space|conv"), STATE_SPACE),
    (re.compile(r"linear|recurrent|rwkv|retention|delta|lightning"), LINEAR_ATTENTION),
)

# Module paths check_shapes looks at, compiled once (large checkpoints have ~40,000 tensors).
_LAYER_NORM = re.compile(r"^model\.layers\.\d+\.(input|post_attention)_layernorm\.weight$")
_O_PROJ = re.compile(r"^model\.layers\.\d+\.self_attn\.o_proj\.weight$")
_QK_NORM = re.compile(r"^model\.layers\.\d+\.self_attn\.[qk]_norm\.weight$")
_CHECKED_ENDINGS = ("norm.weight", "o_proj.weight", ".bias")
_LAYER_PARTS = re.compile(r"^(.+?\.layers)\.(\d+)\.(.+)$")


STATE_SPACE_TENSOR = re.compile(r"\.A_log$|\.dt_bias$|\.conv1d\.")


def not_code_attention(ckpt: Checkpoint, hits: list[str]) -> list[str]:
    """`hits` of the state-space marker, less those under a module the decoder layer's code reads as its
    attention (a lab's attention wrapper named `mixer`, as Mamba names its own block: phi-1.5's
    layers.N.mixer.Wqkv); a state-space tensor itself (A_log, dt_bias, conv1d) still counts."""
    sources = sourcecode.modeling_sources(ckpt)
    if not sources:
        return hits
    try:
        flow = dataflow.analyze_layer(sources, ckpt.config)
    except RecursionError:
        flow = None
    if flow is not None and flow.attention_flow is not None:
        attention = {flow.attention}
    else:  # no decoder layer found (a stack built otherwise): each module the code builds that reads as attention
        attention = _attention_modules(sources, ckpt.config, {c for h in hits for c in h.split(".")})
    return [h for h in hits if not any(f".{a}." in h for a in attention) or STATE_SPACE_TENSOR.search(h)]


def _attention_modules(sources: dict, config: dict, names: set[str]) -> set[str]:
    """Those of `names` that the code only ever builds (`self.NAME = Cls(...)`) from a class whose forward the
    dataflow reads as softmax attention (q, k and v decided)."""
    found, other = set(), set()
    for _file, _cls, _func, attr, value in codekeys.self_assignments(sources):
        if attr not in names:
            continue
        sub = dataflow._submodule_class(sources, value)
        try:
            is_attention = sub is not None and dataflow.analyze_attention(sources, sub[0], sub[1], config) is not None
        except (dataflow.Undecided, RecursionError):
            is_attention = False
        (found if is_attention else other).add(attr)
    return found - other


def unsupported_blocks(config: dict, tensor_names, where: Path, not_attention=None) -> None:
    """Name linear-attention and state-space architectures as such, before detection stumbles on them.
    `not_attention`: drops from the state-space hits the tensors the checkpoint's code reads as attention."""
    for keys, feature in UNSUPPORTED_CONFIG_KEYS:
        present = [k for k in keys if config.get(k) is not None]
        if present:
            raise UnsupportedArchitecture(
                f"the checkpoint uses {feature} (config key {present[0]!r}); vLLM ports generated here express "
                "softmax attention decoders only. Serve it with `vllm serve CKPT --model-impl transformers` if "
                "its code supports that backend.",
                where,
            )
    for kind in config.get("layer_types") or []:
        for pattern, feature in UNSUPPORTED_LAYER_TYPES:
            if pattern.search(kind.lower()):
                raise UnsupportedArchitecture(
                    f"the checkpoint uses {feature} (layer type {kind!r} in 'layer_types'); vLLM ports generated "
                    "here express softmax attention decoders only.",
                    where,
                )
    for pattern, feature in UNSUPPORTED_TENSORS:
        hits = sorted(n for n in tensor_names if pattern.search(n))
        if hits and feature == STATE_SPACE and not_attention is not None:
            hits = not_attention(hits)
        if hits:
            raise UnsupportedArchitecture(
                f"the checkpoint uses {feature} (e.g. tensor {hits[0]!r}); vLLM ports generated here express "
                "softmax attention decoders only. Serve it with `vllm serve CKPT --model-impl transformers` if "
                "its code supports that backend.",
                where,
            )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _first_int(config: dict, *keys: str) -> tuple[str | None, int | None]:
    for key in keys:
        if _is_int(config.get(key)):
            return key, config[key]
    return None, None


def _embedding_width(config: dict, info: TensorInfo | None, name: str, vocab: int, hidden: int, hkey: str,
                     where: Path) -> None:
    """Refuse by name an embedding or head narrower or wider than the hidden size whose width a config key about
    the embedding gives (OPT-350m's word_embed_proj_dim, ALBERT-style embedding_size): the model projects the
    embeddings to the hidden size and back (OPT's project_in / project_out), which the port does not build."""
    if info is None or len(info.shape) != 2 or info.shape[0] != vocab or info.shape[1] == hidden:
        return
    keys = [k for k, v in config.items() if "emb" in k.lower() and _is_int(v) and v == info.shape[1]]
    if keys:
        raise UnsupportedArchitecture(
            f"embeddings of width {keys[0]} = {info.shape[1]}, where {hkey} is {hidden} (tensor {name!r}, stored "
            f"in {info.file}): an embedding width other than the hidden size (OPT-350m projects its embeddings in "
            "and out with project_in and project_out), which the port does not build.", where)


def layer_sizes(ckpt: Checkpoint) -> LayerSizes | None:
    """per_layer_config_sizes where the layers' head widths or KV heads differ, else None."""
    found = per_layer_config_sizes(ckpt)
    return found if found is not None and (len(set(found.head_dim)) > 1 or len(set(found.num_kv_heads)) > 1) else None


def check_shapes(config: dict, tensors: dict[str, TensorInfo], where: Path,
                 per_layer: list[tuple[str, str, list[int]]] = (),
                 sizes: headsizes.HeadSizes | LayerSizes | None = None) -> None:
    """Shapes the config fixes for every decoder of this layout, whatever the family.

    The detectors check the attention and MLP projections in detail; this covers the
    embedding and head (vocab rows), the norms, o_proj, and every bias against its weight.
    `per_layer`: (module, KEY, one count per layer) that layer_sized_modules found: that module's tensors may
    differ between layers of different counts; self_attn's count is the layer's query heads.
    `sizes`: the KV heads of each layer and the value heads' width the attention's code builds (head_sizes): the
    output projection takes heads x that width, and k and v differ between layers of different KV heads.
    """
    sized: dict[str, list[list]] = {}  # each module's per-layer values, one list per key sizing it
    for module, _key, counts in per_layer:
        sized.setdefault(module, []).append(counts)
    # The query heads of each layer: the count self_attn is built with (Laguna's), else the first it reads for itself
    # (OpenELM's query heads, then its KV heads); scaffold.detect.layerheads and .attention check which is which.
    layer_heads = sized["self_attn"][0] if "self_attn" in sized else None
    hkey, hidden = _first_int(config, "hidden_size", "n_embd", "d_model")
    vocab = config.get("vocab_size") if _is_int(config.get("vocab_size")) else None
    _, heads = _first_int(config, "num_attention_heads", "n_head")
    head_dim = config.get("head_dim") if _is_int(config.get("head_dim")) else None
    if head_dim is None and hidden and heads and hidden % heads == 0:
        head_dim = hidden // heads

    def dim_of(name: str) -> int | None:
        """The head width of the layer `name` belongs to (its own, where per_layer_config sizes it)."""
        layer = name.split(".")[2] if sizes is not None else ""
        return sizes.head_dim[int(layer)] if layer.isdigit() and int(layer) < len(sizes.head_dim) else head_dim

    def need(name: str, shape: tuple, why: str) -> None:
        info = tensors.get(name)
        if info is not None and info.shape != shape:
            raise CheckpointError(
                f"tensor {name!r} has shape {list(info.shape)}, but {why} need {list(shape)} "
                f"(stored in {info.file}).",
                where,
            )

    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if vocab and hidden:
            _embedding_width(config, tensors.get(name), name, vocab, hidden, hkey, where)
            need(name, (vocab, hidden), f"vocab_size {vocab} and {hkey} {hidden}")
        elif name in tensors and len(tensors[name].shape) != 2:
            raise CheckpointError(f"tensor {name!r} has shape {list(tensors[name].shape)}; it must be 2-D.", where)
    for name, info in tensors.items():
        if not hidden:
            break
        if not name.endswith(_CHECKED_ENDINGS):  # what the patterns below can match (most expert tensors cannot)
            continue
        if name == "model.norm.weight" or _LAYER_NORM.match(name):
            need(name, (hidden,), f"{hkey} {hidden}")
        elif _O_PROJ.match(name) and heads and _is_int(config.get("kv_lora_rank")) and _is_int(config.get("v_head_dim")):
            # Latent attention (DeepSeek-V2's): the output projection takes the heads' values.
            value = config["v_head_dim"]
            need(name, (hidden, heads * value), f"{heads} heads of values {value} wide (v_head_dim) and {hkey} {hidden}")
        elif _O_PROJ.match(name) and heads and head_dim:
            here, dim = layer_heads[int(name.split(".")[2])] if layer_heads else heads, dim_of(name)
            width = sizes.v_width if sizes is not None and sizes.v_width else dim
            need(name, (hidden, here * width), f"{here} heads of size {width} and {hkey} {hidden}")
        if heads and head_dim and _QK_NORM.match(name):
            _, kv = _first_int(config, "num_key_value_heads", "num_kv_heads")
            if sizes is not None:
                kv = sizes.kv_heads[int(name.split(".")[2])]
            query_heads = layer_heads[int(name.split(".")[2])] if layer_heads else heads
            heads_here, dim = query_heads if ".q_norm." in name else kv or query_heads, dim_of(name)
            if info.shape not in ((dim,), (heads_here * dim,), (heads_here, dim)):
                raise CheckpointError(
                    f"tensor {name!r} has shape {list(info.shape)}; a norm shared by the heads needs [{dim}], "
                    f"one over all heads [{heads_here * dim}], one per head [{heads_here}, {dim}].",
                    where,
                )
        module = name.rsplit(".", 1)[0]
        if name.endswith(".bias") and f"{module}.weight" in tensors and ".layers." in name:
            weight = tensors[f"{module}.weight"]
            rows = weight.shape[0] if weight.shape else None
            if len(weight.shape) == 2 and info.shape != (rows,):
                raise CheckpointError(
                    f"tensor {name!r} has shape {list(info.shape)}, but its weight has {rows} rows: the bias "
                    f"needs [{rows}].",
                    where,
                )

    # A module every layer has must have one shape in every layer: the port builds
    # all layers alike, so a layer that differs would load into the wrong shape.
    first: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, info in tensors.items():
        match = _LAYER_PARTS.match(name)
        if not match:
            continue
        rest = f"{match.group(1)}.N.{match.group(3)}"
        if rest not in first:
            first[rest] = (name, info.shape)
        elif first[rest][1] != info.shape:
            other, shape = first[rest]
            counts = list(zip(*sized.get(match.group(3).split(".", 1)[0], [])))
            here, there = int(match.group(2)), int(_LAYER_PARTS.match(other).group(2))
            if len(counts) > max(here, there) and counts[here] != counts[there]:
                continue  # a module sized per layer: scaffold.detect.layout checks each layer against its count
            kv = sizes.kv_heads if sizes is not None else []
            dims = sizes.head_dim if sizes is not None else []
            if (match.group(3).startswith("self_attn.") and len(kv) > max(here, there)
                    and (kv[here], dims[here] if dims else 0) != (kv[there], dims[there] if dims else 0)):
                continue  # heads of each layer's own: scaffold.detect.attention checks each layer's projections
            raise CheckpointError(
                f"tensor {name!r} has shape {list(info.shape)} but {other!r} has {list(shape)}; the same module "
                "must have the same shape in every layer.",
                where,
            )


# The attention projections whose sizes attention_sizes_explained reads from the code (this module's Llama layout).
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def attention_sizes_explained(ckpt: Checkpoint) -> str | None:
    """Why the attention's tensors differ from heads x head_dim, as the code builds them, or None: the class
    whose __init__ builds `self.o_proj` sizes a projection from a value of the layer's own (an expression over
    `X[layer_idx]`, the __init__'s layer argument: Gemma 4's `config.per_layer_config[layer_idx].head_dim`,
    MiMo-V2's KV heads doubled where `config.layer_types[layer_idx]` slides), or from a config key for the
    values' head width (MiMo-V2's `config.v_head_dim`)."""
    for file, tree in sourcecode._parsed(sourcecode.modeling_sources(ckpt)):
        for cls in sourcecode.subtree(tree):
            if not isinstance(cls, ast.ClassDef):
                continue
            init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            if init is None:
                continue
            built = _projections(init)
            if "o_proj" not in built:
                continue
            found = _explain(cls.name, file, init, built, ckpt.config)
            if found:
                return found
    return None


# The per-layer reads of transformers' heterogeneous configs (`config.per_layer_config[layer_idx].K`: the layer's
# override of K in config.json's per_layer_config, else the config's own K) a port builds each layer's attention from.
PER_LAYER_CONFIG = re.compile(r"^(?:self\.)?config\.per_layer_config\[\w+\]\.(head_dim|num_key_value_heads)$")


@dataclass(frozen=True)
class LayerSizes:
    """Each layer's head width and KV heads, where the attention's __init__ reads them from per_layer_config."""

    head_dim: list[int]
    num_kv_heads: list[int]
    evidence: str
    v_width = None  # values as wide as the layer's heads

    @property
    def kv_heads(self) -> list[int]:
        return self.num_kv_heads


def per_layer_config_sizes(ckpt: Checkpoint) -> LayerSizes | None:
    """The attention's head width and KV heads of each layer, where the class that builds o_proj sizes its projections
    from `config.per_layer_config[layer_idx].head_dim` / `.num_key_value_heads` alone (Gemma 4's) and config.json
    holds per_layer_config as overrides by layer index; None otherwise (another per-layer value stays refused)."""
    config = ckpt.config
    overrides, layers = config.get("per_layer_config"), config.get("num_hidden_layers")
    if not isinstance(overrides, dict) or not _is_int(layers) or not _is_int(config.get("head_dim")) \
            or not _is_int(config.get("num_key_value_heads")):
        return None
    if not all(isinstance(k, str) and k.isdigit() and int(k) < layers and isinstance(v, dict)
               for k, v in overrides.items()):
        return None
    # transformers writes the layer indices zero-padded to the widest ("05" beside "11" in a 30-layer config), and
    # reads them as numbers.
    by_layer = {int(k): v for k, v in overrides.items()}
    for file, tree in sourcecode._parsed(sourcecode.modeling_sources(ckpt)):
        for cls in sourcecode.subtree(tree):
            if not isinstance(cls, ast.ClassDef):
                continue
            init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            built = _projections(init) if init is not None else {}
            if "o_proj" not in built:
                continue
            found: dict = {}
            explained = _explain(cls.name, file, init, built, config, found)
            if explained is None or found["value_width"] or not found["own"]:
                continue
            reads = set().union(*found["own"].values())
            if not all(PER_LAYER_CONFIG.match(r) for r in reads):
                return None

            def value(layer: int, key: str) -> object:
                return by_layer.get(layer, {}).get(key, config[key])

            dims = [value(i, "head_dim") for i in range(layers)]
            kv = [value(i, "num_key_value_heads") for i in range(layers)]
            if not all(_is_int(v) and v > 0 for v in dims + kv):
                return None
            return LayerSizes(dims, kv, explained)
    return None


def _projections(init: ast.FunctionDef) -> dict[str, ast.Call]:
    """`self.P = nn.Linear(IN, OUT, ...)` of an __init__ for the attention's projections (either branch of an
    `X if cond else None`)."""
    out = {}
    for node in sourcecode.subtree(init):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and ast.unparse(node.targets[0].value) == "self" and node.targets[0].attr in PROJECTIONS):
            value = node.value.body if isinstance(node.value, ast.IfExp) else node.value
            if isinstance(value, ast.Call) and len(value.args) >= 2:
                out[node.targets[0].attr] = value
    return out


def _explain(cls: str, file: str, init: ast.FunctionDef, built: dict[str, ast.Call], config: dict,
             found: dict | None = None) -> str | None:
    defined: dict[str, ast.AST] = {}  # local or self attribute -> the expression assigned to it
    for node in sourcecode.subtree(init):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                defined.setdefault(target.id, node.value)
            elif isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self":
                defined.setdefault(f"self.{target.attr}", node.value)
    layer_args = {a.arg for a in init.args.args[1:]}

    def layer_value(node: ast.AST | None) -> bool:
        """`X[layer_idx]`, indexed by one of the __init__'s arguments."""
        return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name) and node.slice.id in layer_args

    def reads(expr: ast.AST, depth: int = 0) -> tuple[set[str], set[str]]:
        """(the layer's own values: `X[layer_idx]` as written, config keys) an expression depends on."""
        per_layer, keys = set(), set()
        read_whole = set()  # `layer_config.head_dim` of `layer_config = config.per_layer_config[layer_idx]`
        for sub in sourcecode.subtree(expr):
            if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
                    and layer_value(defined.get(sub.value.id))):
                per_layer.add(f"{ast.unparse(defined[sub.value.id])}.{sub.attr}")
                read_whole.add(id(sub.value))
            if id(sub) in read_whole:
                continue
            if layer_value(sub):
                per_layer.add(ast.unparse(sub))
            if isinstance(sub, ast.Attribute) and ast.unparse(sub.value) in ("config", "self.config"):
                keys.add(sub.attr)
            name = ast.unparse(sub) if isinstance(sub, (ast.Name, ast.Attribute)) else None
            if name in defined and depth < 4 and defined[name] is not expr:
                more = reads(defined[name], depth + 1)
                per_layer |= more[0]
                keys |= more[1]
        return per_layer, keys

    own: dict[str, set[str]] = {}
    value_width: dict[str, set[str]] = {}
    for proj, call in built.items():
        per_layer, keys = reads(ast.Tuple(elts=list(call.args[:2]), ctx=ast.Load()))
        if per_layer:
            own[proj] = per_layer
        widths = {k for k in keys if "head_dim" in k and k != "head_dim" and _is_int(config.get(k))
                  and config.get(k) != config.get("head_dim")}
        if widths:
            value_width[proj] = widths
    where = f"{cls} ({file}:{init.lineno})"
    if found is not None:
        found.update(own=own, value_width=value_width, where=where)
    parts = []
    if own:
        values = sorted(set().union(*own.values()))
        parts.append(f"per-layer attention sizes: {where} builds {', '.join(sorted(own))} with sizes of each "
                     f"layer's own (from {', '.join(values)})")
    if value_width:
        keys = sorted(set().union(*value_width.values()))
        widths = ", ".join(f"config.{k} = {config[k]}" for k in keys)
        parts.append(f"value heads of their own width: {'' if parts else where + ' '}builds "
                     f"{', '.join(sorted(value_width))} from {widths}, where q and k heads have head_dim "
                     f"{config.get('head_dim')}")
    return ", and ".join(parts) if parts else None
