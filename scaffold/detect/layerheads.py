"""Query and KV heads that each layer's attention reads for itself from a list in config.json (OpenELM's):

    q_heads = config.num_query_heads[layer_idx]
    k_heads = config.num_kv_heads[layer_idx]
    v_heads = config.num_kv_heads[layer_idx]
    self.qkv_proj = nn.Linear(in_features=config.model_dim, out_features=(q_heads + k_heads + v_heads) * head_dim)
    self.out_proj = nn.Linear(in_features=q_heads * head_dim, out_features=config.model_dim)

The output projection's input width, followed to the config and the layer's index (layerwidths), is
config.Q[layer_idx] times the head width: Q holds each layer's query heads. The KV heads are the one other key the
attention indexes by the layer. Whatever the keys, locals, modules and projections are called; read as text.
scaffold.detect.sizes sets the spec from it; scaffold.detect.layout checks every layer's tensors against it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect import layerwidths


@dataclass(frozen=True)
class LayerHeads:
    """query_key / kv_key: the config keys holding each layer's query and KV heads (kv_key None: the attention
    reads no KV heads of its own per layer); query / kv: their values; where: file:line of the query heads' read."""
    attr: str
    query_key: str
    query: list[int]
    kv_key: str | None
    kv: list[int]
    where: str


def _positive_counts(value: object, layers: int) -> bool:
    return (isinstance(value, list) and len(value) == layers
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value))


def _factors(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left) + _factors(node.right)
    return [node]


def _indexed_key(node: ast.expr) -> str | None:
    """K of `config.K[layer_idx]`."""
    if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name) and node.slice.id == "layer_idx"
            and isinstance(node.value, ast.Attribute) and ast.unparse(node.value.value) in ("config", "self.config")):
        return node.value.attr
    return None


def read(sources: dict, config: dict, hidden: str | None, layers: int) -> LayerHeads | None:
    """The attention's per-layer head counts, where a module of the decoder layer reads them so; None otherwise."""
    reads: dict[str, dict[str, str]] = {}
    for attr, key, where in layerwidths.layer_reads(sources):
        reads.setdefault(attr, {}).setdefault(key, where)
    for attr, width, _where in layerwidths.width_expressions(sources, hidden):
        keys = reads.get(attr, {})
        factors = _factors(width)
        query = [k for f in factors if (k := _indexed_key(f)) in keys]
        # heads x the head width: a width read whole from a list (Gemma-3n's MLP) is no head count.
        width_read = [f for f in factors if _indexed_key(f) is None]
        if len(query) != 1 or len(factors) != 2 or any(isinstance(n, ast.Name) and n.id == "layer_idx"
                                                       for f in width_read for n in ast.walk(f)) \
                or not _positive_counts(config.get(query[0]), layers):
            continue
        others = [k for k in keys if k != query[0] and _positive_counts(config.get(k), layers)]
        kv_key = others[0] if len(others) == 1 else None
        return LayerHeads(attr, query[0], list(config[query[0]]), kv_key,
                          list(config[kv_key]) if kv_key else [], keys[query[0]])
    return None
