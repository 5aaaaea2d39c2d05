"""Norm scales kept under another parameter name than `weight`, read from the code.

A lab's norm class may keep its learned scale as `self.scale = nn.Parameter(...)` (or `gamma`, `g`), so the
checkpoint holds `blocks.0.pre_attn_norm.scale` where transformers' norms hold `.weight`. The detectors read
norms by their `weight` tensor; for such a checkpoint they read a view in which those tensors are named
`weight`, and the spec records the checkpoint's name (norm_weight_name). The port's loader maps it back with
vLLM's WeightsMapper (orig_to_new_suffix, one whole module name and parameter per entry).

A class counts as a norm when its forward normalizes (a mean of squares or a variance under a square root, or
torch's layer_norm / rms_norm) and it learns one scale, optionally beside a `bias`. Only attributes the code
builds from such a class are renamed, never another module's tensor of the same name.
"""

from __future__ import annotations

import ast
from dataclasses import replace

from scaffold.checkpoint import Checkpoint
from scaffold.detect import codekeys, sourcecode
from scaffold.detect.sourcecode import subtree
from scaffold.errors import CheckpointError
from scaffold.spec import Source, Spec


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _parameters(init: ast.FunctionDef) -> list[str]:
    """`self.X = nn.Parameter(...)` of an __init__, in order."""
    return [node.targets[0].attr for node in subtree(init)
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
            and sourcecode._dotted(node.targets[0].value) == "self" and isinstance(node.value, ast.Call)
            and sourcecode._dotted(node.value.func).rsplit(".", 1)[-1] == "Parameter"]


def _normalizes(forward: ast.FunctionDef) -> bool:
    calls = {sourcecode._dotted(n.func).rsplit(".", 1)[-1] for n in subtree(forward) if isinstance(n, ast.Call)}
    return bool(calls & {"layer_norm", "rms_norm"}) or (
        bool(calls & {"rsqrt", "sqrt"}) and bool(calls & {"mean", "var"}))


def scale_parameter(sources: dict[str, str]) -> tuple[str, str, set[str]] | None:
    """(the scale's parameter name, where its class is, the attributes the code builds from such classes), for
    norm classes whose scale is not called `weight`; None when there are none or they disagree on the name."""
    classes = sourcecode._classes(sources)
    found: dict[str, tuple[str, str]] = {}
    for name, (file, cls) in classes.items():
        init, forward = _method(cls, "__init__"), _method(cls, "forward")
        if init is None or forward is None or not _normalizes(forward):
            continue
        scales = [p for p in _parameters(init) if p != "bias"]
        if len(scales) == 1 and scales[0] != "weight":
            found[name] = (scales[0], f"{file}:{cls.lineno}")
    if len({scale for scale, _ in found.values()}) != 1:
        return None
    scale, where = next(iter(found.values()))
    attrs = {attr for _file, _cls, _func, attr, value in codekeys.self_assignments(sources)
             if isinstance(value, ast.Call) and codekeys.callee(value) in found}
    return scale, f"{where}: {next(iter(found))} keeps its scale as self.{scale}", attrs


def view(ckpt: Checkpoint, spec: Spec) -> Checkpoint:
    """`ckpt` with the norms' scales named `weight` (and spec.norm_weight_name set) where the code keeps them
    under another name; `ckpt` itself otherwise."""
    found = scale_parameter(sourcecode.modeling_sources(ckpt))
    if found is None:
        spec.set("norm_weight_name", "weight", Source("default", "the norms keep their scale as `weight`"))
        return ckpt
    scale, detail, attrs = found
    tensors = {}
    for name, info in ckpt.tensors.items():
        module, _, kind = name.rpartition(".")
        if kind == scale and module.rsplit(".", 1)[-1] in attrs:
            if f"{module}.weight" in ckpt.tensors:
                raise CheckpointError(f"tensor {name!r} and {module}.weight both exist; the code keeps the norm's "
                                      f"scale as {scale!r}.", ckpt.config_file)
            name, info = f"{module}.weight", replace(info, name=f"{module}.weight")
        tensors[name] = info
    if tensors.keys() == ckpt.tensors.keys():
        spec.set("norm_weight_name", "weight", Source("default", "the norms keep their scale as `weight`"))
        return ckpt
    spec.set("norm_weight_name", scale, Source("code", detail))
    return replace(ckpt, tensors=tensors)
