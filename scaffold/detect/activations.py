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


# ------------------------------------------------------------ activations with tensors of their own
# Some registry entries build a module that holds learned tensors (vLLM's XIELU: alpha_p, alpha_n as parameters,
# beta, eps as buffers). A checkpoint stores them under the activation module's name; a port loads them into the
# module vLLM's registry builds, which is only right where both sides keep the same tensors under the same names.


def _registry_classes(path: Path, name: str) -> dict[str, str]:
    """Key -> the class name a registry dict builds: `"xielu": lambda: XIELU()` (vLLM), `"xielu":
    XIELUActivation` or `"gelu_10": (ClippedGELUActivation, {...})` (transformers' ACT2CLS)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: dict[str, str] = {}
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if not (isinstance(target, ast.Name) and target.id == name and node.value is not None):
            continue
        value = node.value
        if isinstance(value, ast.Call) and value.args:
            value = value.args[0]
        if not isinstance(value, ast.Dict):
            continue
        for key, item in zip(value.keys, value.values, strict=True):
            if isinstance(item, ast.Lambda):
                item = item.body
            if isinstance(item, ast.Tuple) and item.elts:
                item = item.elts[0]
            if isinstance(item, ast.Call):
                item = item.func
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(item, ast.Name):
                out[key.value] = item.id
    return out


def _flag(call: ast.Call, keyword: str, position: int | None, default: bool) -> bool | None:
    """A boolean argument of a call as written (None: not a constant)."""
    value = next((k.value for k in call.keywords if k.arg == keyword), None)
    if value is None and position is not None and len(call.args) > position:
        value = call.args[position]
    if value is None:
        return default
    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, bool) else None


def class_tensors(tree: ast.Module, class_name: str) -> frozenset[str] | None:
    """The tensors a module class's __init__ gives its state dict: `self.X = nn.Parameter(...)`, `self.X =
    nn.Buffer(...)`, `self.register_buffer("X", ...)` / `register_parameter`, a buffer left out where it says
    persistent=False; None where the class is not in `tree` or a persistence is not written as a constant."""
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None) if cls else None
    if init is None:
        return None
    out = set()
    for node in ast.walk(init):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and isinstance(node.targets[0].value, ast.Name) and node.targets[0].value.id == "self"
                and isinstance(node.value, ast.Call)):
            callee = ast.unparse(node.value.func).rsplit(".", 1)[-1]
            if callee == "Parameter":
                out.add(node.targets[0].attr)
            elif callee == "Buffer":
                persistent = _flag(node.value, "persistent", 1, True)
                if persistent is None:
                    return None
                if persistent:
                    out.add(node.targets[0].attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("register_buffer", "register_parameter") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            persistent = _flag(node, "persistent", 2, True) if node.func.attr == "register_buffer" else True
            if persistent is None:
                return None
            if persistent:
                out.add(node.args[0].value)
    return frozenset(out)


def _same_code(func: ast.FunctionDef) -> str:
    """A method as code to compare: its body without a docstring, its arguments renamed by position."""
    names = {a.arg: f"_arg{i}" for i, a in enumerate(func.args.args)}
    body = func.body[1:] if (func.body and isinstance(func.body[0], ast.Expr)
                             and isinstance(func.body[0].value, ast.Constant)) else func.body
    text = ast.dump(ast.Module(body=body, type_ignores=[]), annotate_fields=False)
    for old, new in names.items():
        text = text.replace(f"Name('{old}',", f"Name('{new}',")
    return text


def reading_methods(tree: ast.Module, class_name: str, tensors: frozenset[str]) -> set[str]:
    """The methods of a class that read every one of `tensors` (self.X), as code to compare (_same_code)."""
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    out = set()
    for func in (n for n in cls.body if isinstance(n, ast.FunctionDef)) if cls else ():
        read = {n.attr for n in ast.walk(func) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                and n.value.id == "self"}
        if func.name != "__init__" and tensors <= read:
            out.add(_same_code(func))
    return out


@dataclass(frozen=True)
class TensorActivation:
    """What both sides build for one activation name: the class names and the tensors of each, and whether a
    method computing with all the tensors is the same code in both classes (then a stored tensor means the same
    to both: vLLM's XIELU and transformers' XIELUActivation share _xielu_python, softplus of the stored alpha_p)."""

    name: str
    vllm_class: str | None
    vllm_tensors: frozenset[str] | None
    transformers_class: str | None
    transformers_tensors: frozenset[str] | None
    same_formula: bool = False


@lru_cache(maxsize=None)
def tensor_activation(name: str) -> TensorActivation:
    """The classes vLLM's get_act_fn and transformers' ACT2CLS build for `name` and the tensors each holds
    (None where a side does not know the name or its class could not be read)."""
    vllm_path = _package_file("vllm", "model_executor", "layers", "activation.py")
    hf_path = _package_file("transformers", "activations.py")
    vcls = _registry_classes(vllm_path, "_ACTIVATION_REGISTRY").get(name) if vllm_path else None
    hcls = _registry_classes(hf_path, "ACT2CLS").get(name) if hf_path else None
    vtree = ast.parse(vllm_path.read_text(encoding="utf-8")) if vcls else None
    htree = ast.parse(hf_path.read_text(encoding="utf-8")) if hcls else None
    vt = class_tensors(vtree, vcls) if vcls else None
    ht = class_tensors(htree, hcls) if hcls else None
    same = bool(vt and vt == ht and reading_methods(vtree, vcls, vt) & reading_methods(htree, hcls, ht))
    return TensorActivation(name, vcls, vt, hcls, ht, same)


def vllm_activation_call(name: str) -> str | None:
    """How vLLM's registry builds `name`, as written (`XIELU()`): a port builds its own instance that way, one
    per layer. get_act_fn would not do: its registry (a LazyDict) builds each name once and hands every caller
    that one module, so every layer would share one set of tensors (vLLM's own Apertus builds XIELU() itself)."""
    path = _package_file("vllm", "model_executor", "layers", "activation.py")
    if path is None:
        return None
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if not (isinstance(target, ast.Name) and target.id == "_ACTIVATION_REGISTRY" and node.value is not None):
            continue
        value = node.value.args[0] if isinstance(node.value, ast.Call) and node.value.args else node.value
        for key, item in zip(getattr(value, "keys", []), getattr(value, "values", []), strict=True):
            if (isinstance(key, ast.Constant) and key.value == name and isinstance(item, ast.Lambda)
                    and isinstance(item.body, ast.Call) and isinstance(item.body.func, ast.Name)):
                return ast.unparse(item.body)
    return None


@lru_cache(maxsize=1)
def transformers_activation_classes() -> dict[str, str]:
    """transformers' activation classes by class name -> their ACT2CLS key (the first key naming it)."""
    path = _package_file("transformers", "activations.py")
    out: dict[str, str] = {}
    for key, cls in (_registry_classes(path, "ACT2CLS") if path else {}).items():
        out.setdefault(cls, key)
    return out
