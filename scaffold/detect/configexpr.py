"""Arithmetic over config values, as modeling code writes it, read as text and evaluated on config.json.

MiniCPM scales each residual branch by `config.scale_depth / math.sqrt(config.num_hidden_layers)` and the
hidden states before its head by `config.hidden_size / config.dim_model_base` (MiniCPM3 keeps the latter as a
config property, `logits_scaling`). `expression` turns such code into one Python expression over `config.`
(math.sqrt written as ** 0.5, properties and values kept on the module as `self.X = ...` substituted), which
the port evaluates at run time; `evaluate` computes it from config.json for the spec. Anything else (a call
other than a square root, a name that is not config) is not an expression of the config: None.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from scaffold.detect import codekeys
from scaffold.detect.sourcecode import subtree

_OPERATORS = {ast.Add: (operator.add, "+"), ast.Sub: (operator.sub, "-"), ast.Mult: (operator.mul, "*"),
              ast.Div: (operator.truediv, "/"), ast.Pow: (operator.pow, "**")}
_SQRT = ("math.sqrt", "torch.sqrt", "np.sqrt", "sqrt")


def expression(node: ast.AST, kept: dict[str, ast.expr] | None = None,
               properties: dict[str, ast.expr] | None = None, depth: int = 0) -> str | None:
    """`node` as an expression over config values (`config.K`, numbers, + - * / **, square roots), with
    `self.A` replaced by what `kept` says the module stored there and `config.P` by a config property's body;
    None when it reads anything else. An expression must read at least one config value."""
    text = _text(node, kept or {}, properties or {}, depth)
    return _bare(text) if text is not None and "config." in text else None


def _bare(text: str) -> str:
    """`text` without parentheses around the whole of it."""
    while text.startswith("(") and text.endswith(")"):
        depth = 0
        for i, char in enumerate(text):
            depth += char == "("
            depth -= char == ")"
            if depth == 0 and i < len(text) - 1:
                return text  # the first group closes before the end: (a) * (b)
        text = text[1:-1]
    return text


def _text(node: ast.AST, kept: dict, properties: dict, depth: int) -> str | None:
    if depth > 8:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return repr(node.value)
    if isinstance(node, ast.Attribute) and codekeys._is_config(node.value):
        if node.attr in properties:
            inner = _text(properties[node.attr], kept, properties, depth + 1)
            return None if inner is None else f"({inner})"
        return f"config.{node.attr}"
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
            and node.attr in kept):
        inner = _text(kept[node.attr], kept, properties, depth + 1)
        return None if inner is None else f"({inner})"
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _text(node.left, kept, properties, depth + 1), _text(node.right, kept, properties, depth + 1)
        if left is None or right is None:
            return None
        return f"({left} {_OPERATORS[type(node.op)][1]} {right})"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _text(node.operand, kept, properties, depth + 1)
        return None if inner is None else f"(-{inner})"
    if (isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords
            and ast.unparse(node.func) in _SQRT):
        inner = _text(node.args[0], kept, properties, depth + 1)
        return None if inner is None else f"({inner} ** 0.5)"
    return None


def evaluate(text: str, config: dict[str, Any]) -> float | None:
    """The value of an `expression` on config.json's values; None when a key is missing or not a number, or
    the arithmetic fails (a division by zero)."""
    try:
        return float(_evaluate(ast.parse(text, mode="eval").body, config))
    except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None


def _evaluate(node: ast.AST, config: dict[str, Any]) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "config":
        value = config[node.attr]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise TypeError(node.attr)
        return value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)][0](_evaluate(node.left, config), _evaluate(node.right, config))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, config)
    raise TypeError(ast.dump(node))


def properties(sources: dict[str, str]) -> dict[str, ast.expr]:
    """The config classes' properties whose body is one `return EXPR` (MiniCPM3's `logits_scaling`), with
    `self.X` in EXPR read as `config.X`."""
    out = {}
    for _file, tree in ((f, codekeys.parse(t)) for f, t in sources.items()):
        for cls in subtree(tree) if tree is not None else ():
            if not isinstance(cls, ast.ClassDef) or not cls.name.endswith("Config"):
                continue
            for func in cls.body:
                if (isinstance(func, ast.FunctionDef) and any(ast.unparse(d) == "property" for d in func.decorator_list)
                        and len(func.body) >= 1 and isinstance(func.body[-1], ast.Return)
                        and func.body[-1].value is not None):
                    out[func.name] = _as_config(func.body[-1].value)
    return out


class _SelfToConfig(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(id="config", ctx=node.ctx), node) if node.id == "self" else node


def _as_config(node: ast.expr) -> ast.expr:
    return _SelfToConfig().visit(ast.parse(ast.unparse(node), mode="eval").body)
