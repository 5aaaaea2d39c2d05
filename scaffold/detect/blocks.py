"""Attention forms the port cannot compute, named from the code that computes them (read as text, never run).

- A sublayer block around the attention (DBRX's `norm_attn_norm`): the decoder layer hands its input to a module
  that holds the attention together with norms and returns more than one tensor (the residual and the normed sum,
  `return residual_states, hidden_states`). The port's decoder layer keeps the norms beside the attention; the
  attention wrapper it follows (GPT-Neo's `attn.attention`) holds no norm and returns the attention's output.
- Differential attention (DiffLlama's): two attention outputs subtracted, the second weighted by a value the
  attention computes from parameters of its own (`attn_output1 - lambda_full * attn_output2`, lambda_full from
  lambda_q1 * lambda_k1 ...). Found here; scaffold.detect.differential then decides whether it is the form the
  port computes (DiffLlama's pairing of head i with head i + H/2), else it is refused naming what differs.
"""

from __future__ import annotations

import ast
import re
from dataclasses import replace

from scaffold.checkpoint import Checkpoint
from scaffold.detect import dataflow, subconfigs
from scaffold.detect.sourcecode import _dotted, modeling_sources, subtree
from scaffold.spec import Source, Spec


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _built(cls: ast.ClassDef) -> dict[str, tuple[str, int]]:
    """self.X = Cls(...) in __init__: X -> (the class's last name, line)."""
    init = _method(cls, "__init__")
    out: dict[str, tuple[str, int]] = {}
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and _dotted(node.targets[0].value) == "self" and isinstance(node.value, ast.Call)):
            out.setdefault(node.targets[0].attr, (_dotted(node.value.func).rsplit(".", 1)[-1], node.lineno))
    return out


def _is_norm(cls_name: str) -> bool:
    return cls_name.endswith(("Norm", "LayerNorm", "RMSNorm"))


def norm_attention_block(sources: dict, layers_attr: str | None, layer0: dict, config: dict | None = None) -> str | None:
    """What names DBRX's form: the layer module (`norm_attn_norm`) whose class builds norms and a module holding
    projections the checkpoint stores (`norm_attn_norm.attn.Wqkv.weight`), and whose forward returns several
    tensors; None where the layer has no such module. Behind it, the other forms of the same checkpoint the port
    has no field for are named too (scaffold.detect.subconfigs: experts stored flattened, sizes read from
    sub-configs), so that the refusal names more than the first form the port lacks."""
    found = dataflow.layer_class(sources, layers_attr) or dataflow.layer_class(sources)
    if found is None:
        return None
    _, layer_cls, _ = found
    for attr, (cls_name, _) in _built(layer_cls).items():
        inner = dataflow._class(sources, cls_name)
        if inner is None:
            continue
        file, cls = inner
        built = _built(cls)
        norms = sorted(a for a, (c, _) in built.items() if _is_norm(c))
        holders = sorted(a for a in built if a not in norms and any(
            r.startswith(f"{attr}.{a}.") and r.count(".") == 3 and r.endswith(".weight") and len(info.shape) == 2
            for r, info in layer0.items()))
        forward = _method(cls, "forward")
        returns = [n for n in subtree(forward) if isinstance(n, ast.Return)] if forward is not None else []
        several = [r for r in returns if isinstance(r.value, ast.Tuple) and len(r.value.elts) > 1]
        if norms and holders and several:
            held = sorted({r.split(".")[2] for r in layer0 if r.startswith(f"{attr}.{holders[0]}.")})
            return (f"attention inside a block that also holds the layer norms: {attr} "
                    f"({cls_name}, {file}:{cls.lineno}) holds {', '.join(norms)} beside {', '.join(holders)} "
                    f"({', '.join(held)}) and returns {len(several[0].value.elts)} tensors (line "
                    f"{several[0].lineno}: {ast.unparse(several[0].value)}); the port's decoder layer keeps its "
                    "norms beside the attention" + _behind(sources, layer0, config or {}).replace(f"{file}:", "line "))
    return None


def view(ckpt: Checkpoint, spec: Spec) -> Checkpoint:
    """`ckpt` with the tensors of a block nested in the decoder layer (DBRX's norm_attn_norm) named as the layer's
    own, where the code reads as the usual layer with the block inlined (scaffold.detect.nested), and
    spec.layer_block set; `ckpt` itself otherwise. The port's loader drops the same prefix (renamed_substrings)."""
    sources = modeling_sources(ckpt)
    found = dataflow.layer_block(sources) if sources else None
    if found is None:
        spec.set("layer_block", "", Source("default", "the decoder layer holds its sublayers itself"))
        return ckpt
    inside = re.compile(rf"\.(\d+)\.{re.escape(found.attr)}\.")
    tensors = {}
    for name, info in ckpt.tensors.items():
        flat = inside.sub(r".\1.", name, count=1)
        if flat != name:
            if flat in ckpt.tensors:
                return ckpt  # the layer holds a module of the same name: not the block's alone
            info = replace(info, name=flat)
        tensors[flat] = info
    if tensors.keys() == ckpt.tensors.keys():
        spec.set("layer_block", "", Source("default", "the decoder layer holds its sublayers itself"))
        return ckpt
    spec.set("layer_block", found.attr, Source(
        "code", f"{found.evidence}: {found.block} holds norms around the attention; its forward inlined into the "
                "layer's reads as the usual layer"))
    return replace(ckpt, tensors=tensors)


def _behind(sources: dict, layer0: dict, config: dict) -> str:
    """The forms behind the block that the port has no field for either, as the rest of the refusal."""
    more = []
    if (flat := subconfigs.flattened_experts(sources, layer0)) is not None:
        more.append(f"experts stored flattened ({flat.describe()})")
    if (reads := subconfigs.subconfig_reads(sources, config)) is not None:
        more.append(f"sizes read from sub-configs ({reads.describe(config, 2)})")
    if not more:
        return ""
    return f". Also unported behind it: {'; '.join(more)}"


def layer_module_class(sources: dict, layers_attr: str | None, attr: str) -> str | None:
    """The class the decoder layer builds its module `attr` from (`self.self_attn = DiffLlamaAttention(...)`)."""
    found = dataflow.layer_class(sources, layers_attr) or dataflow.layer_class(sources)
    built = _built(found[1]).get(attr) if found is not None and "." not in attr else None
    return built[0] if built is not None else None


def _parameters(cls: ast.ClassDef) -> set[str]:
    init = _method(cls, "__init__")
    return {node.targets[0].attr for node in (subtree(init) if init is not None else ())
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
            and _dotted(node.targets[0].value) == "self" and isinstance(node.value, ast.Call)
            and _dotted(node.value.func).rsplit(".", 1)[-1] == "Parameter"}


def differential_attention(sources: dict, attention_cls: str, stray: list[str]) -> str | None:
    """What names differential attention: in the attention class's forward, `A - S * B` (or `A - B * S`) where S
    is computed from parameters of the attention's own (among `stray`, the checkpoint tensors nothing else
    claims); None where its code does not compute that."""
    found = dataflow._class(sources, attention_cls)
    if found is None:
        return None
    file, cls = found
    params = _parameters(cls) & set(stray)
    forward = _method(cls, "forward")
    if not params or forward is None:
        return None
    # Locals computed (through other locals) from self.<param>.
    derived: dict[str, set[str]] = {}

    def reads(node: ast.AST) -> set[str]:
        out = set()
        for n in subtree(node):
            if isinstance(n, ast.Attribute) and _dotted(n.value) == "self" and n.attr in params:
                out.add(n.attr)
            if isinstance(n, ast.Name) and n.id in derived:
                out |= derived[n.id]
        return out

    for stmt in forward.body:
        if isinstance(stmt, ast.Assign):
            value = stmt.value
            if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Sub) and isinstance(value.right, ast.BinOp) \
                    and isinstance(value.right.op, ast.Mult):
                weight = reads(value.right.left) or reads(value.right.right)
                if weight and not reads(value.left):
                    return (f"differential attention: two attention outputs subtracted, the second weighted by a "
                            f"value computed from the attention's own parameters ({', '.join(sorted(weight))}): "
                            f"{file}:{stmt.lineno}: {ast.unparse(stmt)}; the port computes one attention per layer and "
                            "has no form for the weighted difference of two")
            got = reads(value)
            for target in stmt.targets:
                for n in subtree(target):
                    if isinstance(n, ast.Name) and got:
                        derived[n.id] = got
    return None
