"""Static reading of the checkpoint's own modeling source (never imported or run)."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.checkpoint import Checkpoint


@dataclass(frozen=True)
class Found:
    value: object
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


def _trees(ckpt: Checkpoint):
    for name, text in ckpt.sources.items():
        try:
            yield name, ast.parse(text)
        except SyntaxError:
            continue


def _module_constants(tree: ast.Module) -> dict[str, object]:
    """Module-level NAME = <literal> assignments."""
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is None:
                continue
            for target in targets:
                if isinstance(target, ast.Name):
                    try:
                        out[target.id] = ast.literal_eval(node.value)
                    except ValueError:
                        pass
    return out


def config_default(ckpt: Checkpoint, key: str) -> Found | None:
    """A literal default the code uses for a config key: getattr(config, "key", VALUE).

    VALUE may be a literal or a module-level constant holding one.
    """
    for name, tree in _trees(ckpt):
        constants = _module_constants(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) == 3
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value == key
            ):
                default = node.args[2]
                if isinstance(default, ast.Name) and default.id in constants:
                    return Found(constants[default.id], name, node.lineno)
                try:
                    return Found(ast.literal_eval(default), name, node.lineno)
                except ValueError:
                    continue
    return None


def added_to_call(ckpt: Checkpoint, callee: str, attribute: str) -> Found | None:
    """Where the code adds `self.<attribute>` to the result of `self.<callee>(...)`."""
    for name, tree in _trees(ckpt):
        for node in ast.walk(tree):
            if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)):
                continue
            sides = (node.left, node.right)
            calls = [s for s in sides if isinstance(s, ast.Call) and isinstance(s.func, ast.Attribute)
                     and s.func.attr == callee]
            attrs = [s for s in sides if isinstance(s, ast.Attribute) and s.attr == attribute]
            if calls and attrs:
                return Found(attribute, name, node.lineno)
    return None
