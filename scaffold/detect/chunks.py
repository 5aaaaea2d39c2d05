"""Chunked attention read from the code: a causal mask that lets a query see only the keys of its own chunk of
`config.K` positions, on the layers the code gives that mask.

Llama 4's base model builds its masks per layer type and hands each layer the one of its type,

    causal_mask_mapping = {"full_attention": create_causal_mask(**mask_kwargs),
                           "chunked_attention": create_chunked_causal_mask(**mask_kwargs)}
    ... attention_mask=causal_mask_mapping[self.config.layer_types[i]]

where transformers' create_chunked_causal_mask (masking_utils) reads config.attention_chunk_size: keys and query
in the same chunk, `kv_idx // chunk == q_idx // chunk`. A lab may write that comparison itself,
`(pos[:, None] // config.K) == (pos[None, :] // config.K)`, in code every layer runs. vLLM computes it with
ChunkedLocalAttention(attention_chunk_size=...), as its own llama4.py does. Read as text, never run; a chunk
whose size or layers the code does not say plainly is refused by name.
"""

from __future__ import annotations

import ast
import re

from scaffold.detect.sourcecode import _dotted, _parsed, subtree

# transformers' mask builder for chunked layers, and the config key it reads (masking_utils.py).
CHUNKED_MASK = re.compile(r"chunked\w*mask|mask\w*chunk", re.IGNORECASE)
TRANSFORMERS_CHUNK_KEY = "attention_chunk_size"


class Chunks:
    def __init__(self, key: str, layer_type: str | None, evidence: str):
        # the config key of the chunk's size; the layer type whose layers chunk (None: every layer)
        self.key, self.layer_type, self.evidence = key, layer_type, evidence


class Refused(Exception):
    """A chunked mask whose size or layers the code does not say plainly."""


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): node for node in subtree(tree) for child in ast.iter_child_nodes(node)}


def _config_key(node: ast.AST, assigned: dict[str, ast.AST]) -> str | None:
    """K for `config.K` / `self.config.K`, or for `self.X` that __init__ assigns `config.K`."""
    name = _dotted(node)
    if name.startswith("self.") and name.count(".") == 1 and name[5:] in assigned:
        name = _dotted(assigned[name[5:]])
    parts = name.split(".")
    if len(parts) == 2 and parts[0] == "config" or len(parts) == 3 and parts[:2] == ["self", "config"]:
        return parts[-1]
    return None


def _self_assigned(tree: ast.AST) -> dict[str, ast.AST]:
    return {_dotted(n.targets[0])[5:]: n.value for n in subtree(tree) if isinstance(n, ast.Assign)
            and len(n.targets) == 1 and _dotted(n.targets[0]).startswith("self.")}


def chunked_attention(sources: dict[str, str]) -> Chunks | None:
    """Where the code builds a chunked causal mask, its size's config key and the layers it applies to; None when
    it builds none. Raises Refused where the code chunks in a way this does not follow."""
    for file, tree in _parsed(sources):
        parents = _parents(tree)
        assigned = _self_assigned(tree)
        for node in subtree(tree):
            if isinstance(node, ast.Call) and CHUNKED_MASK.search(_dotted(node.func).rsplit(".", 1)[-1]):
                return _per_layer_type(node, parents, file)
            if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq):
                sides = (node.left, node.comparators[0])
                if all(isinstance(s, ast.BinOp) and isinstance(s.op, ast.FloorDiv) for s in sides):
                    keys = {_config_key(s.right, assigned) for s in sides}
                    if len(keys) == 1 and None not in keys:
                        return _every_layer(node, parents, file, keys.pop())
    return None


def _per_layer_type(call: ast.Call, parents: dict, file: str) -> Chunks:
    """transformers' builder: the layer type whose mask it is (its key in a dict of masks by layer type)."""
    name = _dotted(call.func).rsplit(".", 1)[-1]
    parent = parents.get(id(call))
    if isinstance(parent, ast.Dict):
        key = parent.keys[parent.values.index(call)]
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return Chunks(TRANSFORMERS_CHUNK_KEY, key.value,
                          f"{file}:{call.lineno}: {name}(...) is the mask of the {key.value!r} layers "
                          f"(transformers' masking_utils reads config.{TRANSFORMERS_CHUNK_KEY})")
    raise Refused(f"a chunked causal mask ({file}:{call.lineno}: {name}(...)) not kept per layer type "
                  "(a dict of masks by config.layer_types)")


def _every_layer(compare: ast.Compare, parents: dict, file: str, key: str) -> Chunks:
    """A lab's own chunk comparison: every layer, unless a branch decides otherwise (refused)."""
    node = parents.get(id(compare))
    while node is not None:
        if isinstance(node, (ast.If, ast.IfExp)):
            raise Refused(f"a chunked causal mask ({file}:{compare.lineno}: {ast.unparse(compare)[:60]}) under a "
                          f"condition (line {node.lineno}: {ast.unparse(node.test)[:60]})")
        node = parents.get(id(node))
    return Chunks(key, None, f"{file}:{compare.lineno}: {ast.unparse(compare)[:70]}: keys of the query's own chunk "
                             f"of config.{key} positions")


def block_size_for(attention_chunk_size: int | None) -> int | None:
    """The KV-cache block size the engine needs for a chunked-attention port: vLLM's ChunkedLocalAttention wants the
    chunk a multiple of the block, and the CPU backend takes blocks of 128 unless told a multiple of 32. None where
    the default serves (no chunk, or a multiple of 128) or none would (then vLLM's own load error says so)."""
    if not attention_chunk_size or attention_chunk_size % 128 == 0:
        return None
    return next((b for b in (64, 32) if attention_chunk_size % b == 0), None)
