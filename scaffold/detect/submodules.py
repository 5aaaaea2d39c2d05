"""Modules inside a sublayer besides its projections, read from what the sublayer's forward computes.

- An activation module holding tensors of its own (Apertus' xIELU: `self.act_fn = ACT2CLS["xielu"](...)`, with
  alpha_p, alpha_n, beta, eps in the checkpoint): the MLP's forward applies it to a projection's output, its
  __init__ builds it from transformers' activation table (ACT2FN[...], ACT2CLS[...], get_activation(...), or one
  of the table's classes by name), and vLLM's registry builds a class for the same name that holds the same
  tensors and computes with them in the same code. The port then builds vLLM's activation and loads the tensors
  under the checkpoint's names. A module the code defines itself is not matched: refused with where it is.

Nothing here runs the code: the forward is interpreted by scaffold.detect.dataflow.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect import dataflow
from scaffold.detect.activations import tensor_activation, transformers_activation_classes, vllm_registry
from scaffold.detect.sourcecode import _dotted, subtree

ACTIVATION_TABLES = ("ACT2FN", "ACT2CLS")


@dataclass(frozen=True)
class ActivationModule:
    attr: str  # the MLP's attribute (the checkpoint's module name)
    name: str  # the activation's registry name, both sides'
    tensors: tuple[str, ...]
    evidence: str  # FILE:LINE: ...


class Unmatched(Exception):
    """A module with tensors that the sublayer applies and the generator cannot match; the message says why."""


def _init_values(cls: ast.ClassDef, attr: str) -> list[ast.expr]:
    """Every value __init__ assigns to self.<attr>, in every branch."""
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    return [n.value for n in (subtree(init) if init else ())
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Attribute)
            and _dotted(n.targets[0].value) == "self" and n.targets[0].attr == attr]


def _key(node: ast.expr, config: dict) -> str | None:
    """A string constant, or a config key config.json holds as a string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    dotted = _dotted(node)
    if dotted.startswith(("config.", "self.config.")) and dotted.count(".") == (1 if dotted[0] == "c" else 2):
        value = config.get(dotted.rsplit(".", 1)[-1])
        return value if isinstance(value, str) else None
    return None


def table_activation(value: ast.expr, config: dict, defined: set[str]) -> str | None:
    """The name of transformers' activation table a `self.X = ...` value builds: ACT2FN[K], ACT2CLS[K](...),
    get_activation(K), or a class of the table by its name (XIELUActivation(...)) that the code does not define
    itself; None otherwise."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Subscript):
        value = value.func  # ACT2CLS[K](...)
    if isinstance(value, ast.Subscript) and _dotted(value.value).rsplit(".", 1)[-1] in ACTIVATION_TABLES:
        return _key(value.slice, config)
    if isinstance(value, ast.Call):
        callee = _dotted(value.func).rsplit(".", 1)[-1]
        if callee == "get_activation" and len(value.args) == 1:
            return _key(value.args[0], config)
        if callee not in defined:
            return transformers_activation_classes().get(callee)
    return None


def applied_modules(sources: dict, file: str, cls: ast.ClassDef, producers: set, config: dict) -> dict:
    """attr -> (line, the producers its input derives from) for every self.X(...) the forward applies to a
    value derived from the producers (X not one of them)."""
    interp = dataflow.Interpreter(sources, file, cls, set(producers), config)
    interp.run_method("forward", [frozenset()])
    out: dict[str, tuple[int, set]] = {}
    for attr, line, origins in interp.events.modules:
        if attr not in producers and origins:
            out.setdefault(attr, (line, {o.src for o in origins}))
    return out


def activation_module(sources: dict, config: dict, flow: dataflow.Mlp, mlp: str, tensors: dict) -> \
        ActivationModule | None:
    """The MLP's activation module where it holds tensors (`tensors`: the layer's tensor names relative to the
    layer); None where no module the MLP applies as its activation holds any. Raises Unmatched."""
    held: dict[str, list[str]] = {}
    for rest in tensors:
        parts = rest.split(".")
        if len(parts) == 3 and parts[0] == mlp and parts[1] not in flow.linears:
            held.setdefault(parts[1], []).append(parts[2])
    if not held:
        return None
    found = dataflow._class(sources, flow.cls)
    if found is None:
        return None
    file, cls = found
    defined = set(dataflow._classes(sources))
    projections = set(flow.linears) - {flow.down}
    applied = applied_modules(sources, file, cls, set(flow.linears), config)
    out = None
    for attr, leaves in sorted(held.items()):
        if attr not in applied or not applied[attr][1] <= projections:
            continue  # not applied to a projection's output: not the activation
        line = applied[attr][0]
        values = _init_values(cls, attr)
        callees = {_dotted(v.func).rsplit(".", 1)[-1] for v in values if isinstance(v, ast.Call)}
        if any("Norm" in c for c in callees):
            continue  # a norm inside the MLP (BitNet's ffn_sub_norm): not an activation
        where = f"{file}:{line}: {flow.cls} applies self.{attr}"
        names = {table_activation(v, config, defined) for v in values}
        if None in names or len(names) != 1:
            built = ", ".join(sorted(ast.unparse(v) for v in values))[:120]
            raise Unmatched(f"{where} ({built}), a module holding tensors of its own ({', '.join(sorted(leaves))}) "
                            "that is not built from transformers' activation table by one name, so the generator "
                            "cannot match it to an activation of vLLM's")
        name = names.pop()
        both = tensor_activation(name)
        registry = vllm_registry()
        if registry is None or name not in registry.plain or both.vllm_tensors is None:
            raise Unmatched(f"{where}, transformers' {name!r} activation holding tensors "
                            f"({', '.join(sorted(leaves))}), which vLLM's registry does not build as a module with "
                            "tensors")
        if not (both.vllm_tensors == both.transformers_tensors == set(leaves) and both.same_formula):
            raise Unmatched(f"{where}, transformers' {name!r} activation ({both.transformers_class}, tensors "
                            f"{', '.join(sorted(leaves))} in the checkpoint); vLLM's {both.vllm_class} holds "
                            f"{', '.join(sorted(both.vllm_tensors))}"
                            + ("" if both.same_formula else " and does not compute with them in the same code"))
        if out is not None:
            raise Unmatched(f"{where}: a second activation module with tensors (self.{out.attr} is one)")
        out = ActivationModule(attr, name, tuple(sorted(leaves)),
                               f"{where}, built from transformers' {name!r} ({both.transformers_class}); vLLM's "
                               f"{both.vllm_class} holds the same tensors and computes with them in the same code")
    return out
