"""The output head's computation: a plain linear map, or one over L2-normalized rows (Baichuan 2's NormHead).

Read from the forward of the head's class in the modeling code: a head that normalizes its own
weight (`F.normalize(self.weight)`, or `self.weight / self.weight.norm(dim=-1, keepdim=True)`)
before the matmul has every row at unit length; the port normalizes the rows once, at load time.
"""

from __future__ import annotations

import ast

from scaffold.checkpoint import Checkpoint
from scaffold.detect.sourcecode import Found, modeling_sources, module_class, parse, subtree
from scaffold.errors import UnsupportedArchitecture
from scaffold.spec import Source, Spec

ROW_DIMS = (1, -1)  # a [vocab, hidden] weight: its rows are normalized over dim 1


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    head = spec.names["lm_head"]
    found = normalized_head(modeling_sources(ckpt), head)
    if found is None:
        spec.set("normalized_head", False, Source("default", "the head multiplies by its weight as stored"))
        return
    if spec.tie_word_embeddings:
        # The reference's NormHead rewrites its weight in place on the first eval forward: a head tied to
        # the embedding would normalize the embedding too, from the second forward on. No port matches that.
        raise UnsupportedArchitecture(
            f"the output head {head!r} normalizes its weight ({found}) and is tied to the embedding; the "
            "reference would then normalize the embedding as well. Only an untied normalized head is supported.",
            ckpt.config_file)
    spec.set("normalized_head", True, Source("code", f"{found}: {found.value} L2-normalizes its weight's rows"))


def normalized_head(sources: dict[str, str], attribute: str) -> Found | None:
    """Where the class assigned to `self.<attribute>` normalizes the rows of its own weight, if it does.

    Raises UnsupportedArchitecture for a normalization over another dimension (the columns)."""
    assigned = module_class(sources, attribute)
    if assigned is None:
        return None
    cls = assigned[0].rsplit(".", 1)[-1]
    for file, tree in _trees(sources):
        for node in subtree(tree):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                forward = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
                return _normalizes_weight(forward, cls, file) if forward else None
    return None


def _trees(sources: dict[str, str]):
    for file, text in sources.items():
        tree = parse(text)
        if tree is not None:
            yield file, tree


def _normalizes_weight(forward: ast.FunctionDef, cls: str, file: str) -> Found | None:
    for node in subtree(forward):
        dim = None
        if (isinstance(node, ast.Call) and ast.unparse(node.func).rsplit(".", 1)[-1] == "normalize"
                and node.args and ast.unparse(node.args[0]) == "self.weight"):
            # torch.nn.functional.normalize(input, p=2.0, dim=1)
            dim = _keyword(node, "dim", 2, 1)
            p = _keyword(node, "p", 1, 2)
            if p not in (2, 2.0):
                raise UnsupportedArchitecture(f"{file}:{node.lineno}: {cls} normalizes its weight with p={p}; only "
                                              "the L2 norm is supported.")
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and ast.unparse(node.left) == "self.weight"
              and isinstance(node.right, ast.Call) and ast.unparse(node.right.func) == "self.weight.norm"):
            dim = _keyword(node.right, "dim", 1, None)
        else:
            continue
        if dim not in ROW_DIMS:
            raise UnsupportedArchitecture(f"{file}:{node.lineno}: {cls} normalizes its weight over dim {dim}; only "
                                          "its rows (dim 1 or -1) are supported.")
        return Found(cls, file, node.lineno)
    return None


def _keyword(call: ast.Call, name: str, position: int, default):
    """A literal argument of `call`, by keyword or position; `default` when absent; None when not a literal."""
    value = next((k.value for k in call.keywords if k.arg == name), None)
    if value is None and len(call.args) > position:
        value = call.args[position]
    if value is None:
        return default
    try:
        return ast.literal_eval(value)
    except ValueError:
        return None
