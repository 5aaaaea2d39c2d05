"""Small arithmetic functions of a checkpoint's code that a port may carry (OpenELM's make_divisible), checked.

A function qualifies when it takes plain parameters (defaults and annotations allowed) and its body only assigns names (`=`, `+=`,
...), branches (`if`/`else`) and returns at its end, over numbers, its parameters, arithmetic, comparisons and the
builtins int, float, max, min, abs and round: no loop, no attribute, no other call, no import. Such a function is
safe to copy into generated code and to evaluate by substitution (scaffold.detect.purefuncs); anything else is not.
Imports nothing of scaffold: the spec checks the functions a spec file gives with it too.
"""

from __future__ import annotations

import ast

BUILTINS = frozenset({"int", "float", "max", "min", "abs", "round"})
MAX_LINES = 40
MAX_CHARS = 4000  # 40 lines of 100 characters: a longer text is refused before it is parsed
_EXPRESSIONS = (ast.Constant, ast.Name, ast.Load, ast.Store, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare,
                ast.IfExp, ast.Call, ast.keyword, ast.unaryop, ast.boolop, ast.cmpop)
# The arithmetic a width is computed with, and no other operator: `**` and `<<` make a number of any size from small
# ones (`10 ** 10 ** 10`), which the port would compute as it loads.
OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod)


def function_problem(fn: ast.FunctionDef) -> str | None:
    """Why `fn` is not such a function, or None."""
    args = fn.args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs or fn.decorator_list:
        return "it takes more than plain parameters, or is decorated"
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                       and isinstance(s.value.value, str))]
    if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        return "it does not end in a return of a value"
    if (fn.end_lineno or fn.lineno) - fn.lineno > MAX_LINES:
        return f"it is longer than {MAX_LINES} lines"
    return _statements_problem(body[:-1]) or _expression_problem(body[-1].value) or next(
        (p for d in args.defaults if (p := _expression_problem(d))), None)


def _statements_problem(statements: list[ast.stmt]) -> str | None:
    for stmt in statements:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                or isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name)):
            problem = (_expression_problem(stmt.value) if not isinstance(stmt, ast.AugAssign)
                       or isinstance(stmt.op, OPERATORS) else f"it computes with the operator {type(stmt.op).__name__}")
        elif isinstance(stmt, ast.If):
            problem = (_expression_problem(stmt.test) or _statements_problem(stmt.body)
                       or _statements_problem(stmt.orelse))
        else:
            problem = f"line {stmt.lineno} is not an assignment or a branch"
        if problem:
            return problem
    return None


def _expression_problem(node: ast.expr) -> str | None:
    for sub in ast.walk(node):
        if isinstance(sub, ast.operator) and not isinstance(sub, OPERATORS):
            return f"it computes with the operator {type(sub).__name__}"
        if not isinstance(sub, (*_EXPRESSIONS, *OPERATORS)):
            return f"it computes with {type(sub).__name__} (line {getattr(sub, 'lineno', '?')})"
        if isinstance(sub, ast.Call) and not (isinstance(sub.func, ast.Name) and sub.func.id in BUILTINS):
            return f"it calls {ast.unparse(sub.func)} (line {sub.lineno})"
        if isinstance(sub, ast.Constant) and not (sub.value is None or isinstance(sub.value, (bool, int, float))):
            return f"it holds a constant other than a number (line {sub.lineno})"
    return None


def function_source(fn: ast.FunctionDef) -> str:
    """The function as Python source, normalized (ast.unparse), its docstring and annotations dropped (they may
    name types the port does not import: OpenELM's `v: Union[float, int]`)."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                       and isinstance(s.value.value, str))]
    params = [ast.arg(arg=a.arg) for a in fn.args.args]
    args = ast.arguments(posonlyargs=[], args=params, vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
                         defaults=list(fn.args.defaults))
    copy = ast.FunctionDef(name=fn.name, args=args, body=body, decorator_list=[], returns=None, type_comment=None,
                           type_params=[])
    return ast.unparse(ast.fix_missing_locations(copy))


def source_problem(text: str) -> str | None:
    """Why `text` is not the source of one such function, or None."""
    if len(text) > MAX_CHARS:
        return f"it is longer than {MAX_CHARS} characters"
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "it is not Python"
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        return "it is not one function definition"
    return function_problem(tree.body[0])
