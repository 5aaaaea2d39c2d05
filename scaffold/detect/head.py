"""The output head's computation: a plain linear map, or one over an L2-normalized weight.

Read from the modeling code in two places:

- the forward of the head's class: a head that normalizes its own weight (`F.normalize(self.weight)`, or
  `self.weight / self.weight.norm(dim=-1, keepdim=True)`) before the matmul has every row at unit length
  (Baichuan 2's NormHead);
- a method of the class that builds the head, normalizing the head's weight before the logits' matmul
  (Bailing's `compute_logit`: `self.lm_head.weight.data.float() / (torch.norm(..., p=2, dim=0, keepdim=True) +
  1e-7)` under `if self.norm_head:`), on the branch config.json runs (`self.norm_head = config.norm_head` read
  through __init__; `self.training` is the training branch, never the one serving runs). Its dim may be the
  columns (dim 0: each hidden unit's weights over the vocabulary) and its epsilon is added to the norm.

The port normalizes once, at load time, over the whole (unsharded) tensor, so a column norm over the
vocabulary is exact under tensor parallelism too.
"""

from __future__ import annotations

import ast

from dataclasses import dataclass

from scaffold.checkpoint import Checkpoint
from scaffold.detect import conditions
from scaffold.detect.sourcecode import Found, _dotted, modeling_sources, module_class, parse, subtree
from scaffold.errors import UnsupportedArchitecture
from scaffold.spec import Source, Spec

ROW_DIMS = (1, -1)  # a [vocab, hidden] weight: its rows are normalized over dim 1


COLUMN_DIMS = (0, -2)  # its columns: each hidden unit's weights over the vocabulary


@dataclass(frozen=True)
class Normalized:
    """A normalization of the head's weight in a method of the class that builds the head."""
    where: Found          # the method's class, file and line of the division / normalize call
    method: str
    columns: bool         # over dim 0 (else the rows)
    eps: float | None     # added to the norm; None: F.normalize's max(norm, 1e-12)
    guard: str = ""       # the branch's tests read through __init__ (`config.norm_head`), "" where unguarded
    taken: bool = True    # False: config.json turns that branch off (the head is a plain linear map)


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    head = spec.names["lm_head"]
    sources = modeling_sources(ckpt)
    found = normalized_head(sources, head)
    outside = normalized_by_owner(sources, head, ckpt.config) if found is None else None
    if outside is not None and not outside.taken:
        spec.set("normalized_head", False, Source(
            "code", f"{outside.where}: {outside.where.value}.{outside.method} normalizes the head's weight only where "
                    f"{outside.guard} holds, not with config.json's values"))
        return
    if outside is not None:
        if spec.tie_word_embeddings:
            raise UnsupportedArchitecture(
                f"the output head {head!r} is normalized by {outside.where.value}.{outside.method} ({outside.where}) "
                "and is tied to the embedding; only an untied normalized head is supported.", ckpt.config_file)
        over = "columns (dim 0)" if outside.columns else "rows"
        eps = f", norm + {outside.eps:g}" if outside.eps is not None else ""
        guard = f" (where {outside.guard})" if outside.guard else ""
        spec.set("normalized_head", True, Source(
            "code", f"{outside.where}: {outside.where.value}.{outside.method} L2-normalizes the weight's {over}{eps}"
                    f"{guard}"))
        spec.set("normalized_head_columns", outside.columns, Source("code", f"{outside.where}: over {over}"))
        spec.set("normalized_head_eps", outside.eps, Source("code", f"{outside.where}: the norm's epsilon"
                                                            if outside.eps is not None else "F.normalize"))
        return
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


def _weight_of(node: ast.AST, head: str) -> bool:
    """`self.<head>.weight`, possibly through `.data`, `.float()`, `.detach()`, `.to(...)`."""
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("float", "detach", "to", "contiguous"):
            node = node.func.value
        elif isinstance(node, ast.Attribute) and node.attr == "data":
            node = node.value
        else:
            break
    return isinstance(node, ast.Attribute) and node.attr == "weight" and _dotted(node.value) == f"self.{head}"


def _norm_of(node: ast.AST, head: str) -> tuple[object, object] | None:
    """(dim, p) of `torch.norm(W, p=2, dim=D, ...)` / `W.norm(dim=D)` / `torch.linalg.norm(W, dim=D)` of the
    head's weight W, possibly plus a constant epsilon: ((dim, p), eps)."""
    eps = None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "detach":
        node = node.func.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        for norm, other in ((node.left, node.right), (node.right, node.left)):
            try:
                value = ast.literal_eval(other)
            except ValueError:
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                node, eps = norm, float(value)
                break
        else:
            return None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "detach":
        node = node.func.value
    if not isinstance(node, ast.Call):
        return None
    callee = _dotted(node.func)
    if callee.rsplit(".", 1)[-1] == "norm" and callee.startswith(("torch.", "linalg.")) and node.args \
            and _weight_of(node.args[0], head):
        return (_keyword(node, "dim", 2, None), _keyword(node, "p", 1, 2)), eps
    if isinstance(node.func, ast.Attribute) and node.func.attr == "norm" and _weight_of(node.func.value, head):
        return (_keyword(node, "dim", 1, None), _keyword(node, "p", 0, 2)), eps
    return None


def _said(test: ast.expr, polarity: bool) -> str:
    """The condition a branch runs under, in words of code: `X` / `not X` (`not not X` said as `X`)."""
    if not polarity and isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return ast.unparse(test.operand)
    return ("" if polarity else "not ") + ast.unparse(test)


def normalized_by_owner(sources: dict[str, str], head: str, config: dict) -> Normalized | None:
    """A normalization of `self.<head>.weight` in a method of the class whose __init__ builds `self.<head>`, on a
    branch config.json runs. Raises UnsupportedArchitecture for one it cannot decide or express (a p other than 2,
    a dim it cannot read, a condition on something but config.json). One only on branches config.json turns off comes back with
    taken False."""
    off = None
    for file, tree in _trees(sources):
        for cls in (n for n in subtree(tree) if isinstance(n, ast.ClassDef)):
            init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            if init is None:
                continue
            assigned = conditions.self_assignments(init)
            if head not in assigned:
                continue
            for method in (f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name != "__init__"):
                for node, tests in conditions.guarded(method.body):
                    got = None
                    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _weight_of(node.left, head):
                        got = _norm_of(node.right, head)
                    elif isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] == "normalize" \
                            and node.args and _weight_of(node.args[0], head):
                        got = (_keyword(node, "dim", 2, 1), _keyword(node, "p", 1, 2)), None
                    if got is None:
                        continue
                    (dim, p), eps = got
                    where = f"{file}:{node.lineno}"
                    taken = conditions.branch_taken(tests, assigned, config)
                    guard = " and ".join(_said(conditions.through_init(t, assigned), polarity)
                                         for t, polarity in tests if "training" not in ast.unparse(t))
                    if taken is False:
                        off = off or Normalized(Found(cls.name, file, node.lineno), method.name, dim in COLUMN_DIMS,
                                                eps, guard, taken=False)
                        continue
                    if taken is None:
                        raise UnsupportedArchitecture(
                            f"{where}: {cls.name}.{method.name} normalizes the output head's weight under a condition "
                            "config.json does not decide; the generator cannot tell whether serving runs it.")
                    if p not in (2, 2.0) or dim not in ROW_DIMS + COLUMN_DIMS:
                        raise UnsupportedArchitecture(
                            f"{where}: {cls.name}.{method.name} normalizes the output head's weight with p={p} over dim "
                            f"{dim}; only the L2 norm of its rows or columns is supported.")
                    return Normalized(Found(cls.name, file, node.lineno), method.name, dim in COLUMN_DIMS, eps, guard)
    return off
