"""A causal-LM class whose model is built by code the checkpoint does not hold (OLMo v1's hf_olmo: `self.model =
OLMo(...)`, `from olmo.model import OLMo`, the `olmo` package installed beside it). The detectors read what a model
computes from the checkpoint's Python files, else transformers' own; here neither holds it, so the fields they would
read stay unknown. `outside_code` names the class, the construction and the import, for the refusal."""

from __future__ import annotations

import ast
import sys

from scaffold.checkpoint import Checkpoint
from scaffold.detect.sourcecode import parse

# Libraries whose modules a modeling file builds from that are layers, not the model: their code is not the model's.
LIBRARIES = frozenset({"torch", "transformers", "einops", "flash_attn", "xformers", "numpy", "triton", "accelerate",
                       "safetensors", "apex", "bitsandbytes", "peft"})


def _imported(tree: ast.Module) -> dict[str, tuple[str, int]]:
    """Names a module imports absolutely -> (the module they come from, line)."""
    names: dict[str, tuple[str, int]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = (node.module, node.lineno)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (alias.name, node.lineno)
    return names


def _outside(module: str, ckpt: Checkpoint) -> bool:
    top = module.split(".")[0]
    own = {name.split("/")[0].removesuffix(".py") for name in ckpt.sources}
    return top not in LIBRARIES and top not in sys.stdlib_module_names and top not in own


def outside_code(ckpt: Checkpoint) -> str | None:
    """Where the checkpoint's causal-LM class (config.json's architectures) builds a module from a package outside
    the checkpoint and the libraries of layers, in its __init__: the class, the line and the import, in a clause."""
    archs = ckpt.config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    for file, text in ckpt.sources.items():
        tree = parse(text)
        if tree is None or arch is None:
            continue
        imported = _imported(tree)
        for cls in tree.body:
            if not (isinstance(cls, ast.ClassDef) and cls.name == arch):
                continue
            for fn in cls.body:
                if not (isinstance(fn, ast.FunctionDef) and fn.name == "__init__"):
                    continue
                for node in ast.walk(fn):
                    if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
                        continue
                    target = node.targets[0]
                    func = node.value.func
                    name = func.id if isinstance(func, ast.Name) else (
                        func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None)
                    if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                            and target.value.id == "self" and name in imported):
                        continue
                    module, line = imported[name]
                    if _outside(module, ckpt):
                        return (f"{arch}.__init__ builds self.{target.attr} = {ast.unparse(func)}(...) ({file}:"
                                f"{node.lineno}), and {name} comes from the package {module.split('.')[0]} "
                                f"({file}:{line}: {ast.get_source_segment(text, tree.body[_index(tree, line)])}), "
                                "code the checkpoint does not hold")
    return None


def _index(tree: ast.Module, line: int) -> int:
    return next(i for i, node in enumerate(tree.body) if node.lineno == line)
