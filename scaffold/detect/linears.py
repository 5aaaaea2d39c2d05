"""Which module classes are linear layers, and how each stores its weight, read from what they compute.

nn.Linear keeps its weight [out_features, in_features] and computes x @ W.T + b. GPT-2's Conv1D (transformers'
`pytorch_utils.Conv1D`, and the copies labs keep of it) keeps it [in_features, out_features] and computes
`addmm(b, x, W)`: the same linear map with the weight stored transposed, so a port that loads it into vLLM's
linear layers transposes it first. A class of the checkpoint's own code counts as a linear layer when its
forward multiplies the input by `self.weight`; the operand order says how the weight is stored, and the shape it
is created with says which constructor argument is the input width. Nothing here runs the code.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache

from scaffold.detect.sourcecode import _classes, _dotted, subtree

MATMUL_CALLS = ("matmul", "mm", "addmm", "baddbmm", "bmm")
PARAMETER_FACTORIES = ("empty", "zeros", "ones", "randn", "rand", "Tensor", "FloatTensor")


@dataclass(frozen=True)
class LinearClass:
    """A module class that computes a linear map: how it stores its weight, which constructor arguments are
    the input and output widths (positions after self), and where the code says so."""

    name: str
    transposed: bool  # weight stored [in, out] (GPT-2's Conv1D)
    in_arg: int
    out_arg: int
    where: str


# Classes the checkpoint's code imports rather than defines.
KNOWN = {
    "Linear": LinearClass("Linear", False, 0, 1, "torch.nn.Linear: weight [out, in]"),
    "Conv1D": LinearClass("Conv1D", True, 1, 0, "transformers' Conv1D(nf, nx): weight [nx, nf], addmm(b, x, W)"),
}


# The keyword names of the widths, (input, output), where a call names them (`nn.Linear(in_features=..., ...)`).
_WIDTH_KEYWORDS = {"Linear": ("in_features", "out_features"), "Conv1D": ("nx", "nf")}


def width_args(kind: LinearClass, call: ast.Call) -> tuple[ast.expr, ast.expr] | None:
    """(the input width, the output width) a constructor call gives the linear class `kind`, passed by position or,
    for torch's Linear and transformers' Conv1D, by keyword; None where the call gives either otherwise."""
    names = _WIDTH_KEYWORDS.get(kind.name, ("", ""))
    given = {k.arg: k.value for k in call.keywords if k.arg}
    found = []
    for position, keyword in ((kind.in_arg, names[0]), (kind.out_arg, names[1])):
        value = call.args[position] if len(call.args) > position else given.get(keyword)
        if value is None:
            return None
        found.append(value)
    return found[0], found[1]


def linear_classes(sources: dict[str, str]) -> dict[str, LinearClass]:
    """Class name -> LinearClass (see _linear_classes); computed once per set of sources."""
    return dict(_linear_classes(tuple(sorted(sources.items()))))


@lru_cache(maxsize=32)
def _linear_classes(items: tuple[tuple[str, str], ...]) -> dict[str, LinearClass]:
    """Class name -> LinearClass for every linear layer class the code uses: nn.Linear, transformers' Conv1D,
    and the code's own classes whose forward multiplies the input by `self.weight` (those override a known
    class of the same name: a lab's Conv1D may store its weight either way)."""
    out = dict(KNOWN)
    classes = _classes(dict(items))
    for name, (file, cls) in classes.items():
        found = _own_linear(file, cls)
        if found is not None:
            out[name] = found
        elif name in out:
            del out[name]  # the code defines a class of that name that is not a linear layer
    for name, (file, cls) in classes.items():
        if name not in out and (found := _subclassed_linear(file, cls, out)) is not None:
            out[name] = found
    return out


def _subclassed_linear(file: str, cls: ast.ClassDef, known: dict[str, LinearClass]) -> LinearClass | None:
    """A subclass of a linear class that keeps its constructor and multiplies by self.weight as the base stores
    it (Falcon's `FalconLinear(nn.Linear)`, whose forward is `input @ self.weight.T`): a linear layer of its own."""
    # A base named by its module path (nn.Linear) is the library's class, even where the code defines a class of the
    # same name (Falcon's original RW code: `class Linear(nn.Linear)` whose forward is `input @ self.weight.T`).
    bases = [(KNOWN if "." in _dotted(b) else known).get(_dotted(b).rsplit(".", 1)[-1]) for b in cls.bases]
    base = next((b for b in bases if b is not None), None)
    if base is None or _method(cls, "__init__") is not None:
        return None
    forward = _method(cls, "forward")
    storage = _storage(forward) if forward is not None else (base.transposed, cls.lineno)
    if storage is None or storage[0] != base.transposed:
        return None
    return LinearClass(cls.name, base.transposed, base.in_arg, base.out_arg,
                       f"{file}:{storage[1]}: {cls.name} subclasses {base.name} and multiplies by self.weight as "
                       "it stores it")


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _is_weight(node: ast.AST) -> bool:
    return _dotted(node) == "self.weight"


def _transposed_weight(node: ast.AST) -> bool:
    """self.weight.T / .t() / .transpose(0, 1) / .mT."""
    if isinstance(node, ast.Attribute) and node.attr in ("T", "mT") and _is_weight(node.value):
        return True
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("t", "transpose") and _is_weight(node.func.value))


def _storage(forward: ast.FunctionDef) -> tuple[bool, int] | None:
    """(transposed, line) from how forward multiplies by self.weight: as the right operand of a matmul (x @ W,
    matmul(x, W), addmm(b, x, W)): stored [in, out]; F.linear(x, W) or x @ W.T: stored [out, in]."""
    for node in subtree(forward):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            if _is_weight(node.right):
                return True, node.lineno
            if _transposed_weight(node.right):
                return False, node.lineno
        if isinstance(node, ast.Call):
            short = _dotted(node.func).rsplit(".", 1)[-1]
            if short in MATMUL_CALLS and node.args:
                if _is_weight(node.args[-1]):
                    return True, node.lineno
                if _transposed_weight(node.args[-1]):
                    return False, node.lineno
            if short == "linear" and len(node.args) >= 2:
                if _is_weight(node.args[1]):
                    return False, node.lineno
                if _transposed_weight(node.args[1]):
                    return True, node.lineno
    return None


def _weight_shape(init: ast.FunctionDef) -> tuple[str, str] | None:
    """The two parameter names `self.weight = nn.Parameter(torch.empty(A, B))` is created with."""
    for node in subtree(init):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and _is_weight(node.targets[0])):
            continue
        value = node.value
        if isinstance(value, ast.Call) and _dotted(value.func).rsplit(".", 1)[-1] == "Parameter" and value.args:
            value = value.args[0]
        if (isinstance(value, ast.Call) and _dotted(value.func).rsplit(".", 1)[-1] in PARAMETER_FACTORIES
                and len(value.args) == 2 and all(isinstance(a, ast.Name) for a in value.args)):
            return value.args[0].id, value.args[1].id
    return None


def _own_linear(file: str, cls: ast.ClassDef) -> LinearClass | None:
    init, forward = _method(cls, "__init__"), _method(cls, "forward")
    if init is None or forward is None:
        return None
    storage, shape = _storage(forward), _weight_shape(init)
    if storage is None or shape is None:
        return None
    transposed, line = storage
    params = [a.arg for a in init.args.posonlyargs + init.args.args][1:]
    rows, cols = shape
    if rows not in params or cols not in params:
        return None
    features_in, features_out = (rows, cols) if transposed else (cols, rows)
    layout = "[in, out]" if transposed else "[out, in]"
    return LinearClass(cls.name, transposed, params.index(features_in), params.index(features_out),
                       f"{file}:{line}: {cls.name}.forward multiplies by self.weight stored {layout}")


def built_with(sources: dict[str, str], owner: str, attribute: str) -> str | None:
    """The class `self.<attribute> = Class(...)` builds in class `owner`'s __init__ (last name component)."""
    found = _classes(sources).get(owner)
    init = _method(found[1], "__init__") if found else None
    if init is None:
        return None
    classes = {_dotted(node.value.func).rsplit(".", 1)[-1] for node in subtree(init)
               if isinstance(node, ast.Assign) and len(node.targets) == 1
               and _dotted(node.targets[0]) == f"self.{attribute}" and isinstance(node.value, ast.Call)}
    return next(iter(classes)) if len(classes) == 1 else None
