"""Which branch of a conditional module assignment the checkpoint's config selects.

Modeling code often picks a module's class from the config:

    self.input_layernorm = (
        Cohere2MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        if config.rms_norm_eps is not None
        else Cohere2MoeLayerNorm(config.hidden_size, eps=config.layer_norm_eps)
    )

Detection reads the branch that this checkpoint's config.json selects. A condition over anything but
config values and constants (or over a key config.json does not hold, whose value the config class's
default decides) is not evaluated: the assignment stays undecided rather than guessed.
"""

from __future__ import annotations

import ast
import copy
import math
import operator
from typing import Any

_UNKNOWN = object()

_COMPARE = {ast.Is: operator.is_, ast.IsNot: operator.is_not, ast.Eq: operator.eq, ast.NotEq: operator.ne,
            ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Mod: operator.mod,
               ast.FloorDiv: operator.floordiv, ast.Div: operator.truediv}
_BUILTINS = {"int": int, "float": float, "max": max, "min": min, "abs": abs, "round": round}


# No width or count of a model is this large; an int beyond it (a config value of 10**400, a helper squaring its
# argument over and over) is no number the arithmetic follows: math.isfinite cannot take it, str() of it is refused
# past 4300 digits, and products of it grow without bound.
MAX_INT_BITS = 4096
# round(n, ndigits) of an int computes 10 ** -ndigits: seconds for ndigits = -10**7, a hang for -10**9.
MAX_NDIGITS = 1000


def _number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value.bit_length() <= MAX_INT_BITS
    return isinstance(value, float) and math.isfinite(value)


def _value(node: ast.expr, config: dict[str, Any], local: dict[str, Any] | None = None) -> Any:
    """A constant, or `config.KEY` / `self.config.KEY` / `getattr(config, "KEY", default)` read from config.json;
    with `local` ({"layer_idx": 3}), also those names and an item of a config list they index
    (`config.layer_types[layer_idx]`)."""
    if isinstance(node, ast.Constant):
        return node.value
    if local is not None and isinstance(node, ast.IfExp):
        truth = evaluate(node.test, config, local)
        return _UNKNOWN if truth is None else _value(node.body if truth else node.orelse, config, local)
    if local is not None and isinstance(node, ast.Name) and node.id in local:
        return local[node.id]
    if local is not None and isinstance(node, ast.Subscript):
        seq, index = _value(node.value, config, local), _value(node.slice, config, local)
        if isinstance(seq, (list, tuple)) and isinstance(index, int) and not isinstance(index, bool) \
                and -len(seq) <= index < len(seq):
            return seq[index]
        return _UNKNOWN
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_value(e, config, local) for e in node.elts]
        return _UNKNOWN if any(i is _UNKNOWN for i in items) else tuple(items)
    if isinstance(node, ast.Attribute) and ast.unparse(node.value) in ("config", "self.config"):
        return config.get(node.attr, _UNKNOWN)
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        # Arithmetic over such values (`config.num_hidden_layers - 1`, `(layer_idx + 1) % config.k`, OpenELM's
        # `config.ffn_multipliers[layer_idx] * config.model_dim`), as Python computes it.
        left, right = _value(node.left, config, local), _value(node.right, config, local)
        if not all(_number(v) for v in (left, right)):
            return _UNKNOWN
        if type(node.op) in (ast.Mod, ast.FloorDiv, ast.Div) and right == 0:
            return _UNKNOWN
        try:
            result = _ARITHMETIC[type(node.op)](left, right)
        except OverflowError:
            return _UNKNOWN
        return result if _number(result) else _UNKNOWN
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _BUILTINS
            and node.args and not node.keywords):
        # int(...), max(...): the builtins a helper of the code (purefuncs) sizes a width with.
        args = [_value(a, config, local) for a in node.args]
        if not all(_number(a) for a in args) or (node.func.id in ("int", "float", "abs") and len(args) != 1):
            return _UNKNOWN
        if node.func.id == "round" and len(args) == 2 and not (isinstance(args[1], int)
                                                               and abs(args[1]) <= MAX_NDIGITS):
            return _UNKNOWN
        try:
            result = _BUILTINS[node.func.id](*args)
        except (OverflowError, ValueError, TypeError):
            return _UNKNOWN
        return result if _number(result) else _UNKNOWN
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr"
            and len(node.args) == 2 and ast.unparse(node.args[0]) in ("config", "self.config")
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        # True where config.json holds the key; where it does not, the config class may still define it.
        return True if node.args[1].value in config else _UNKNOWN
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) in (2, 3) and ast.unparse(node.args[0]) in ("config", "self.config")
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        key = node.args[1].value
        if key in config:
            return config[key]
        return _value(node.args[2], config) if len(node.args) == 3 else _UNKNOWN
    return _UNKNOWN


def evaluate(test: ast.expr, config: dict[str, Any], local: dict[str, Any] | None = None) -> bool | None:
    """The truth of `test` under config.json (and the names of `local`), or None when it reads something else."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = evaluate(test.operand, config, local)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        parts = [evaluate(v, config, local) for v in test.values]
        if isinstance(test.op, ast.And):
            return False if False in parts else (None if None in parts else True)
        return True if True in parts else (None if None in parts else False)
    if isinstance(test, ast.Compare) and len(test.ops) > 1 and all(type(op) in _COMPARE for op in test.ops):
        # A chained comparison (`layer_idx >= first_shared >= 0`): each adjacent pair, all of them holding.
        operands = [test.left, *test.comparators]
        parts = [evaluate(ast.Compare(left=a, ops=[op], comparators=[b]), config, local)
                 for a, op, b in zip(operands, test.ops, operands[1:])]
        return False if False in parts else (None if None in parts else True)
    if (local is not None and isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], (ast.Is, ast.IsNot)) and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value is None and _constructed(test.left, config, local) is not None):
        # `self.v_proj is not None` of `self.v_proj = nn.Linear(...) if COND else None`: the branch COND selects.
        built = _constructed(test.left, config, local)
        return built if isinstance(test.ops[0], ast.IsNot) else not built
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _COMPARE:
        left, right = _value(test.left, config, local), _value(test.comparators[0], config, local)
        if left is _UNKNOWN or right is _UNKNOWN:
            return None
        try:
            return bool(_COMPARE[type(test.ops[0])](left, right))
        except TypeError:  # a comparison config.json's types do not support (None < 3)
            return None
    value = _value(test, config, local)
    return None if value is _UNKNOWN else bool(value)


def _constructed(node: ast.expr, config: dict[str, Any], local: dict[str, Any]) -> bool | None:
    """True where `node`, its conditions decided, is a class's constructor call (`nn.Linear(...)`: an object, never
    None), False where it is the constant None, else None."""
    while isinstance(node, ast.IfExp):
        truth = evaluate(node.test, config, local)
        if truth is None:
            return None
        node = node.body if truth else node.orelse
    if isinstance(node, ast.Constant) and node.value is None:
        return False
    if isinstance(node, ast.Call):
        name = ast.unparse(node.func).rsplit(".", 1)[-1]
        return True if name[:1].isupper() else None
    return None


def selected(value: ast.expr, config: dict[str, Any] | None) -> ast.expr | None:
    """The expression an assignment's right-hand side reduces to under config.json: the chosen branch of each
    `A if COND else B`, or None when a condition cannot be evaluated (or no config is given)."""
    while isinstance(value, ast.IfExp):
        truth = evaluate(value.test, config) if config is not None else None
        if truth is None:
            return None
        value = value.body if truth else value.orelse
    return value


def self_assignments(init: ast.FunctionDef | None) -> dict[str, ast.expr]:
    """`self.X = <expr>` of an __init__ (the last one where several), by X."""
    if init is None:
        return {}
    return {t.attr: n.value for n in ast.walk(init) if isinstance(n, ast.Assign) and len(n.targets) == 1
            for t in n.targets if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self"}


def guarded(body: list[ast.stmt], tests: list | None = None):
    """Each node of `body` with the (if-test, polarity) pairs of the `if` statements enclosing it."""
    tests = tests or []
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from ((n, tests) for n in ast.walk(stmt.test))
            yield from guarded(stmt.body, tests + [(stmt.test, True)])
            yield from guarded(stmt.orelse, tests + [(stmt.test, False)])
            # `if not on: return ...`: what follows runs only where the branch that left did not
            if _leaves(stmt.body) and not _leaves(stmt.orelse):
                tests = tests + [(stmt.test, False)]
            elif _leaves(stmt.orelse) and not _leaves(stmt.body):
                tests = tests + [(stmt.test, True)]
        elif isinstance(stmt, (ast.For, ast.While, ast.With, ast.Try)):
            # the statement's own header, then its blocks under the same tests
            for field in ("target", "iter", "test", "items"):
                for part in (getattr(stmt, field, None),) if not isinstance(getattr(stmt, field, None), list) \
                        else getattr(stmt, field):
                    if part is not None:
                        yield from ((n, tests) for n in ast.walk(part))
            for block in ("body", "orelse", "finalbody"):
                yield from guarded(getattr(stmt, block, []) or [], tests)
            for handler in getattr(stmt, "handlers", []) or []:
                yield from guarded(handler.body, tests)
        else:
            yield from ((n, tests) for n in ast.walk(stmt))


def _leaves(block: list[ast.stmt]) -> bool:
    """The block always leaves its own (its last statement returns or raises)."""
    return bool(block) and isinstance(block[-1], (ast.Return, ast.Raise))


def branch_taken(tests: list[tuple[ast.expr, bool]], assigned: dict[str, ast.expr], config: dict[str, Any]) -> bool | None:
    """Whether config.json runs the branch under these (test, polarity) pairs: `self.X` read through __init__'s
    `self.X = <expr>` (`assigned`), `self.training` False (serving never trains); None when a test reads something
    else (an input, a runtime value)."""
    undecided = False
    for test, polarity in tests:
        truth = evaluate(through_init(test, assigned), config)
        if truth is None:
            undecided = True
        elif truth != polarity:
            return False  # one test config.json decides against the branch is enough, whatever the others read
    return None if undecided else True


def through_init(test: ast.expr, assigned: dict[str, ast.expr]) -> ast.expr:
    """`test` with each `self.X` replaced by __init__'s `<expr>` of `self.X = <expr>` and `self.training` by False."""
    def swap(node: ast.expr) -> ast.expr:
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "self":
            if node.attr == "training":
                return ast.Constant(False)
            if node.attr in assigned:
                return copy.deepcopy(assigned[node.attr])
        return node

    test = swap(copy.deepcopy(test))
    for node in ast.walk(test):
        for field, value in ast.iter_fields(node):
            if isinstance(value, ast.expr):
                setattr(node, field, swap(value))
            elif isinstance(value, list):
                setattr(node, field, [swap(v) if isinstance(v, ast.expr) else v for v in value])
    return test
