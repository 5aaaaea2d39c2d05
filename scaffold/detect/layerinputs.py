"""Per-layer input embeddings (Gemma 3n's and Gemma 4's PLE), named from the code that computes them (read as
text, never run).

The model that builds the decoder stack builds a second embedding table of the token ids besides the one that
starts the residual stream, and hands what that table gives (sliced per layer, projected, mixed) to each decoder
layer call as an argument of its own, beside the hidden states. The port's decoder layers take the hidden states
alone, from one embedding; a second input per layer is not a form it has.

The reading follows values, not names: in the model's forward (and the methods of its own class that forward
calls, inlined), each value carries the embedding modules it was computed from; at the call of a layer of the
stack (`for ... in self.<stack>: layer(...)`, `self.<stack>[i](...)`), an embedding that reaches an argument other
than the first (the hidden states) and does not reach the first is such a per-layer input. A position embedding
added to the token embedding (GPT-2's wpe) reaches the hidden states and is not one.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect import dataflow
from scaffold.detect.sourcecode import _dotted, _parsed, subtree

DEPTH = 3  # methods of the model's own class inlined into one another at most this deep


@dataclass(frozen=True)
class LayerInput:
    """A per-layer input embedding as the code builds and hands it."""

    model_cls: str
    table: str  # the attribute of the second embedding (embed_tokens_per_layer)
    table_cls: str
    table_where: str  # FILE:LINE where __init__ builds it
    stream: str  # the embedding the hidden states come from (embed_tokens)
    call_where: str  # FILE:LINE of the layer call that takes it
    argument: str  # that call's argument carrying it, as written

    def __str__(self) -> str:
        return (f"per-layer input embeddings: {self.model_cls} builds {self.table} ({self.table_cls}, "
                f"{self.table_where}), an embedding of the token ids besides {self.stream}, and hands what it gives "
                f"to each decoder layer beside the hidden states ({self.call_where}: argument {self.argument}); the "
                "port's decoder layers take the hidden states alone, from one embedding")

    def short(self) -> str:
        return f"per-layer input embeddings ({self.table}, {self.table_where}, handed to each layer at {self.call_where})"


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _embedding_classes(sources: dict) -> set[str]:
    """nn.Embedding and the source's classes derived from it (Gemma's scaled word embedding), by their last name."""
    bases: dict[str, set[str]] = {}
    for _file, tree in _parsed(sources):
        for cls in (n for n in subtree(tree) if isinstance(n, ast.ClassDef)):
            bases[cls.name] = {_dotted(b).rsplit(".", 1)[-1] for b in cls.bases}
    found = {"Embedding"}
    grew = True
    while grew:
        grew = False
        for name, parents in bases.items():
            if name not in found and parents & found:
                found.add(name)
                grew = True
    return found


class _Taint:
    """Which embedding modules each value of a method was computed from."""

    def __init__(self, cls: ast.ClassDef, embeddings: dict[str, int], stack: str, file: str):
        self.cls, self.embeddings, self.stack, self.file = cls, embeddings, stack, file
        self.calls: list[tuple[int, list[tuple[str, frozenset]]]] = []  # layer calls: line, (arg text, taint)

    def expr(self, node: ast.AST | None, env: dict, depth: int) -> frozenset:
        if node is None:
            return frozenset()
        if isinstance(node, ast.Name):
            return env.get(node.id, frozenset())
        if isinstance(node, ast.Call):
            func = node.func
            args = [*node.args, *(k.value for k in node.keywords)]
            if isinstance(func, ast.Attribute) and _dotted(func.value) == "self":
                if func.attr in self.embeddings:
                    return frozenset({func.attr})
                method = _method(self.cls, func.attr)
                if method is not None and depth < DEPTH:
                    return self.inline(method, node, env, depth + 1)
            out = frozenset()
            if isinstance(func, ast.Attribute):
                out |= self.expr(func.value, env, depth)  # x.reshape(...), x.to(...)
            for arg in args:
                out |= self.expr(arg.value if isinstance(arg, ast.Starred) else arg, env, depth)
            return out
        if isinstance(node, ast.Lambda):
            return frozenset()
        out = frozenset()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                out |= self.expr(child, env, depth)
        return out

    def inline(self, method: ast.FunctionDef, call: ast.Call, env: dict, depth: int) -> frozenset:
        params = [a.arg for a in [*method.args.posonlyargs, *method.args.args] if a.arg != "self"]
        inner = {p: self.expr(a, env, depth) for p, a in zip(params, call.args)}
        for k in call.keywords:
            if k.arg is not None:
                inner[k.arg] = self.expr(k.value, env, depth)
        return self.body(method.body, inner, depth, set())

    def _assign(self, target: ast.AST, taint: frozenset, env: dict) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = env.get(target.id, frozenset()) | taint
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._assign(elt, taint, env)
        elif isinstance(target, ast.Starred):
            self._assign(target.value, taint, env)

    def _layer_call(self, node: ast.Call, layer_vars: set[str]) -> bool:
        func = node.func
        if isinstance(func, ast.Name) and func.id in layer_vars:
            return True
        # self.<stack>[i](...)
        return (isinstance(func, ast.Subscript) and isinstance(func.value, ast.Attribute)
                and func.value.attr == self.stack and _dotted(func.value.value) == "self")

    def _record(self, stmt: ast.AST, env: dict, depth: int, layer_vars: set[str]) -> None:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and self._layer_call(node, layer_vars):
                args = [(ast.unparse(a), self.expr(a, env, depth)) for a in node.args]
                args += [(f"{k.arg}={ast.unparse(k.value)}", self.expr(k.value, env, depth)) for k in node.keywords]
                self.calls.append((node.lineno, args))

    def body(self, stmts: list, env: dict, depth: int, layer_vars: set[str]) -> frozenset:
        returned = frozenset()
        for stmt in stmts:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(stmt, (ast.For, ast.AsyncFor)):
                over_stack = any(isinstance(n, ast.Attribute) and n.attr == self.stack and _dotted(n.value) == "self"
                                 for n in ast.walk(stmt.iter))
                inner_vars = set(layer_vars)
                if over_stack:
                    inner_vars |= {n.id for n in ast.walk(stmt.target) if isinstance(n, ast.Name)}
                else:
                    self._assign(stmt.target, self.expr(stmt.iter, env, depth), env)
                returned |= self.body(stmt.body, env, depth, inner_vars)
                returned |= self.body(stmt.orelse, env, depth, layer_vars)
                continue
            if isinstance(stmt, (ast.If, ast.While)):
                returned |= self.body(stmt.body, env, depth, layer_vars)
                returned |= self.body(stmt.orelse, env, depth, layer_vars)
                continue
            if isinstance(stmt, (ast.With, ast.AsyncWith)):
                returned |= self.body(stmt.body, env, depth, layer_vars)
                continue
            if isinstance(stmt, ast.Try):
                for part in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                    returned |= self.body(part, env, depth, layer_vars)
                continue
            if depth == 0:
                self._record(stmt, env, depth, layer_vars)
            if isinstance(stmt, ast.Assign):
                taint = self.expr(stmt.value, env, depth)
                for target in stmt.targets:
                    self._assign(target, taint, env)
            elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) and stmt.value is not None:
                self._assign(stmt.target, self.expr(stmt.value, env, depth)
                             | (self.expr(stmt.target, env, depth) if isinstance(stmt, ast.AugAssign)
                                else frozenset()), env)
            elif isinstance(stmt, ast.Return):
                returned |= self.expr(stmt.value, env, depth)
        return returned


def _stack_owners(sources: dict) -> list[tuple[str, ast.ClassDef, str]]:
    """(file, class, stack attribute) of the classes whose __init__ builds the decoder stack (an nn.ModuleList of the
    decoder layer class), those a *ForCausalLM class builds where the source has several stacks."""
    layer = dataflow.layer_class(sources)
    if layer is None:
        return []
    owners = []
    for file, tree in _parsed(sources):
        for cls in (n for n in subtree(tree) if isinstance(n, ast.ClassDef)):
            init = _method(cls, "__init__")
            for node in subtree(init) if init is not None else ():
                if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and isinstance(node.targets[0], ast.Attribute) and isinstance(node.value, ast.Call)
                        and _dotted(node.value.func).rsplit(".", 1)[-1] == "ModuleList" and node.value.args):
                    continue
                built = {_dotted(c.func).rsplit(".", 1)[-1] for c in ast.walk(node.value.args[0])
                         if isinstance(c, ast.Call)}
                if layer[1].name in built:
                    owners.append((file, cls, node.targets[0].attr))
    return owners


def per_layer_inputs(sources: dict, tensors=None) -> LayerInput | None:
    """The second embedding the model hands each decoder layer beside the hidden states, or None. With `tensors`
    (the checkpoint's tensor names), only a table the checkpoint holds (`<...>.<table>.weight`) counts: __init__
    may build it under a config switch (Gemma 4's `if self.hidden_size_per_layer_input:`)."""
    if not sources:
        return None
    kinds = _embedding_classes(sources)
    for file, cls, stack in _stack_owners(sources):
        init, forward = _method(cls, "__init__"), _method(cls, "forward")
        if forward is None:
            continue
        embeddings: dict[str, tuple[str, int]] = {}
        for node in subtree(init):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                    and _dotted(node.targets[0].value) == "self" and isinstance(node.value, ast.Call)
                    and _dotted(node.value.func).rsplit(".", 1)[-1] in kinds):
                embeddings.setdefault(node.targets[0].attr, (_dotted(node.value.func).rsplit(".", 1)[-1], node.lineno))
        if len(embeddings) < 2:
            continue
        taint = _Taint(cls, dict.fromkeys(embeddings, 0), stack, file)
        taint.body(forward.body, {}, 0, set())
        for line, args in taint.calls:
            if not args:
                continue
            hidden = args[0][1]
            if not hidden:
                continue
            for text, carried in args[1:]:
                extra = sorted(t for t in carried - hidden if tensors is None
                               or any(n == f"{t}.weight" or n.endswith(f".{t}.weight") for n in tensors))
                if extra:
                    table = extra[0]
                    return LayerInput(cls.name, table, embeddings[table][0], f"{file}:{embeddings[table][1]}",
                                      min(hidden), f"{file}:{line}", text)
    return None
