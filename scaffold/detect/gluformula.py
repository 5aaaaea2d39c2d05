"""A clamped SwiGLU read from the experts' code: is it what vLLM's swigluoai computes?

GPT-OSS's experts (and MiniMax-M3's, on halves instead of alternating columns) compute

    gate = gate.clamp(max=limit); up = up.clamp(-limit, limit)
    (up + 1) * gate * sigmoid(gate * alpha)

which vLLM's FusedMoE computes as its "swigluoai" activation, with alpha 1.702 and limit 7.0 fixed in the kernel
(measured on the CPU build: vLLM's cpu_fused_moe, activation "swigluoai", takes gate from the even rows of w13 and
up from the odd ones and agrees with that formula to float32 rounding). A lab may write the same formula with
other names, another operand order, torch.clamp or F.sigmoid; or write another one (a different clamp, no +1).

MiniMax-M3's shared experts (a dense MLP) compute the same formula; for them the port uses vLLM's SwigluOAIAndMul,
which takes alpha and limit as arguments (`dense_swigluoai`).

HY-V4's experts (and GLM-5-Next's) compute another clamped SwiGLU, without alpha and without the +1:

    silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)

which is vLLM's SiluAndMulWithClamp (FusedMoE's `swiglu_limit` with activation "silu" on GPUs; vLLM's CPU experts,
cpu_fused_moe, take no limit and would compute an unclamped SiLU): `read_clamped_silu` reads it the same way, at
sample points scaled to each number the class reads, so the limit is whichever of them reproduces the formula.

So the formula is not matched as text: the statements after the cut are interpreted over numbers (a small
expression language: + - * /, unary minus, clamp/clip with min and max, sigmoid, silu, dtype casts, numbers, and
`self.A` read from __init__ as `self.A = config.KEY` or a number), at sample points where the clamps matter,
and compared with the target's values. Anything else the statements compute is named, not guessed.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

from scaffold.detect.sourcecode import subtree

# vLLM's swigluoai kernel constants (the CUDA and the CPU kernels alike).
ALPHA = 1.702
LIMIT = 7.0
# Gate and up values where both clamps, both signs and the sigmoid's curve matter.
SAMPLES = [x / 2 for x in range(-24, 25, 3)]


@dataclass(frozen=True)
class SwigluOai:
    alpha: tuple[float, str]  # (value, where it comes from: config.KEY or the number in the code)
    limit: tuple[float, str]
    evidence: str


@dataclass(frozen=True)
class ClampedSilu:
    """silu(gate.clamp(max=limit)) * up.clamp(-limit, limit), as read."""
    limit: tuple[float, str]  # (value, where it comes from: config.KEY or the number in the code)
    evidence: str


class _Unknown(Exception):
    pass


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _receiver(call: ast.Call) -> ast.AST | None:
    """x of `x.method(...)` when the call is a method of a value (not torch.f / F.f / a module)."""
    func = call.func
    if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and func.value.id in (
            "torch", "F", "nn", "functional")) and not (isinstance(func.value, ast.Attribute)
                                                       and func.value.attr in ("functional", "nn")):
        return func.value
    return None


class _Eval:
    """Evaluates an expression of the cut's halves at one sample point."""

    def __init__(self, env: dict[str, float], values: dict[str, tuple[float, str]], used: dict[str, tuple]):
        self.env, self.values, self.used = env, values, used

    def __call__(self, node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.Name) and node.id in self.env:
            return self.env[node.id]
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                and node.attr in self.values):
            self.used[node.attr] = self.values[node.attr]
            return self.values[node.attr][0]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = self(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            a, b = self(node.left), self(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if b == 0:
                raise _Unknown(ast.unparse(node))
            return a / b
        if isinstance(node, ast.Call):
            return self.call(node)
        raise _Unknown(ast.unparse(node))

    def call(self, node: ast.Call) -> float:
        name, receiver = _call_name(node), _receiver(node)
        args = ([receiver] if receiver is not None else []) + list(node.args)
        keywords = {kw.arg: kw.value for kw in node.keywords}
        if name in ("float", "contiguous", "to", "type_as") and receiver is not None:
            return self(receiver)
        if name == "sigmoid" and len(args) == 1 and not keywords:
            x = self(args[0])
            return 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0
        if name == "silu" and len(args) == 1 and not (set(keywords) - {"inplace"}):
            x = self(args[0])
            return x / (1.0 + math.exp(-x)) if x > -700 else 0.0
        if name in ("clamp", "clip") and args:
            x = self(args[0])
            low = keywords.get("min", args[1] if len(args) > 1 else None)
            high = keywords.get("max", args[2] if len(args) > 2 else None)
            if set(keywords) - {"min", "max"}:
                raise _Unknown(ast.unparse(node))
            for bound, pick in ((low, max), (high, min)):
                if bound is not None and not (isinstance(bound, ast.Constant) and bound.value is None):
                    x = pick(x, self(bound))
            return x
        raise _Unknown(ast.unparse(node))


def _result(func: ast.FunctionDef, start: int, down: str) -> tuple[list[ast.stmt], ast.AST] | None:
    """The statements after the cut (line `start`) and the expression whose value is the gated output: what the
    function returns, or what it multiplies by self.<down>. The statements are those of the block holding the cut
    (a loop over the experts' body, or the function's own)."""
    block = next((getattr(n, field) for n in subtree(func) for field in ("body", "orelse")
                  if isinstance(getattr(n, field, None), list)
                  and any(getattr(s, "lineno", None) == start for s in getattr(n, field))), func.body)
    body = [s for s in block if s.lineno > start]
    steps = []
    for stmt in body:
        for node in subtree(stmt):
            if isinstance(node, ast.Call) and _call_name(node) == "linear" and len(node.args) > 1 and any(
                    isinstance(n, ast.Attribute) and n.attr == down for n in subtree(node.args[1])):
                return steps, node.args[0]
            if isinstance(node, ast.Call) and _call_name(node) in ("bmm", "matmul", "mm") and len(node.args) == 2 \
                    and any(isinstance(n, ast.Attribute) and n.attr == down for n in subtree(node.args[1])):
                return steps, node.args[0]
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and any(
                    isinstance(n, ast.Attribute) and n.attr == down for n in subtree(node.right)):
                return steps, node.left
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == down
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "self" and len(node.args) == 1):
                return steps, node.args[0]  # a dense MLP's self.down_proj(product)
        if isinstance(stmt, ast.Return) and stmt.value is not None:
            return steps, stmt.value
        steps.append(stmt)
    return None


def _cut_line(func: ast.FunctionDef, first: str, second: str) -> int:
    return next(n.lineno for n in subtree(func) if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Tuple) and [getattr(e, "id", None) for e in t.elts] in ([first, second], [second, first])
        for t in n.targets))


def _worst(func: ast.FunctionDef, first: str, second: str, values: dict[str, tuple[float, str]], down: str,
           file: str, want, samples: list[float]) -> tuple[float, dict[str, tuple]] | str:
    """The largest relative difference between what the statements after the cut compute and want(gate, up) over
    the sample grid, and the self.A values they read; or why they cannot be read (a str naming the line)."""
    cut = _cut_line(func, first, second)
    found = _result(func, cut, down)
    if found is None:
        return f"{file}:{cut}: no return and no product with self.{down} after the cut"
    steps, result = found
    used: dict[str, tuple] = {}
    worst = 0.0
    try:
        for g in samples:
            for u in samples:
                env = {first: g, second: u}
                evaluate = _Eval(env, values, used)
                for stmt in steps:
                    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                        env[stmt.targets[0].id] = evaluate(stmt.value)
                    elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                        env[stmt.target.id] = evaluate(ast.BinOp(stmt.target, stmt.op, stmt.value))
                    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                        continue  # a docstring
                    else:
                        raise _Unknown(ast.unparse(stmt).splitlines()[0])
                got = evaluate(result)
                expected = want(g, u)
                worst = max(worst, abs(got - expected) / max(1.0, abs(expected)))
    except _Unknown as exc:
        return f"{file}:{cut}: the gate computes {str(exc)[:60]}, which the formula reader does not follow"
    return worst, used


def read_swigluoai(func: ast.FunctionDef, first: str, second: str, values: dict[str, tuple[float, str]],
                   down: str, file: str, alpha: float = ALPHA, limit: float = LIMIT) -> SwigluOai | str:
    """The clamped SwiGLU the statements of `func` after the cut into `first` (even columns or first half) and
    `second` compute, when it is swigluoai with `first` as the gate; else why not (a str)."""
    def want(g: float, u: float) -> float:
        gate = min(g, limit)
        return (max(-limit, min(u, limit)) + 1.0) * gate / (1.0 + math.exp(-alpha * gate))

    cut = _cut_line(func, first, second)
    measured = _worst(func, first, second, values, down, file, want, SAMPLES)
    if isinstance(measured, str):
        return measured
    worst, used = measured
    read = ", ".join(f"self.{a} = {w} ({v:g})" for a, (v, w) in sorted(used.items()))
    if worst > 1e-6:
        return (f"{file}:{cut}: with {read or 'no constants'}, its values differ from swigluoai's "
                f"((up.clamp(-{limit:g}, {limit:g}) + 1) * g * sigmoid({alpha:g} * g), g = gate.clamp(max={limit:g})) "
                f"by up to {worst:.2g}")
    # Which of the values read is the alpha and which the limit: the one equal to each constant.
    found_alpha = next((v for v in used.values() if v[0] == alpha), (alpha, "a number in the code"))
    found_limit = next((v for v in used.values() if v[0] == limit), (limit, "a number in the code"))
    return SwigluOai(found_alpha, found_limit, f"{file}:{cut}: {first} is the gate of swigluoai ({read})")


def read_clamped_silu(func: ast.FunctionDef, first: str, second: str, values: dict[str, tuple[float, str]],
                      down: str, file: str) -> ClampedSilu | str:
    """silu(gate.clamp(max=L)) * up.clamp(-L, L) computed by the statements of `func` after the cut into `first`
    (the gate) and `second`, with L one positive number the class reads (self.A = config.KEY or a number): the
    first L at which it agrees everywhere on a grid scaled to L (both clamps, both signs, silu's curve); else why
    not (a str naming the line)."""
    cut = _cut_line(func, first, second)
    # The numbers the class reads, and the numbers written in the function's clamps (`x.clamp(max=7.0)`).
    written = {(abs(float(n.value)), "a number in the code") for c in subtree(func)
               if isinstance(c, ast.Call) and _call_name(c) in ("clamp", "clip")
               for n in subtree(c) if isinstance(n, ast.Constant) and isinstance(n.value, (int, float))
               and not isinstance(n.value, bool)}
    candidates = sorted({v for v in values.values() if v[0] > 0} | {w for w in written if w[0] > 0})
    worst_seen = None
    for limit, origin in candidates:
        def want(g: float, u: float, limit: float = limit) -> float:
            gate = min(g, limit)
            return gate / (1.0 + math.exp(-gate)) * max(-limit, min(u, limit))

        samples = sorted({limit * x / 4 for x in range(-10, 11)} | set(SAMPLES))
        measured = _worst(func, first, second, values, down, file, want, samples)
        if isinstance(measured, str):
            return measured
        worst, used = measured
        if worst <= 1e-6:
            read = ", ".join(f"self.{a} = {w} ({v:g})" for a, (v, w) in sorted(used.items()))
            # Where the formula reads the limit from: the attribute of that value it read, not another key
            # that happens to hold the same number.
            origin = next((w for v, w in used.values() if v == limit), origin)
            return ClampedSilu((limit, origin), f"{file}:{cut}: {first} is the gate of silu(gate.clamp(max=L)) * "
                                                f"{second}.clamp(-L, L) ({read})")
        worst_seen = max(worst, worst_seen or 0.0)
    if worst_seen is None:
        return f"{file}:{cut}: no positive number the class reads could be the clamp limit"
    return (f"{file}:{cut}: its values differ from silu(gate.clamp(max=L)) * up.clamp(-L, L) at every limit L the "
            f"class reads ({', '.join(f'{o} = {v:g}' for v, o in candidates)}) by up to {worst_seen:.2g}")


def dense_swigluoai(cls: ast.ClassDef, file: str, values: dict[str, tuple[float, str]],
                    down: str) -> SwigluOai | str:
    """A dense MLP class (MiniMax-M3's shared experts) computing a clamped SwiGLU: its forward cuts one
    projection's output in halves (`gate, up = self.gate_up_proj(x).chunk(2, dim=-1)`) and applies the formula
    before self.<down>. vLLM's SwigluOAIAndMul takes alpha and limit as arguments, so each pair of the numbers
    the class reads is tried; the SwigluOai read, or why not (a str naming the line)."""
    forward = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
    if forward is None:
        return f"{file}:{cls.lineno}: {cls.name} has no forward"
    cuts = [n for n in subtree(forward) if isinstance(n, ast.Assign) and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Tuple) and len(n.targets[0].elts) == 2
            and all(isinstance(e, ast.Name) for e in n.targets[0].elts) and isinstance(n.value, ast.Call)
            and isinstance(n.value.func, ast.Attribute) and n.value.func.attr == "chunk"
            and n.value.args and isinstance(n.value.args[0], ast.Constant) and n.value.args[0].value == 2]
    if len(cuts) != 1:
        return (f"{file}:{forward.lineno}: {cls.name}'s gate and up are not one projection's output cut in "
                "halves (chunk(2)), the form the reader follows")
    first, second = (e.id for e in cuts[0].targets[0].elts)
    numbers = sorted({v for v, _ in values.values()})
    pairs = [(a, b) for a in numbers for b in numbers if a != b] or [(ALPHA, LIMIT)]
    read = None
    for alpha, limit in pairs:
        read = read_swigluoai(forward, first, second, values, down, file, alpha, limit)
        if isinstance(read, SwigluOai):
            return read
    if len(pairs) > 1:  # name the difference at vLLM's defaults
        read = read_swigluoai(forward, first, second, values, down, file)
    return read
