"""The activations a port can use: the names in the installed vLLM's activation registries.

vLLM's `get_act_fn` and `get_act_and_mul_fn` look names up in two registries
(`_ACTIVATION_REGISTRY`, `_ACTIVATION_AND_MUL_REGISTRY` in
vllm/model_executor/layers/activation.py). Their keys are read from that file's syntax tree, so
the list follows the installed vLLM and importing vLLM (seconds) is not needed to port a model.
transformers' own names (`ACT2CLS` in transformers/activations.py) are read the same way: a name
both sides know computes the same function on both (vLLM's models pass `config.hidden_act` to
these lookups as they are).
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class Registry:
    plain: frozenset[str]  # get_act_fn
    and_mul: frozenset[str]  # get_act_and_mul_fn: activation of the first half times the second half
    file: str  # where they were read, for messages


def _package_file(package: str, *parts: str) -> Path | None:
    """A file inside an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)), *parts)
    return path if path.is_file() else None


def _dict_keys(path: Path, name: str) -> frozenset[str]:
    """The string keys of the dict literal assigned to module-level `name` (possibly wrapped in a call)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if not (isinstance(target, ast.Name) and target.id == name and node.value is not None):
            continue
        value = node.value
        if isinstance(value, ast.Call) and value.args:  # LazyDict({...})
            value = value.args[0]
        if isinstance(value, ast.Dict):
            return frozenset(k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return frozenset()


@lru_cache(maxsize=1)
def vllm_registry() -> Registry | None:
    """The installed vLLM's activation names; None when vLLM is not installed here."""
    path = _package_file("vllm", "model_executor", "layers", "activation.py")
    if path is None:
        return None
    return Registry(_dict_keys(path, "_ACTIVATION_REGISTRY"), _dict_keys(path, "_ACTIVATION_AND_MUL_REGISTRY"),
                    str(path))


@lru_cache(maxsize=1)
def transformers_activations() -> frozenset[str] | None:
    """The names transformers' ACT2FN knows; None when transformers is not installed here."""
    path = _package_file("transformers", "activations.py")
    return None if path is None else _dict_keys(path, "ACT2CLS")


def gated_forms(name: str) -> tuple[str, ...]:
    """How a port can compute act(gate) * up with `name`: "and_mul" (vLLM's fused kernel), "plain"
    (get_act_fn on the gate half, then the multiply), best first; empty when vLLM has neither."""
    registry = vllm_registry()
    if registry is None:
        return ()
    return tuple(form for form, names in (("and_mul", registry.and_mul), ("plain", registry.plain))
                 if name.lower() in names)
