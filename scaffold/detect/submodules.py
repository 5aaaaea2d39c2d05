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
from scaffold.spec import Source, Spec

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


# ------------------------------------------------------------ norms inside a sublayer
# BitNet normalizes the attention output before o_proj (attn_sub_norm) and the MLP's act(gate) * up before
# down_proj (ffn_sub_norm). Read from the dataflow: with the module counted as a producer, the output projection
# reads that module's output and nothing else, and the module reads the sublayer's other projections only.


@dataclass(frozen=True)
class SubNorm:
    attr: str
    cls: str  # the class __init__ builds it from
    arguments: tuple[str, ...]  # its constructor's arguments after the width, as written
    evidence: str  # FILE:LINE: ...


def constructor(cls: ast.ClassDef, attr: str) -> tuple[str, tuple[str, ...]] | None:
    """(class, arguments after the first, as written) of the one `self.<attr> = Cls(...)` of __init__."""
    values = _init_values(cls, attr)
    if len(values) != 1 or not isinstance(values[0], ast.Call):
        return None
    call = values[0]
    rest = [ast.unparse(a) for a in call.args[1:]] + [ast.unparse(k) for k in call.keywords]
    return _dotted(call.func).rsplit(".", 1)[-1], tuple(sorted(rest))


def norm_before(sources: dict, config: dict, cls_name: str, linears: set, target: str, candidates: set,
                must_read: str, activated: bool) -> list[SubNorm]:
    """The modules of `candidates` the class's forward applies to its projections' outputs (those of `linears`
    other than `target`, `must_read`'s among them, an activated one where `activated`: the MLP's act(gate) * up)
    and whose output, alone and not activated after it, `target` reads."""
    found = dataflow._class(sources, cls_name)
    if found is None:
        return []
    file, cls = found
    out = []
    for attr in sorted(candidates - linears):
        calls = [n for n in subtree(cls) if isinstance(n, ast.Call) and _dotted(n.func) == f"self.{attr}"]
        if any(len(c.args) + len(c.keywords) != 1 for c in calls):
            continue  # a norm takes the one tensor (ChatGLM2's core_attention takes q, k, v and the mask)
        if (constructor(cls, attr) or ("",))[0] in dataflow.SEQUENTIAL_SKIPPED:
            continue  # dropout (ModernBERT-decoder's MLP: Wo(drop(act(input) * gate))): the identity at inference
        interp = dataflow.Interpreter(sources, file, cls, linears | {attr}, config)
        interp.run_method("forward", [frozenset()])
        reads_target = [origins for _, origins in interp.events.inputs.get(target, [])]
        reads_norm = [origins for _, origins in interp.events.inputs.get(attr, [])]
        into_target = [{o.src for o in origins} for origins in reads_target]
        into_norm = [{o.src for o in origins} for origins in reads_norm]
        if (len(into_norm) == 1 and must_read in into_norm[0] and into_norm[0] <= linears - {target}
                and (not activated or any(o.act for o in reads_norm[0]))
                and into_target and all(srcs == {attr} for srcs in into_target)
                and not any(o.act or o.piece is not None for origins in reads_target for o in origins)):
            built = constructor(cls, attr)
            if built is None:
                continue
            line = interp.events.inputs[attr][0][0]
            out.append(SubNorm(attr, built[0], built[1],
                               f"{file}:{line}: {cls_name} applies self.{attr} to what "
                               f"{', '.join(sorted(into_norm[0]))} computed, and {target} reads its output alone"))
    return out


def sub_norms(spec: Spec, names: dict, flow: dataflow.Layer | None, sources: dict, config: dict, layer0: dict,
              attn: str, mlp: str | None) -> set[str]:
    """Set names.attn_sub_norm / names.mlp_sub_norm (and the fields) for the norms the attention applies before
    its output projection and the MLP before its down projection (`mlp` None: no dense MLP read from the code);
    the modules they claim in the layer. Raises Unmatched for such a module the port cannot build as the layer's
    other norms are built."""
    if flow is None:
        return set()
    layer = dataflow._class(sources, flow.cls)
    norm_builds = {constructor(layer[1], a) for a in flow.norms.values()} - {None} if layer else set()
    found = []
    if flow.attention_flow is not None:
        a = flow.attention_flow
        for sub in norm_before(sources, config, a.cls, set(a.linears), a.o, _module_attrs(sources, a.cls), a.v,
                               False):
            found.append(("attn_sub_norm", attn, sub, spec.num_heads * spec.head_dim, "every head's output"))
    if flow.mlp_flow is not None and mlp is not None:
        m = flow.mlp_flow
        for sub in norm_before(sources, config, m.cls, set(m.linears), m.down, _module_attrs(sources, m.cls), m.up,
                               True):
            found.append(("mlp_sub_norm", mlp, sub, spec.intermediate_size, "the activated width"))
    claimed = set()
    for role, module, sub, width, what in found:
        if role in names:
            raise Unmatched(f"{sub.evidence}: a second such module (self.{names[role]} is one)")
        if role == "attn_sub_norm" and spec.qkv_layout == "latent":
            raise Unmatched(f"{sub.evidence}: a norm over the output of latent attention")
        if (sub.cls, sub.arguments) not in norm_builds:
            built = ", ".join(_written(c, args) for c, args in sorted(norm_builds)) or "none read"
            raise Unmatched(f"{sub.evidence}; it is built as {_written(sub.cls, sub.arguments)}, not as the layer's "
                            f"norms are ({built}), so the port would not know what it computes")
        held = sorted(r.rsplit(".", 1)[-1] for r in layer0 if r.startswith(f"{module}.{sub.attr}."))
        wanted = [] if spec.norm_weightless else ["bias", "weight"] if spec.norm_bias else ["weight"]
        shape = layer0.get(f"{module}.{sub.attr}.weight")
        if held != wanted or (shape is not None and tuple(shape.shape) != (width,)):
            shapes = {r: list(layer0[r].shape) for r in layer0 if r.startswith(f"{module}.{sub.attr}.")}
            raise Unmatched(f"{sub.evidence}; the layer's norms hold {', '.join(wanted) or 'no tensors'}, and a norm "
                            f"over {what} one of {width}, but layer 0 holds {shapes or 'none'}")
        names[role] = sub.attr
        spec.set(role, True, Source("code", f"{sub.evidence}: a {sub.cls} over {what} ({width})"))
        claimed.add(f"{module}.{sub.attr}")
    return claimed


def _written(cls: str, arguments: tuple[str, ...]) -> str:
    return f"{cls}({', '.join(('...', *arguments))})"


def _module_attrs(sources: dict, cls_name: str) -> set[str]:
    """The attributes the class's __init__ assigns a call to (modules, possibly)."""
    found = dataflow._class(sources, cls_name)
    init = next((n for n in found[1].body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None) \
        if found else None
    return {n.targets[0].attr for n in (subtree(init) if init else ())
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Attribute)
            and _dotted(n.targets[0].value) == "self" and isinstance(n.value, ast.Call)}
