"""Can vLLM's transformers modeling backend serve this checkpoint? Read from the source, never run.

The backend (`vllm/model_executor/models/transformers/`) builds the model from its
transformers code and swaps vLLM's attention in through the attention interface.
That works only when the code follows the upstream rules:

- `_supports_attention_backend = True` on the pre-trained model class
  (vLLM's registry checks `is_backend_compatible()`);
- attention is called through `ALL_ATTENTION_FUNCTIONS` (exactly one interface call
  in the attention module's forward: vLLM's AttentionFuser looks for it);
- `**kwargs` are passed down from the base model to that attention call, through
  every module on the way (vLLM hands its attention metadata down that way);
- for MoE, an `experts` module that is an `nn.ModuleList` or holds 3D parameters,
  with a forward taking `hidden_states, top_k_index, top_k_weights`;
- for remote code, `auto_map` names an `AutoModel` (the backend builds the base
  model with `AutoModel.from_config`).

This module checks each rule with `ast` on the checkpoint's own modeling files
(remote code) or on transformers' `models/<type>/modeling_<type>.py`, located with
`importlib.util.find_spec` and never imported. It also predicts the `Fused:` lines
the backend's fusers should log (see `expected_fusions`), per module class.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

from scaffold.checkpoint import Checkpoint
from scaffold.detect.identity import transformers_model_types, transformers_module_name
from scaffold.text import markdown_text

MOE_EXPERTS_ARGS = ("hidden_states", "top_k_index", "top_k_weights")
TENSOR_FACTORIES = {"empty", "zeros", "ones", "randn", "rand", "full"}
LINEAR_NAMES = {"Linear"}
MODULE_LIST_NAMES = {"ModuleList"}


# ------------------------------------------------------------------ results
@dataclass(frozen=True)
class Rule:
    """One rule, met (True), broken (False) or not applicable (None), with where it was decided."""

    rule: str
    ok: bool | None
    detail: str
    file: str | None = None
    line: int | None = None

    @property
    def where(self) -> str:
        if self.file is None:
            return ""
        return f"{self.file}:{self.line}" if self.line else self.file

    @property
    def status(self) -> str:
        return "n/a" if self.ok is None else "met" if self.ok else "BROKEN"

    def to_json(self) -> dict:
        return {"rule": self.rule, "status": self.status, "detail": self.detail, "file": self.file,
                "line": self.line}


@dataclass(frozen=True)
class ExpectedFusion:
    """A `Fused:` line the backend should log: once per (module class, attribute)."""

    kind: str  # qkv | gate_up | rms_norm | moe
    module_class: str  # the class the log line names
    attr: str  # attribute name under the parent (the log's `name`); "" for MoE
    parent_class: str
    instances: int  # how many modules of the model the one line covers
    group: str = ""  # "": required; else "Parent.attr", a config-dependent choice of which at least one fires
    file: str = ""
    line: int = 0
    experts_class: str = ""  # MoE: with external routing vLLM names the experts class instead of the block

    @property
    def conditional(self) -> bool:
        return bool(self.group)

    @property
    def signature(self) -> str:
        """A regular expression matching the log line (after `Fused: `)."""
        cls = re.escape(self.module_class)
        if self.kind == "qkv":
            return rf"\({re.escape(self.attr)}: {cls}\) -> qkv_proj"
        if self.kind == "gate_up":
            return rf"\({re.escape(self.attr)}: {cls}\) -> gate_up_proj"
        if self.kind == "rms_norm":
            return rf"^{re.escape(self.attr)} \({cls}\) -> (Gemma)?RMSNorm"
        names = "|".join(re.escape(c) for c in (self.module_class, self.experts_class) if c)
        return rf"\(({names})\) -> MoERunner"

    def to_json(self) -> dict:
        return {"kind": self.kind, "module_class": self.module_class, "attr": self.attr,
                "parent_class": self.parent_class, "instances": self.instances, "group": self.group,
                "signature": self.signature, "where": f"{self.file}:{self.line}",
                "experts_class": self.experts_class}


@dataclass
class Compliance:
    origin: str  # "remote code" or "transformers"
    files: list[str]
    rules: list[Rule] = field(default_factory=list)
    expected: list[ExpectedFusion] = field(default_factory=list)
    model_class: str | None = None
    attention_class: str | None = None

    @property
    def compliant(self) -> bool:
        return bool(self.rules) and all(r.ok is not False for r in self.rules)

    @property
    def broken(self) -> list[Rule]:
        return [r for r in self.rules if r.ok is False]

    def blockers(self) -> list[str]:
        return [f"{r.rule} ({r.where}): {r.detail}" if r.where else f"{r.rule}: {r.detail}" for r in self.broken]

    def to_json(self) -> dict:
        return {"origin": self.origin, "files": self.files, "compliant": self.compliant,
                "model_class": self.model_class, "attention_class": self.attention_class,
                "rules": [r.to_json() for r in self.rules], "expected_fusions": [e.to_json() for e in self.expected]}


# ------------------------------------------------------------------ sources
def transformers_modeling_file(model_type: str) -> Path | None:
    """transformers' own `models/<type>/modeling_<type>.py`, found without importing transformers."""
    found = importlib.util.find_spec("transformers")
    if found is None or not found.submodule_search_locations:
        return None
    root = Path(next(iter(found.submodule_search_locations))) / "models"
    # The folder may be named for another type (gemma4_text and gemma4_unified_text live in gemma4).
    for name in dict.fromkeys((model_type.replace("-", "_"), transformers_module_name(model_type))):
        path = root / name / f"modeling_{name}.py"
        if path.exists():
            return path
    return None


@dataclass
class _Class:
    name: str
    node: ast.ClassDef
    file: str
    bases: list[str]


class _Index:
    """Every class of the modeling source, by name, with the file it is in."""

    def __init__(self) -> None:
        self.classes: dict[str, _Class] = {}
        self.files: list[str] = []

    def add(self, name: str, text: str) -> ast.Module | None:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return None
        self.files.append(name)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                self.classes.setdefault(node.name, _Class(node.name, node, name, [_name(b) for b in node.bases]))
        return tree

    def mro(self, name: str) -> list[_Class]:
        out, todo, seen = [], [name], set()
        while todo:
            n = todo.pop(0)
            if n in seen or n not in self.classes:
                continue
            seen.add(n)
            c = self.classes[n]
            out.append(c)
            todo.extend(c.bases)
        return out

    def external_bases(self, name: str) -> set[str]:
        return {b for c in self.mro(name) for b in c.bases if b not in self.classes}

    def method(self, cls: str, method: str) -> tuple[_Class, ast.FunctionDef] | None:
        for c in self.mro(cls):
            for node in c.node.body:
                if isinstance(node, ast.FunctionDef) and node.name == method:
                    return c, node
        return None

    def class_attr(self, cls: str, attr: str) -> tuple[_Class, ast.stmt, object] | None:
        for c in self.mro(cls):
            for node in c.node.body:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                    if isinstance(node, ast.AnnAssign) and node.value is not None else []
                for t in targets:
                    if isinstance(t, ast.Name) and t.id == attr:
                        try:
                            return c, node, ast.literal_eval(node.value)
                        except ValueError:
                            return c, node, None
        return None

    def children(self, cls: str) -> dict[str, _Child]:
        """`self.<attr> = <Class>(...)` in __init__ (through the MRO), by attribute."""
        out: dict[str, _Child] = {}
        for c in reversed(self.mro(cls)):
            init = next((n for n in c.node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            if init is None:
                continue
            for node in ast.walk(init):
                if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if not (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"):
                        continue
                    child = _child_of(node.value, c.file, node.lineno, self)
                    if child is None:
                        continue
                    prev = out.get(t.attr)
                    if prev is not None and prev.file == child.file and prev.line != child.line:
                        child.classes = sorted(set(prev.classes) | set(child.classes))
                        child.conditional = True
                    out[t.attr] = child
        return out


@dataclass
class _Child:
    classes: list[str]  # class names it may be built from (several: conditional)
    listed: bool  # inside an nn.ModuleList (one per layer)
    module_list: bool  # the attribute itself is an nn.ModuleList
    linear: bool  # an nn.Linear
    parameter_dims: int | None  # an nn.Parameter of a tensor with this many dims
    file: str
    line: int
    conditional: bool = False


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _name(node.value)
    if isinstance(node, ast.Call):
        return _name(node.func)
    return ""


def _child_of(value: ast.expr, file: str, line: int, index: _Index) -> _Child | None:
    if isinstance(value, ast.IfExp):
        a = _child_of(value.body, file, line, index)
        b = _child_of(value.orelse, file, line, index)
        if a and b:
            a.classes = sorted(set(a.classes) | set(b.classes))
            a.conditional = True
            return a
        return a or b
    if not isinstance(value, ast.Call):
        return None
    func = _name(value.func)
    if func in MODULE_LIST_NAMES:
        inner = [n for n in ast.walk(value) if isinstance(n, ast.Call) and n is not value]
        classes = sorted({_name(n.func) for n in inner if _name(n.func) in index.classes})
        return _Child(classes, True, True, False, None, file, line)
    if func in LINEAR_NAMES:
        return _Child([], False, False, True, None, file, line)
    if func == "Parameter" and value.args:
        arg = value.args[0]
        dims = None
        if isinstance(arg, ast.Call) and _name(arg.func) in TENSOR_FACTORIES:
            dims = len([a for a in arg.args if not isinstance(a, ast.Starred)])
        return _Child([], False, False, False, dims, file, line)
    if func in index.classes:
        return _Child([func], False, False, False, None, file, line)
    return None


def _self_calls(func: ast.FunctionDef) -> dict[str, list[ast.Call]]:
    """Calls `self.<attr>(...)`, and calls of loop variables over `self.<attr>` (ModuleLists), by attr."""
    out: dict[str, list[ast.Call]] = {}
    loop_vars: dict[str, str] = {}
    for node in ast.walk(func):
        if not isinstance(node, ast.For):
            continue
        it = node.iter
        while isinstance(it, (ast.Subscript, ast.Call)):  # self.layers[:n], enumerate(self.layers), zip(...)
            it = it.value if isinstance(it, ast.Subscript) else (it.args[0] if it.args else it.func)
        if isinstance(it, ast.Attribute) and _is_self(it.value):
            targets = node.target.elts if isinstance(node.target, ast.Tuple) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    loop_vars[t.id] = it.attr
    for node in ast.walk(func):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
            out.setdefault(f.attr, []).append(node)
        elif isinstance(f, ast.Subscript) and isinstance(f.value, ast.Attribute) and _is_self(f.value.value):
            out.setdefault(f.value.attr, []).append(node)
        elif isinstance(f, ast.Name) and f.id in loop_vars:
            out.setdefault(loop_vars[f.id], []).append(node)
    return out


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _var_kwarg(func: ast.FunctionDef) -> str | None:
    return func.args.kwarg.arg if func.args.kwarg else None


def _passes(call: ast.Call, kwarg: str | None) -> bool:
    return kwarg is not None and any(
        k.arg is None and isinstance(k.value, ast.Name) and k.value.id == kwarg for k in call.keywords
    )


def _is_interface_lookup(node: ast.expr | None) -> bool:
    """`ALL_ATTENTION_FUNCTIONS[...]` or `ALL_ATTENTION_FUNCTIONS.<method>(...)`, as vLLM's AttentionFuser reads."""
    if isinstance(node, ast.Call):
        node = node.func
    if not isinstance(node, (ast.Attribute, ast.Subscript)):
        return False
    return isinstance(node.value, ast.Name) and node.value.id == "ALL_ATTENTION_FUNCTIONS"


def interface_call(func: ast.FunctionDef) -> ast.Call | None:
    """The attention-interface call in a forward, if it makes exactly one (vLLM's rule)."""
    names: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and _is_interface_lookup(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    calls = [n for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id in names]
    direct = [n for n in ast.walk(func) if isinstance(n, ast.Call) and _is_interface_lookup(n.func)
              and isinstance(n.func, ast.Subscript)]
    calls += direct
    return calls[0] if len(calls) == 1 else None


# ------------------------------------------------------------------ analysis
def _load(ckpt: Checkpoint) -> tuple[str, _Index, str | None, str | None] | None:
    """(origin, index, model class, causal-LM class) or None when no source can be found."""
    index = _Index()
    config = ckpt.config
    model_type = config.get("model_type")
    archs = config.get("architectures") or []
    arch = archs[0] if archs and isinstance(archs[0], str) else None
    auto_map = config.get("auto_map") if isinstance(config.get("auto_map"), dict) else {}
    if ckpt.sources and (auto_map or model_type not in transformers_model_types()):
        for name, text in ckpt.sources.items():
            index.add(name, text)

        def mapped(key: str) -> str | None:
            ref = auto_map.get(key)
            ref = ref[0] if isinstance(ref, list) and ref else ref
            return ref.rsplit(".", 1)[-1] if isinstance(ref, str) and "." in ref else None

        return "remote code", index, mapped("AutoModel"), mapped("AutoModelForCausalLM") or arch
    if not isinstance(model_type, str):
        return None
    path = transformers_modeling_file(model_type)
    if path is None:
        return None
    rel = f"transformers/models/{path.parent.name}/{path.name}"
    tree = index.add(rel, path.read_text(encoding="utf-8"))
    if tree is not None:  # generated files are self-contained, but follow `from ..x.modeling_x import` once
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 2 and node.module and ".modeling_" in node.module:
                other = path.parent.parent / (node.module.replace(".", "/") + ".py")
                if other.exists():
                    index.add(f"transformers/models/{node.module.replace('.', '/')}.py",
                              other.read_text(encoding="utf-8"))
    model_cls = None
    if arch in index.classes:
        for child in index.children(arch).values():
            if child.classes and len(child.classes) == 1 and not child.listed \
                    and child.classes[0].endswith("Model"):
                model_cls = child.classes[0]
                break
    return "transformers", index, model_cls, arch


def _path_to(index: _Index, start: str, goal: set[str]) -> list[tuple[str, str, str]] | None:
    """Shortest chain of (parent class, attribute, child class) from `start` to a class in `goal`."""
    todo: list[tuple[str, list]] = [(start, [])]
    seen = {start}
    while todo:
        cls, path = todo.pop(0)
        if cls in goal:
            return path
        for attr, child in index.children(cls).items():
            for c in child.classes:
                if c not in seen:
                    seen.add(c)
                    todo.append((c, path + [(cls, attr, c)]))
    return None


def check(ckpt: Checkpoint) -> Compliance:
    """Every backend rule for this checkpoint, met or broken, with file and line."""
    loaded = _load(ckpt)
    if loaded is None:
        comp = Compliance("none", [])
        comp.rules.append(Rule("modeling source", False,
                               "no modeling source: the checkpoint ships no code and transformers has no "
                               f"models/{ckpt.config.get('model_type')}/ folder", "config.json"))
        return comp
    origin, index, model_cls, lm_cls = loaded
    comp = Compliance(origin, list(index.files))
    rules = comp.rules
    first_file = index.files[0] if index.files else None

    if origin == "remote code":
        auto_map = ckpt.config.get("auto_map") or {}
        ok = "AutoModel" in auto_map
        rules.append(Rule("auto_map AutoModel", ok,
                          f"config.json auto_map names AutoModel ({auto_map['AutoModel']})" if ok else
                          "config.json auto_map has no AutoModel entry; the backend builds the base model with "
                          "AutoModel.from_config", "config.json"))
    if lm_cls is None or lm_cls not in index.classes:
        rules.append(Rule("model class", False, f"the class {lm_cls!r} named by the config is not defined in "
                                                f"{', '.join(index.files) or 'the source'}", first_file))
        return comp
    lm = index.classes[lm_cls]
    if model_cls is None or model_cls not in index.classes:
        # The base model: the causal LM's child that leads to the layers.
        kids = [c for child in index.children(lm_cls).values() for c in child.classes if not child.listed]
        model_cls = kids[0] if kids else None
    comp.model_class = model_cls

    # _supports_attention_backend
    found = index.class_attr(lm_cls, "_supports_attention_backend")
    if found is not None and found[2] is True:
        rules.append(Rule("_supports_attention_backend", True, f"{found[0].name}._supports_attention_backend = True",
                          found[0].file, found[1].lineno))
    elif found is not None:
        rules.append(Rule("_supports_attention_backend", False,
                          f"{found[0].name}._supports_attention_backend is not True", found[0].file,
                          found[1].lineno))
    else:
        rules.append(Rule("_supports_attention_backend", False,
                          f"no class in {lm_cls}'s hierarchy sets _supports_attention_backend = True "
                          "(PreTrainedModel defaults to False, so vLLM refuses the model)", lm.file, lm.node.lineno))

    # ALL_ATTENTION_FUNCTIONS
    attn_classes: dict[str, tuple[_Class, ast.FunctionDef, ast.Call]] = {}
    for name in index.classes:
        m = index.method(name, "forward")
        if m is None or m[0].name != name:
            continue
        call = interface_call(m[1])
        if call is not None:
            attn_classes[name] = (m[0], m[1], call)
    reach = _path_to(index, model_cls, set(attn_classes)) if model_cls else None
    if reach is None:
        suspects = [c for c in index.classes.values() if "Attention" in c.name]
        where = suspects[0] if suspects else lm
        fwd = index.method(where.name, "forward")
        sdpa = _first_call(fwd[1], ("scaled_dot_product_attention", "softmax")) if fwd else None
        detail = (f"no module reachable from {model_cls} calls attention through ALL_ATTENTION_FUNCTIONS"
                  + (f"; {where.name}.forward computes it itself ({ast.unparse(sdpa.func)})" if sdpa else ""))
        if attn_classes:  # an interface call exists, but no `self.x = Class(...)` path leads to it
            detail += (f"; {', '.join(sorted(attn_classes))} call(s) it, but no `self.<attr> = <Class>(...)` chain "
                       f"from {model_cls} reaches it")
        rules.append(Rule("attention interface", False, detail, where.file,
                          sdpa.lineno if sdpa else (fwd[1].lineno if fwd else where.node.lineno)))
        reach = _path_to(index, model_cls, {c.name for c in suspects}) if model_cls else None
        attn_name = reach[-1][2] if reach else None
    else:
        attn_name = reach[-1][2] if reach else model_cls
        a_cls, _, a_call = attn_classes[attn_name]
        rules.append(Rule("attention interface", True,
                          f"{attn_name}.forward calls {ast.unparse(a_call.func)}, looked up in ALL_ATTENTION_FUNCTIONS",
                          a_cls.file, a_call.lineno))
    comp.attention_class = attn_name

    # **kwargs from the base model down to the interface call
    for parent, attr, child in reach or []:
        p_fwd = index.method(parent, "forward")
        c_fwd = index.method(child, "forward")
        label = f"kwargs {parent} -> {child}"
        if p_fwd is None or c_fwd is None:
            missing = parent if p_fwd is None else child
            rules.append(Rule(label, False, f"{missing} has no forward in the source", index.classes[missing].file,
                              index.classes[missing].node.lineno))
            continue
        p_kw = _var_kwarg(p_fwd[1])
        if p_kw is None:
            rules.append(Rule(label, False, f"{parent}.forward takes no **kwargs to pass down", p_fwd[0].file,
                              p_fwd[1].lineno))
            continue
        calls = _self_calls(p_fwd[1]).get(attr, [])
        if not calls:
            rules.append(Rule(label, False, f"{parent}.forward never calls self.{attr}", p_fwd[0].file,
                              p_fwd[1].lineno))
            continue
        bad = [c for c in calls if not _passes(c, p_kw)]
        if bad:
            rules.append(Rule(label, False, f"{parent}.forward calls self.{attr} without **{p_kw}",
                              p_fwd[0].file, bad[0].lineno))
        elif _var_kwarg(c_fwd[1]) is None:
            rules.append(Rule(label, False, f"{child}.forward takes no **kwargs", c_fwd[0].file, c_fwd[1].lineno))
        else:
            rules.append(Rule(label, True, f"{parent}.forward passes **{p_kw} to self.{attr} ({child})",
                              p_fwd[0].file, calls[0].lineno))
    if attn_name in attn_classes:
        _interface_kwargs_rule(rules, attn_name, *attn_classes[attn_name])

    # MoE experts
    moe_found = False
    for name in _reachable(index, model_cls):
        for attr, child in index.children(name).items():
            if attr != "experts":
                continue
            moe_found = True
            rules.append(_experts_rule(index, name, child))
    if not moe_found:
        rules.append(Rule("MoE experts", None, "no `experts` module: not a mixture-of-experts model"))
    comp.expected = expected_fusions(index, model_cls, _num_layers(ckpt))
    return comp


def _interface_kwargs_rule(rules: list[Rule], attn_name: str, a_cls: _Class, a_fwd: ast.FunctionDef,
                           a_call: ast.Call) -> None:
    a_kw = _var_kwarg(a_fwd)
    if _passes(a_call, a_kw):
        rules.append(Rule(f"kwargs {attn_name} -> attention interface", True,
                          f"{attn_name}.forward passes **{a_kw} to the interface call", a_cls.file, a_call.lineno))
    else:
        rules.append(Rule(f"kwargs {attn_name} -> attention interface", False,
                          f"{attn_name}.forward does not pass **kwargs to the interface call", a_cls.file,
                          a_call.lineno))


def _first_call(func: ast.FunctionDef, names: tuple[str, ...]) -> ast.Call | None:
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and _name(node.func) in names:
            return node
    return None


def _reachable(index: _Index, start: str | None) -> list[str]:
    if start is None:
        return []
    out, todo = [], [start]
    while todo:
        c = todo.pop(0)
        if c in out:
            continue
        out.append(c)
        for child in index.children(c).values():
            todo.extend(child.classes)
    return out


def _experts_rule(index: _Index, block: str, child: _Child) -> Rule:
    label = f"MoE experts ({block}.experts)"
    if child.module_list:
        return Rule(label, True, f"{block}.experts is an nn.ModuleList", child.file, child.line)
    if not child.classes:
        return Rule(label, False, f"{block}.experts is not a module class defined in the source", child.file,
                    child.line)
    cls = child.classes[0]
    if "ModuleList" in index.external_bases(cls):
        return Rule(label, True, f"{cls} inherits nn.ModuleList", index.classes[cls].file,
                    index.classes[cls].node.lineno)
    params = {a: c for a, c in index.children(cls).items() if c.parameter_dims is not None}
    three_d = [a for a, c in params.items() if c.parameter_dims == 3]
    if not three_d:
        return Rule(label, False, f"{cls} is neither an nn.ModuleList nor holds 3D nn.Parameters",
                    index.classes[cls].file, index.classes[cls].node.lineno)
    fwd = index.method(cls, "forward")
    if fwd is None:
        return Rule(label, False, f"{cls} has no forward", index.classes[cls].file, index.classes[cls].node.lineno)
    args = [a.arg for a in fwd[1].args.args][1:]
    if tuple(args[:3]) != MOE_EXPERTS_ARGS:
        return Rule(label, False, f"{cls}.forward takes ({', '.join(args)}), not "
                                  f"({', '.join(MOE_EXPERTS_ARGS)})", fwd[0].file, fwd[1].lineno)
    return Rule(label, True, f"{cls} holds 3D parameters ({', '.join(three_d)}) and its forward takes "
                             f"({', '.join(MOE_EXPERTS_ARGS)})", fwd[0].file, fwd[1].lineno)


def _num_layers(ckpt: Checkpoint) -> int:
    n = ckpt.config.get("num_hidden_layers")
    return n if isinstance(n, int) and not isinstance(n, bool) else 1


# ------------------------------------------------------------------ fusion prediction
def _glu(index: _Index, cls: str) -> tuple[str, str, int] | None:
    """`self.act(self.gate(x)) * self.up(x)` over two nn.Linear children: (gate, up, line)."""
    fwd = index.method(cls, "forward")
    if fwd is None:
        return None
    kids = index.children(cls)
    linear = {a for a, c in kids.items() if c.linear}
    for node in ast.walk(fwd[1]):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
            continue
        for act, up in ((node.left, node.right), (node.right, node.left)):
            if not (isinstance(act, ast.Call) and isinstance(up, ast.Call) and len(act.args) == 1):
                continue
            gate = act.args[0]
            if not (isinstance(act.func, ast.Attribute) and _is_self(act.func.value)
                    and act.func.attr not in linear and isinstance(gate, ast.Call)):
                continue
            g, u = _self_attr(gate.func), _self_attr(up.func)
            if g in linear and u in linear and g != u and gate.args and up.args and \
                    ast.dump(gate.args[0]) == ast.dump(up.args[0]):
                return g, u, node.lineno
    return None


def _self_attr(node: ast.AST) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) and _is_self(node.value) else None


def _qkv(index: _Index, cls: str) -> int | None:
    """Three nn.Linear children named q/k/v, each called once on the same input: the line of the first."""
    fwd = index.method(cls, "forward")
    if fwd is None:
        return None
    linear = {a for a, c in index.children(cls).items() if c.linear}
    names = []
    for stem in ("q", "k", "v"):
        hit = [a for a in linear if a in (f"{stem}_proj", {"q": "query", "k": "key", "v": "value"}[stem])]
        if len(hit) != 1:
            return None
        names.append(hit[0])
    calls = _self_calls(fwd[1])
    if any(len(calls.get(n, [])) != 1 for n in names):
        return None
    args = [calls[n][0].args for n in names]
    if not all(len(a) == 1 for a in args) or len({ast.dump(a[0]) for a in args}) != 1:
        return None
    return min(calls[n][0].lineno for n in names)


def _rms_norm(index: _Index, cls: str) -> bool:
    """A leaf module whose forward is RMSNorm tensor math (rsqrt of the mean of squares)."""
    kids = index.children(cls)
    if any(c.classes or c.linear or c.module_list for c in kids.values()):
        return False
    fwd = index.method(cls, "forward")
    if fwd is None or len(fwd[1].args.args) != 2:
        return False
    text = "\n".join(ast.unparse(n) for c in index.mro(cls) for n in c.node.body if isinstance(n, ast.FunctionDef))
    return "rsqrt" in text and ("pow(2)" in text or "** 2" in text or "square" in text) and "mean" in text \
        and not ("- mean" in text or ".var(" in text)


def expected_fusions(index: _Index, model_cls: str | None, num_layers: int) -> list[ExpectedFusion]:
    """The `Fused:` lines vLLM's fusers should log, predicted from the source (one per class and attribute)."""
    out: list[ExpectedFusion] = []
    seen: set[tuple] = set()
    listed_classes: set[str] = set()
    for name in _reachable(index, model_cls):
        for child in index.children(name).values():
            if child.listed:
                listed_classes.update(child.classes)
    # classes built once per layer: those in a ModuleList, and everything under them
    per_layer = set()
    for c in listed_classes:
        per_layer.update(_reachable(index, c))
    group_of: dict[str, str] = {}
    todo = [(model_cls, "")] if model_cls else []
    while todo:
        cls, group = todo.pop(0)
        for attr, child in index.children(cls).items():
            for c in child.classes:
                g = f"{cls}.{attr}" if child.conditional and len(child.classes) > 1 else group
                if c not in group_of:
                    group_of[c] = g
                    todo.append((c, g))
    for parent in _reachable(index, model_cls):
        for attr, child in index.children(parent).items():
            for cls in child.classes:
                n = num_layers if parent in per_layer else 1
                c = index.classes[cls]
                conditional = group_of.get(parent, "") if attr == "experts" else group_of.get(cls, "")
                if (attr == "experts") and (k := ("moe", parent)) not in seen:
                    seen.add(k)
                    out.append(ExpectedFusion("moe", parent, "", parent, n, conditional, child.file, child.line,
                                              experts_class=cls))
                    continue
                qkv_line = _qkv(index, cls)
                if qkv_line and (k := ("qkv", cls, attr)) not in seen:
                    seen.add(k)
                    out.append(ExpectedFusion("qkv", cls, attr, parent, n, conditional, c.file, qkv_line))
                glu = _glu(index, cls)
                if glu and parent not in _experts_classes(index, model_cls) and (k := ("glu", cls, attr)) not in seen:
                    seen.add(k)
                    out.append(ExpectedFusion("gate_up", cls, attr, parent, n, conditional, c.file, glu[2]))
                if _rms_norm(index, cls) and (k := ("rms", cls, attr)) not in seen:
                    seen.add(k)
                    out.append(ExpectedFusion("rms_norm", cls, attr, parent, n, conditional, c.file, c.node.lineno))
    return out


def _experts_classes(index: _Index, model_cls: str | None) -> set[str]:
    out = set()
    for name in _reachable(index, model_cls):
        for attr, child in index.children(name).items():
            if attr == "experts":
                out.update(child.classes)
    return out


# ------------------------------------------------------------------ text
def render_text(comp: Compliance) -> list[str]:
    lines = [f"transformers backend compliance ({comp.origin}: {', '.join(comp.files) or 'no source'})"]
    for r in comp.rules:
        where = f"  [{r.where}]" if r.where else ""
        lines.append(f"  {r.status:<6}  {r.rule}: {r.detail}{where}")
    lines.append(f"  => {'compliant' if comp.compliant else 'not compliant'}")
    if comp.expected:
        lines.append("  expected Fused: lines (one per module class and attribute)")
        for e in comp.expected:
            cond = " (conditional)" if e.conditional else ""
            lines.append(f"    {e.kind:<8}  {e.module_class}.{e.attr or 'experts'} under {e.parent_class}, "
                         f"{e.instances} module(s){cond}")
    return lines


def _cell(text: str) -> str:
    """Text for one markdown table cell: one line, inert (scaffold.text)."""
    return markdown_text(" ".join(str(text).split()))


def render_markdown(comp: Compliance) -> list[str]:
    out = ["## Transformers backend compliance", "",
           (f"Read (never run) from {_cell(comp.origin)}: {', '.join(f'`{_cell(f)}`' for f in comp.files) or 'no source'}. "
            f"Result: **{'compliant' if comp.compliant else 'not compliant'}**."), "",
           "| rule | status | detail | where |", "| --- | --- | --- | --- |"]
    for r in comp.rules:
        out.append(f"| {_cell(r.rule)} | {r.status} | {_cell(r.detail)} | {r.where and '`' + _cell(r.where) + '`'} |")
    if comp.expected:
        out += ["", "Expected `Fused:` lines (one per module class and attribute):", "",
                "| fusion | module class | attribute | under | modules covered |", "| --- | --- | --- | --- | --- |"]
        for e in comp.expected:
            out.append(f"| {e.kind} | {_cell(e.module_class)} | {_cell(e.attr or 'experts')} | {_cell(e.parent_class)} | "
                       f"{e.instances}{' (conditional)' if e.conditional else ''} |")
    return out + [""]
