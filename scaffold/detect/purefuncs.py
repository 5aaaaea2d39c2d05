"""Calls to the checkpoint's own small arithmetic functions, written out as one expression of their arguments.

OpenELM sizes each layer's FFN with a helper of its configuration file:

    def make_divisible(v, divisor=8, min_value=None):
        if min_value is None:
            min_value = divisor
        new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
        if new_v < 0.9 * v:
            new_v += divisor
        return new_v

    intermediate_dim = int(make_divisible(ffn_multiplier * config.model_dim, divisor=config.ffn_dim_divisor))

A module-level function whose body only assigns names (`=`, `+=`, ...), branches on a condition and returns at its
end, over numbers, arithmetic, comparisons and the builtins int, float, max, min, abs and round, is substituted
into the call as one expression (a branch becomes `a if c else b`; a test of a constant, `None is None`, is decided
on the spot), so that the port evaluates the width as the code computes it on the config it serves. Anything else
(a loop, a call of any other function, an early return, *args) leaves the call as it is. Read as text, never run.
"""

from __future__ import annotations

import ast
import copy

from scaffold.detect.sourcecode import _parsed
from scaffold.purecode import BUILTINS, function_problem, function_source

MAX_NODES = 400  # an expression larger than this is no width a port should spell out
_ALLOWED = (ast.Constant, ast.Name, ast.Load, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call,
            ast.Attribute, ast.Subscript, ast.keyword, ast.operator, ast.unaryop, ast.boolop, ast.cmpop)


def _functions(sources: dict) -> dict[str, tuple[str, ast.FunctionDef]]:
    """name -> (file, definition) of the module-level functions of `sources` that scaffold.purecode accepts. A name
    two files define differently is left out: which one a call reaches depends on the caller's imports, and the
    port must not carry the other."""
    defined: dict[str, list[tuple[str, ast.FunctionDef]]] = {}
    for file, tree in _parsed(sources):
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.setdefault(node.name, []).append((file, node))
    return {name: found[0] for name, found in defined.items()
            if all(isinstance(fn, ast.FunctionDef) and function_problem(fn) is None for _file, fn in found)
            and len({function_source(fn) for _file, fn in found}) == 1}


def inline(expr: ast.expr, sources: dict) -> ast.expr:
    """`expr` with every call of such a function of `sources` written out (nested calls too)."""
    functions = {name: fn for name, (_file, fn) in _functions(sources).items()}
    if not functions:
        return expr
    return _Inline(functions).visit(copy.deepcopy(expr))


def called(expr: ast.expr, sources: dict) -> list[tuple[str, str]]:
    """(file:line, source) of each such function `expr` calls, as the port carries it (purecode.function_source),
    in the order of the calls; the same function once."""
    functions = _functions(sources)
    found = {}
    for node in ast.walk(expr):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions:
            file, fn = functions[node.func.id]
            found.setdefault(fn.name, (f"{file}:{fn.lineno}", function_source(fn)))
    return list(found.values())


class _Inline(ast.NodeTransformer):
    def __init__(self, functions: dict[str, ast.FunctionDef], depth: int = 0):
        self.functions, self.depth = functions, depth

    def visit_Call(self, node: ast.Call) -> ast.expr:
        node = self.generic_visit(node)
        fn = self.functions.get(node.func.id) if isinstance(node.func, ast.Name) else None
        if fn is None or self.depth > 4:
            return node
        body = _written_out(fn, node)
        if body is None:
            return node
        body = _Inline(self.functions, self.depth + 1).visit(body)
        return body if _size(body) <= MAX_NODES else node


def _written_out(fn: ast.FunctionDef, call: ast.Call) -> ast.expr | None:
    """The function's return value as an expression of the call's arguments; None where its body is not of the
    form above."""
    args = fn.args
    params = [a.arg for a in args.args]
    defaults = dict(zip(params[len(params) - len(args.defaults):], args.defaults))
    if len(call.args) > len(params) or any(k.arg not in params for k in call.keywords) \
            or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    env: dict[str, ast.expr] = dict(zip(params, call.args))
    for k in call.keywords:
        if k.arg in env:
            return None
        env[k.arg] = k.value
    for name in params:
        if name not in env:
            if name not in defaults:
                return None
            env[name] = defaults[name]
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        return None
    if not _run(body[:-1], env, set(params)):
        return None
    return _substituted(body[-1].value, env)


def _size(node: ast.AST) -> int:
    return sum(1 for _ in ast.walk(node))


def _run(statements: list[ast.stmt], env: dict[str, ast.expr], bound: set[str]) -> bool:
    for stmt in statements:
        if any(_size(value) > MAX_NODES for value in env.values()):
            return False  # each step may double what a name holds: stop before the copies grow large
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            value = _substituted(stmt.value, env)
            if value is None:
                return False
            env[stmt.targets[0].id] = value
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id in env:
            value = _substituted(stmt.value, env)
            if value is None:
                return False
            env[stmt.target.id] = ast.BinOp(left=env[stmt.target.id], op=stmt.op, right=value)
        elif isinstance(stmt, ast.If):
            test = _substituted(stmt.test, env)
            if test is None:
                return False
            decided = _decided(test)
            if decided is not None:
                if not _run(stmt.body if decided else stmt.orelse, env, bound):
                    return False
                continue
            then, other = dict(env), dict(env)
            if not (_run(stmt.body, then, bound) and _run(stmt.orelse, other, bound)):
                return False
            for name in set(then) | set(other):
                if name not in then or name not in other:
                    return False  # assigned on one branch only, and unbound before it
                if then[name] is not other[name]:
                    env[name] = _min_max(test, then[name], other[name]) or ast.IfExp(
                        test=test, body=then[name], orelse=other[name])
        else:
            return False
    return True


def _min_max(test: ast.expr, body: ast.expr, orelse: ast.expr) -> ast.expr | None:
    """`max(a, b)` for `b if a < b else a` (`if rounded < floor: rounded = floor`), `min(a, b)` for `a if a < b else
    b`, and so on for the other comparisons: the branch a clamp is, written as Python's builtin says it."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], (ast.Lt, ast.LtE, ast.Gt, ast.GtE))):
        return None
    left, right = ast.dump(test.left), ast.dump(test.comparators[0])
    if {ast.dump(body), ast.dump(orelse)} != {left, right} or left == right:
        return None
    less = isinstance(test.ops[0], (ast.Lt, ast.LtE))
    picks_right = ast.dump(body) == right
    name = "max" if less == picks_right else "min"
    return ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=[test.left, test.comparators[0]], keywords=[])


def _decided(test: ast.expr) -> bool | None:
    """The truth of `X is None` / `X is not None` with X a constant; None for any other test."""
    if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Is, ast.IsNot))
            and isinstance(test.left, ast.Constant) and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value is None):
        same = test.left.value is None
        return same if isinstance(test.ops[0], ast.Is) else not same
    return None


def _substituted(node: ast.expr, env: dict[str, ast.expr]) -> ast.expr | None:
    """`node` with the function's names replaced by what they hold; None where it holds anything but arithmetic,
    comparisons and calls of the builtins."""
    for sub in ast.walk(node):
        if not isinstance(sub, _ALLOWED):
            return None
        if isinstance(sub, ast.Call) and not (isinstance(sub.func, ast.Name) and sub.func.id in BUILTINS):
            return None
        if isinstance(sub, (ast.Attribute, ast.Subscript)):
            return None  # the function reads its arguments only
    node = copy.deepcopy(node)
    callees = {id(sub.func) for sub in ast.walk(node) if isinstance(sub, ast.Call)}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and id(sub) not in callees and sub.id not in env:
            return None

    class Substitute(ast.NodeTransformer):
        def visit_Name(self, name: ast.Name) -> ast.expr:
            return copy.deepcopy(env[name.id]) if id(name) not in callees else name

    return Substitute().visit(node)
