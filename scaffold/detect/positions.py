"""How the modeling code encodes positions, read from what it computes (never from the model's name).

Rotary embedding rotates the queries and keys; ALiBi adds a per-head linear bias, by key
distance, to the attention scores. Each leaves marks in the code: rotary a `rotate_half`, an
`inv_freq` or a rotary module; ALiBi the slopes formula 2 ** -(8 / n) ** k (written
2 ** (-(2 ** -(log2(n) - 3)))) and the bias tensor it builds (`build_alibi_tensor`,
`_gen_alibi_mask`, ...).
"""

from __future__ import annotations

import ast
import re

from scaffold.detect.sourcecode import Found, walk

ALIBI_NAME = re.compile(r"alibi", re.IGNORECASE)
ROTARY_NAME = re.compile(r"rotary|rotate_half|inv_freq|(^|_)rope($|_)", re.IGNORECASE)


def _name(node: ast.AST) -> str | None:
    """The identifier a node defines or reads: functions, classes, variables, attributes, arguments."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.arg):
        return node.arg
    return None


def named(sources: dict[str, str], pattern: re.Pattern) -> Found | None:
    """The first identifier of the code that matches `pattern` (strings and comments are not code)."""
    for file, node in walk(sources):
        name = _name(node)
        if name is not None and pattern.search(name):
            return Found(name, file, getattr(node, "lineno", 0))
    return None


def alibi_slopes_formula(sources: dict[str, str]) -> Found | None:
    """Where the code computes ALiBi's first slope, 2 ** (-(2 ** -(log2(n) - 3))): the geometric slopes of
    the ALiBi paper (Press et al., 2022), 2 ** (-8 / n) for n heads."""
    for file, node in walk(sources):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow)
                and isinstance(node.left, ast.Constant) and node.left.value == 2):
            continue
        inner = [n for n in ast.walk(node.right) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub)
                 and isinstance(n.right, ast.Constant) and n.right.value == 3 and "log2" in ast.unparse(n.left)]
        if inner:
            return Found("alibi slopes", file, node.lineno)
    return None


def alibi_code(sources: dict[str, str]) -> Found | None:
    """Where the code computes ALiBi: its slopes formula, else an ALiBi bias or mask it builds."""
    return alibi_slopes_formula(sources) or named(sources, ALIBI_NAME)


def rotary_code(sources: dict[str, str]) -> Found | None:
    """Where the code computes a rotary embedding."""
    return named(sources, ROTARY_NAME)
