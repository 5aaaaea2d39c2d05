"""A transform of the final hidden states before the output head: a module of the causal-LM class whose output
the head reads (BERT's and ModernBERT-decoder's prediction head, `self.decoder(self.lm_head(h))`, computing
norm(act(dense(h)))).

Read from the code, whatever the names: in the forward of a class that builds the output head (the nn.Linear
whose tensor has vocab_size rows), the head's argument is another module's output, directly or through a local
name; that module's class builds one nn.Linear, one activation and one norm, and its forward applies them to its
input in that order (dropout at inference is the identity). The port builds the same three modules and loads the
checkpoint's tensors into them. Another order, another module in the chain, or a statement the reader does not
follow is refused naming the line.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect import codekeys
from scaffold.detect.sourcecode import _classes, subtree

LINEARS = ("Linear",)
DROPOUTS = ("Dropout",)


@dataclass(frozen=True)
class HeadTransform:
    """`self.<module> = <cls>(...)` in the causal-LM class, read by `self.<head>`; inside it, `dense`, `act` and
    `norm` in the order dense, act, norm. `act_key`: the config key of `ACT2FN[config.K]` (None: `act_name` is
    the torch activation the code builds itself)."""

    module: str
    head: str
    cls: str
    dense: str
    act: str
    norm: str
    act_key: str | None
    act_name: str | None
    where: str  # FILE:LINE of the head's call on the transform's output
    norm_built: tuple[str, tuple[str, ...]] = ("", ())  # the norm's class and its arguments after the width
    dense_bias: str = ""  # the linear map's bias argument, as written (`config.classifier_bias`)


def built_as(value: ast.AST) -> tuple[str, tuple[str, ...]]:
    """(class, its constructor's arguments after the first, as written and sorted) of `Cls(...)`, as
    submodules.constructor reads a layer's norms."""
    if not isinstance(value, ast.Call):
        return "", ()
    rest = [ast.unparse(a) for a in value.args[1:]] + [ast.unparse(k) for k in value.keywords]
    return codekeys.callee(value), tuple(sorted(rest))


class Refused(Exception):
    """A transform before the head that the port cannot compute: the message names the line and the part."""


def _self_call(node: ast.AST) -> str | None:
    """`self.X(...)` -> X."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self" and node.args):
        return node.func.attr
    return None


def last_value(func: ast.FunctionDef, name: str, line: int) -> ast.AST | None:
    """The value of the last plain `name = value` among `func`'s top-level statements before `line` (a lab's
    `h = self.backbone(ids); h = self.transform(h); return self.out(h)`); None where there is none or a statement
    in between assigns the name otherwise (a tuple, an augmented assignment, inside a branch)."""
    found = None
    for stmt in func.body:
        if stmt.lineno >= line:
            break
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and stmt.targets[0].id == name:
            found = stmt.value
        elif any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in subtree(stmt)):
            found = None
    return found


def find(sources: dict[str, str], heads: set[str] | None, config: dict) -> HeadTransform | None:
    """The transform a class building one of `heads` (attribute names; None: any nn.Linear it builds) applies
    before calling it, if any: a module of a class of the code that builds an nn.Linear of its own.

    Raises Refused where such a transform computes something the port does not."""
    classes = _classes(sources)
    for file, cls, func in codekeys.methods(sources):
        if func.name != "forward":
            continue
        built = {a: v for _f, c, fn, a, v in codekeys.self_assignments(sources) if c is cls and fn.name == "__init__"}
        for node in subtree(func):
            head = _self_call(node)
            if head is None or heads is not None and head not in heads or codekeys.callee(built.get(head)) not in LINEARS:
                continue
            arg = node.args[0]
            if isinstance(arg, ast.Subscript):  # h[:, slice_indices, :]
                arg = arg.value
            if isinstance(arg, ast.Name):
                arg = last_value(func, arg.id, node.lineno)
            inner = _self_call(arg)
            if inner is None or not isinstance(built.get(inner), ast.Call):
                continue
            name = codekeys.callee(built[inner])
            if name not in classes or not any(isinstance(n, ast.Call) and codekeys.callee(n) in LINEARS
                                              for n in subtree(classes[name][1])):
                continue  # not a module of the code's, or one without a linear map (a final norm)
            return _read(classes[name], inner, head, f"{file}:{node.lineno}", config)
    return None


def _read(found: tuple[str, ast.ClassDef], module: str, head: str, where: str, config: dict) -> HeadTransform:
    file, cls = found
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    forward = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
    if init is None or forward is None or len(forward.args.args) != 2:
        raise Refused(f"{file}:{cls.lineno}: {cls.name}, the module the head reads ({where}), has no "
                      "forward(self, x) the reader follows")
    roles: dict[str, tuple[str, ast.AST]] = {}
    for node in subtree(init):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and isinstance(node.targets[0].value, ast.Name) and node.targets[0].value.id == "self"):
            roles[node.targets[0].attr] = (_role(node.value), node.value)
    chain = _chain(forward, file, cls.name)
    kinds = [roles.get(attr, ("?", None))[0] for attr in chain]
    applied = [(a, k) for a, k in zip(chain, kinds, strict=True) if k != "dropout"]
    if [k for _a, k in applied] != ["linear", "act", "norm"]:
        shown = ", ".join(f"self.{a} ({k if k != '?' else 'unknown'})" for a, k in zip(chain, kinds, strict=True))
        raise Refused(f"{file}:{forward.lineno}: {cls.name}.forward, the transform before the head ({where}), "
                      f"applies {shown or 'no module'}; the port computes norm(act(linear(x))) only")
    act_value = roles[applied[1][0]][1]
    act_key, act_name = _activation(act_value, config)
    if act_name is None:
        raise Refused(f"{file}:{act_value.lineno}: {cls.name}.{applied[1][0]} = {ast.unparse(act_value)}, an "
                      "activation of the transform before the head the reader does not name")
    return HeadTransform(module, head, cls.name, applied[0][0], applied[1][0], applied[2][0], act_key, act_name,
                         where, built_as(roles[applied[2][0]][1]), _bias_argument(roles[applied[0][0]][1]))


def _bias_argument(call: ast.AST) -> str:
    """nn.Linear(in, out, bias): the bias argument as written, "" where it is left to its default."""
    if not isinstance(call, ast.Call):
        return ""
    found = next((k.value for k in call.keywords if k.arg == "bias"), call.args[2] if len(call.args) > 2 else None)
    return ast.unparse(found) if found is not None else ""


def _role(value: ast.AST) -> str:
    if isinstance(value, ast.Subscript) and ast.unparse(value.value) in ("ACT2FN", "ACT2CLS"):
        return "act"
    if isinstance(value, ast.Call):
        name = codekeys.callee(value)
        if name in LINEARS:
            return "linear"
        if name in DROPOUTS:
            return "dropout"
        if "Norm" in name:
            return "norm"
        if name in ("get_activation",) or name in ("GELU", "SiLU", "ReLU", "Tanh"):
            return "act"
    return "?"


def _chain(forward: ast.FunctionDef, file: str, cls: str) -> list[str]:
    """The self.X modules the forward applies to its input, first applied first."""
    x = forward.args.args[1].arg
    env: dict[str, list[str]] = {x: []}

    def value(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Name) and node.id in env:
            return env[node.id]
        attr = _self_call(node)
        if attr is not None and len(node.args) == 1 and not node.keywords:
            return [*value(node.args[0]), attr]
        raise Refused(f"{file}:{node.lineno}: {cls}.forward computes {ast.unparse(node)}, which the reader of a "
                      "transform before the head does not follow")

    for stmt in forward.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # docstring
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            env[stmt.targets[0].id] = value(stmt.value)
        elif isinstance(stmt, ast.Return) and stmt.value is not None:
            return value(stmt.value)
        else:
            raise Refused(f"{file}:{stmt.lineno}: {cls}.forward: {ast.unparse(stmt).splitlines()[0]}, a statement "
                          "the reader of a transform before the head does not follow")
    raise Refused(f"{file}:{forward.lineno}: {cls}.forward returns nothing the reader follows")


TORCH = {"GELU": "gelu", "SiLU": "silu", "ReLU": "relu", "Tanh": "tanh"}


def _activation(node: ast.AST, config: dict) -> tuple[str | None, str | None]:
    """(config key, activation name) of `ACT2FN[config.K]` (the name config.json gives K), of
    `get_activation(config.K)`, or (None, name) of a torch module built in place (nn.GELU())."""
    key = None
    if isinstance(node, ast.Subscript):
        key = node.slice
    elif isinstance(node, ast.Call) and codekeys.callee(node) == "get_activation" and node.args:
        key = node.args[0]
    elif isinstance(node, ast.Call) and codekeys.callee(node) in TORCH:
        approximate = next((k.value for k in node.keywords if k.arg == "approximate"), None)
        if approximate is not None and not (isinstance(approximate, ast.Constant) and approximate.value == "none"):
            return None, None
        return None, TORCH[codekeys.callee(node)]
    if (isinstance(key, ast.Attribute) and ast.unparse(key.value) in ("config", "self.config")
            and isinstance(config.get(key.attr), str)):
        return key.attr, config[key.attr]
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return None, key.value
    return None, None
