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
from dataclasses import dataclass

from scaffold.detect.codekeys import callee, methods, self_assignments
from scaffold.detect.sourcecode import Found, _classes, _dotted, subtree, walk

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
        inner = [n for n in subtree(node.right) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub)
                 and isinstance(n.right, ast.Constant) and n.right.value == 3 and "log2" in ast.unparse(n.left)]
        if inner:
            return Found("alibi slopes", file, node.lineno)
    return None


def alibi_code(sources: dict[str, str]) -> Found | None:
    """Where the code computes ALiBi: its slopes formula, else an ALiBi bias or mask it builds."""
    return alibi_slopes_formula(sources) or named(sources, ALIBI_NAME)


def alibi_scaled(sources: dict[str, str]) -> Found | None:
    """Where the code scales the ALiBi bias together with the scores, by the attention's scale: divides the bias by
    a square root (Falcon's `alibi / math.sqrt(head_dim)`), or multiplies a sum of scores and bias in place
    (`logits = scores + alibi; logits *= self.inv_norm_factor`). BLOOM adds it unscaled (baddbmm's beta = 1)."""
    for file, tree in ((f, n) for f, n in walk(sources) if isinstance(n, ast.FunctionDef)):
        with_bias = set()
        for node in subtree(tree):
            if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
                    and ALIBI_NAME.search(ast.unparse(node.left)) and "sqrt" in ast.unparse(node.right)):
                return Found("alibi scaled", file, node.lineno)
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Add)
                    and ALIBI_NAME.search(ast.unparse(node.value))):
                with_bias.add(node.targets[0].id)
        for node in subtree(tree):
            if (isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Mult)
                    and isinstance(node.target, ast.Name) and node.target.id in with_bias):
                return Found("alibi scaled", file, node.lineno)
    return None


def rotary_code(sources: dict[str, str]) -> Found | None:
    """Where the code computes a rotary embedding."""
    return named(sources, ROTARY_NAME)


# ---------------------------------------------------------------- learned absolute positions
@dataclass(frozen=True)
class LearnedPositions:
    """A second embedding table, indexed by position, added to the token embedding (GPT-2's wpe)."""

    tokens: str  # attribute of the token embedding (wte)
    positions: str  # attribute of the position embedding (wpe)
    offset: int  # added to the position before the lookup (OPT's 2)
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


MAX_FOLLOW = 4  # local assignments followed from an operand of the sum back to the embedding call


def _embedding_classes(sources: dict[str, str]) -> set[str]:
    """nn.Embedding and the code's subclasses of it (OPT's OPTLearnedPositionalEmbedding)."""
    out = {"Embedding"}
    for _name, (_file, cls) in _classes(sources).items():
        if any(_dotted(b).rsplit(".", 1)[-1] == "Embedding" for b in cls.bases):
            out.add(cls.name)
    return out


def _mentions_position(node: ast.AST) -> bool:
    return any(re.search(r"pos", n, re.IGNORECASE) for sub in subtree(node) if (n := _name(sub)))


def _offset(sources: dict[str, str], cls_name: str) -> int:
    """The constant a position-embedding subclass adds to every position (`self.offset = 2` ... `+ self.offset`)."""
    found = _classes(sources).get(cls_name)
    if found is None:
        return 0
    cls = found[1]
    value = None
    for node in subtree(cls):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and _dotted(node.targets[0]) == "self.offset"
                and isinstance(node.value, ast.Constant) and type(node.value.value) is int):
            value = node.value.value
    added = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add) and "self.offset" in (
        _dotted(n.left), _dotted(n.right)) for n in subtree(cls))
    return value if value is not None and added else 0


def positions_offset(sources: dict[str, str], cls_name: str) -> int:
    """The constant the position module's class adds to every position (XGLM's `self.offset = 2`)."""
    return _offset(sources, cls_name)


def learned_positions(sources: dict[str, str]) -> LearnedPositions | None:
    """Where a forward adds a position-indexed embedding to the token embedding: `self.wte(input_ids) +
    self.wpe(position_ids)`, directly or through local names. The position table is the one whose lookup reads
    positions (an argument named for them); None when the code has no such sum."""
    return _added_positions(sources, _embedding_classes(sources))


def computed_positions(sources: dict[str, str]) -> tuple[LearnedPositions, str] | None:
    """(where, builder) of absolute positions the code computes rather than stores: a module other than an
    embedding table, called on the positions (XGLM's sinusoidal module), or a buffer the code builds and indexes by
    the positions (CTRL's `self.pos_encoding[position_ids, :]`), added to the token embedding. The builder is the
    module's class, or the function whose result the buffer holds."""
    tables = _embedding_classes(sources)
    found = _added_positions(sources, None)
    if found is None:
        return None
    kinds = [_builder(value) for _f, _c, func, attr, value in self_assignments(sources)
             if attr == found.positions and isinstance(value, ast.Call) and func.name == "__init__"]
    kinds += [_builder(value) for attr, value in registered(sources) if attr == found.positions]
    kind = next((k for k in kinds if k), "")
    return (found, kind) if kind and kind not in tables else None


def registered(sources: dict[str, str]):
    """(name, value) of every `self.register_buffer("name", f(...))` in a constructor, the value a call."""
    for _file, _cls, func in methods(sources):
        if func.name != "__init__":
            continue
        for node in subtree(func):
            if (isinstance(node, ast.Call) and _dotted(node.func) == "self.register_buffer" and len(node.args) >= 2
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                    and isinstance(node.args[1], ast.Call)):
                yield node.args[0].value, node.args[1]


BUFFER_WRAPPERS = ("Buffer", "Parameter", "tensor", "as_tensor")


def _builder(call: ast.Call) -> str:
    """The class or function a module attribute is built with: `nn.Buffer(f(...))` is f's."""
    name = callee(call)
    if name in BUFFER_WRAPPERS and call.args and isinstance(call.args[0], ast.Call):
        return callee(call.args[0])
    return name


def _added_positions(sources: dict[str, str], classes: set[str] | None) -> LearnedPositions | None:
    """The sum token_module(ids) + position_module(positions), with modules built from `classes` (None: any)."""
    embeddings = {attr: callee(value) for _file, _cls, _func, attr, value in self_assignments(sources)
                  if isinstance(value, ast.Call) and (classes is None or callee(value) in classes)}
    if classes is None:
        embeddings.update({attr: _builder(value) for attr, value in registered(sources)})
    for file, _cls, func in methods(sources):
        if func.name != "forward":
            continue
        local: dict[str, list[ast.AST]] = {}
        for node in subtree(func):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                local.setdefault(node.targets[0].id, []).append(node.value)

        def lookups(node: ast.AST, depth: int = 0) -> list[tuple[str, ast.Call]]:
            if depth > MAX_FOLLOW:
                return []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if _dotted(node.func) in {f"self.{a}" for a in embeddings}:
                    return [(node.func.attr, node)]
                if node.func.attr in ("to", "type", "type_as", "contiguous", "float"):
                    return lookups(node.func.value, depth + 1)
            if isinstance(node, ast.Name):
                return [hit for value in local.get(node.id, []) for hit in lookups(value, depth + 1)]
            if (classes is None and isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                    and _dotted(node.value) in {f"self.{a}" for a in embeddings}):
                return [(node.value.attr, node)]  # a computed table indexed by the positions (CTRL's buffer)
            return []

        for node in subtree(func):
            if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)):
                continue
            for left, right in ((node.left, node.right), (node.right, node.left)):
                for tok, tok_call in lookups(left):
                    for pos, pos_call in lookups(right):
                        if tok != pos and _mentions_position(pos_call) and not _mentions_position(tok_call):
                            offset = _offset(sources, embeddings[pos]) if classes is not None else 0
                            return LearnedPositions(tok, pos, offset, file, node.lineno)
    return None
