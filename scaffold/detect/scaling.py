"""Multipliers on the embedding, the residual branches and the logits, and final soft-capping."""

from __future__ import annotations

import ast
import re

from scaffold.checkpoint import Checkpoint
from scaffold.detect import codekeys, conditions, configexpr, dataflow
from scaffold.detect.attention import _number
from scaffold.detect.common import unsupported
from scaffold.detect.sourcecode import Found, modeling_sources, sqrt_hidden_scale, subtree, walk
from scaffold.errors import CheckpointError
from scaffold.spec import Source, Spec


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    hk = spec.source("hidden_size").expr or "config.hidden_size"
    if (mult := _number(ckpt, "embedding_multiplier")) is not None:
        spec.set("embedding_multiplier", mult, Source("config", "config.json embedding_multiplier",
                                                      "config.embedding_multiplier"))
    elif (found := sqrt_hidden_scale(modeling_sources(ckpt))) is not None and (
            guard := _enclosing_tests(modeling_sources(ckpt), found)):
        # AfMoE's `if self.config.mup_enabled: hidden_states = hidden_states * (self.config.hidden_size**0.5)`.
        truth = [conditions.evaluate(test, ckpt.config) == polarity for test, polarity in guard]
        said = " and ".join(("" if polarity else "not ") + ast.unparse(test) for test, polarity in guard)
        if any(conditions.evaluate(test, ckpt.config) is None for test, _ in guard):
            raise unsupported(f"embeddings scaled by hidden_size ** 0.5 only where {said} ({found}), a condition "
                              "config.json does not decide", ckpt.config_file, spec.model_type)
        spec.set("embedding_multiplier", spec.hidden_size**0.5 if all(truth) else None,
                 Source("code", f"{found}: embeddings scaled by hidden_size ** 0.5 where {said}", f"{hk}**0.5")
                 if all(truth) else Source("config", f"{found}: scaled by hidden_size ** 0.5 only where {said}, "
                                                     "which config.json does not hold: unscaled"))
    elif found is not None:
        spec.set("embedding_multiplier", spec.hidden_size**0.5,
                 Source("code", f"{found}: embeddings scaled by hidden_size ** 0.5", f"{hk}**0.5"))
    elif (switched := _switched_sqrt_scale(modeling_sources(ckpt))) is not None:
        # BioGPT's `math.sqrt(config.hidden_size) if config.scale_embedding else 1.0`: the config's flag decides.
        flag, found = switched
        on = ckpt.config.get(flag) is True
        spec.set("embedding_multiplier", spec.hidden_size**0.5 if on else None,
                 Source("code", f"{found}: embeddings scaled by hidden_size ** 0.5 where config.{flag}",
                        f"{hk}**0.5") if on else Source("config", f"config.json {flag} is not true: unscaled"))
    elif (found := _scaled_call(ckpt, spec.names.get("embed_tokens"))
          or _embedding_scale_argument(ckpt, spec.names.get("embed_tokens"))
          or _scaled_in_place(ckpt, spec.names.get("embed_tokens"))
          or _scaled_name(ckpt, spec.names.get("embed_tokens"))) is not None:
        spec.set("embedding_multiplier", *_as_multiplier(ckpt, found, "the embedding's output"))
    else:
        spec.set("embedding_multiplier", None, Source("default", "embeddings used as they are"))
    if (mult := _number(ckpt, "residual_multiplier")) is not None:
        spec.set("residual_multiplier", mult, Source("config", "config.json residual_multiplier",
                                                     "config.residual_multiplier"))
    elif (found := _scaled_call(ckpt, spec.names.get("self_attn"), spec.names.get("mlp"),
                                operand=_outputs_of)) is not None:
        spec.set("residual_multiplier", *_as_multiplier(ckpt, found, "each sublayer's output"))
    else:
        spec.set("residual_multiplier", None, Source("default", "sublayer outputs added as they are"))
    # The code decides whether it multiplies or divides: HyperCLOVAX multiplies its logits by
    # config.logits_scaling where Granite divides by it. The key's name decides only without code saying.
    if (found := _scaled_call(ckpt, spec.names.get("lm_head"), operand=_outputs_of)) is not None:
        spec.set("logits_scale", *_as_multiplier(ckpt, found, "the head's output"))
    elif (found := _scaled_call(ckpt, spec.names.get("lm_head"), operand=_head_input)) is not None:
        if spec.lm_head_bias:
            raise unsupported(f"hidden states scaled before a head with a bias ({found[2]}: not a scaling of the "
                              "logits)", ckpt.config_file, spec.model_type)
        # The head is linear without a bias: scaling its input scales the logits.
        spec.set("logits_scale", *_as_multiplier(ckpt, found, "the hidden states before the head"))
    elif (div := _number(ckpt, "logits_scaling")) is not None:
        spec.set("logits_scale", 1.0 / div, Source("config", "config.json logits_scaling (logits divided by it)",
                                                   "1.0 / config.logits_scaling"))
    elif (mult := _number(ckpt, "logit_scale")) is not None:
        spec.set("logits_scale", mult, Source("config", "config.json logit_scale", "config.logit_scale"))
    else:
        spec.set("logits_scale", None, Source("default", "logits as the head computes them"))
    if spec.source("attention_scale").kind == "default" and (found := _scaled_scores(ckpt)) is not None:
        spec.set("attention_scale", *_as_multiplier(ckpt, found, "q @ k^T (in place of head_dim ** -0.5)"))
    elif spec.source("attention_scale").kind == "default" and (unscaled := _unscaled_scores(ckpt, spec)):
        # GPT-Neo's _attn: softmax(q @ k^T + mask), the scores not divided by sqrt(head_dim).
        spec.set("attention_scale", 1.0, Source("code", f"{unscaled} (unscaled: 1.0 in place of head_dim ** -0.5)"))
    if (cap := _number(ckpt, "final_logit_softcapping")) is not None:
        spec.set("final_logit_softcap", cap, Source("config", "config.json final_logit_softcapping",
                                                    "config.final_logit_softcapping"))
    else:
        spec.set("final_logit_softcap", None, Source("default", "no final_logit_softcapping in config.json"))


def _enclosing_tests(sources: dict[str, str], found: Found) -> list[tuple[ast.expr, bool]]:
    """The `if` statements around the statement at `found`'s line, outermost first: (test, True where it is in
    the body, False in the else branch)."""
    tree = codekeys.parse(sources.get(found.file, ""))
    if tree is None:
        return []

    def inside(node: ast.AST, path: list) -> list | None:
        for field in ("body", "orelse"):
            for stmt in getattr(node, field, []) or []:
                if not isinstance(stmt, ast.stmt):
                    continue
                end = getattr(stmt, "end_lineno", stmt.lineno)
                if stmt.lineno <= found.line <= end:
                    here = path + [(node.test, field == "body")] if isinstance(node, ast.If) else path
                    deeper = inside(stmt, here)
                    return deeper if deeper is not None else here
        return None

    return inside(tree, []) or []


def _switched_sqrt_scale(sources: dict[str, str]) -> tuple[str, Found] | None:
    """(flag, where) for `sqrt(config.<hidden>) if config.<flag> else 1.0`, a scale the config switches on."""
    for name, node in walk(sources):
        if not (isinstance(node, ast.IfExp) and isinstance(node.orelse, ast.Constant) and node.orelse.value == 1.0):
            continue
        body, test = ast.unparse(node.body), ast.unparse(node.test)
        flag = re.fullmatch(r"(self\.)?config\.(\w+)", test)
        if flag and re.fullmatch(r"(math\.|torch\.)?sqrt\((self\.)?config\.(hidden_size|d_model|n_embd)\)", body):
            return flag.group(2), Found("sqrt scale", name, node.lineno)
    return None


# ------------------------------------------------------------------ multipliers read from the code
# `self.<module>(...) * E` (or `/`), where E is arithmetic over config values (scaffold.detect.configexpr) and may
# first be kept on the module (`self.residual_scale = config.scale_depth / math.sqrt(config.num_hidden_layers)`):
# a constant multiplier under the model's own keys. Read from the syntax tree, never run.
def _kept(cls: ast.ClassDef) -> dict[str, ast.expr]:
    """self.A -> the expression assigned to it in the class's methods (`self.A = <expression>`)."""
    kept = {}
    for func in cls.body:
        for node in subtree(func) if isinstance(func, ast.FunctionDef) else ():
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                    and isinstance(node.targets[0].value, ast.Name) and node.targets[0].value.id == "self"):
                kept[node.targets[0].attr] = node.value
    return kept


def _products(ckpt: Checkpoint, operand, augmented: bool = False) -> list[tuple[str, bool, str]]:
    """(config expression, divides, "FILE:LINE") of each `X * E` / `X / E` whose X satisfies `operand(X, func)`,
    func being the method the product is in; with `augmented`, of each `X *= E` / `X /= E` instead."""
    out = []
    props = configexpr.properties(codekeys.configuration_sources(ckpt))
    for name, text in modeling_sources(ckpt).items():
        tree = codekeys.parse(text)
        for cls in subtree(tree) if tree is not None else ():
            if not isinstance(cls, ast.ClassDef):
                continue
            kept = _kept(cls)
            for func in cls.body:
                if not isinstance(func, ast.FunctionDef):
                    continue
                for node in subtree(func):
                    if augmented:
                        if (isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Mult, ast.Div))
                                and operand(node.target, func)
                                and (expr := configexpr.expression(node.value, kept, props)) is not None):
                            out.append((expr, isinstance(node.op, ast.Div), f"{name}:{node.lineno}"))
                        continue
                    if not (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div))):
                        continue
                    sides = [(node.left, node.right)] + ([(node.right, node.left)] if isinstance(node.op, ast.Mult)
                                                         else [])
                    for x, k in sides:
                        if operand(x, func) and (expr := configexpr.expression(k, kept, props)) is not None:
                            out.append((expr, isinstance(node.op, ast.Div), f"{name}:{node.lineno}"))
    return out


def _calls(*modules: str | None):
    attrs = {m.rsplit(".", 1)[-1] for m in modules if m}

    def operand(x: ast.AST, _func=None) -> bool:
        return (isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and x.func.attr in attrs
                and isinstance(x.func.value, ast.Name) and x.func.value.id == "self")

    return operand


def _outputs_of(*modules: str | None):
    """X is a call of self.<module>, or a name the method assigns from one (`hidden_states, _ =
    self.self_attn(...)`): the sublayer's output, scaled before the residual add."""
    called = _calls(*modules)

    def operand(x: ast.AST, func: ast.FunctionDef) -> bool:
        if called(x):
            return True
        if not isinstance(x, ast.Name):
            return False
        for node in subtree(func):
            if isinstance(node, ast.Assign) and called(node.value):
                for target in node.targets:
                    names = target.elts if isinstance(target, ast.Tuple) else [target]
                    if names and isinstance(names[0], ast.Name) and names[0].id == x.id:
                        return True
        return False

    return operand


def _head_input(head: str | None):
    """X is a name the method hands to self.<head>(...) (MiniCPM scales the hidden states before its head)."""
    attr = head.rsplit(".", 1)[-1] if head else None

    def operand(x: ast.AST, func: ast.FunctionDef) -> bool:
        if attr is None or not isinstance(x, ast.Name):
            return False
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == attr
                   and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"
                   and any(isinstance(m, ast.Name) and m.id == x.id for a in n.args for m in subtree(a))
                   for n in subtree(func))

    return operand


def _unique(found: list[tuple[str, bool, str]]) -> tuple[str, bool, str] | None:
    return found[0] if found and len({(k, d) for k, d, _ in found}) == 1 else None


def _scaled_call(ckpt: Checkpoint, *modules: str | None, operand=_calls) -> tuple[str, bool, str] | None:
    """The one config expression the code multiplies (or divides) the output of self.<module>(...) by (what
    `operand(*modules)` accepts as that output)."""
    if not any(modules):
        return None
    return _unique(_products(ckpt, operand(*modules)))


def _scaled_in_place(ckpt: Checkpoint, embed: str | None) -> tuple[str, bool, str] | None:
    """The one config expression a name holding the embedding's output is multiplied by in place (CTRL's
    `inputs_embeds = self.w(input_ids)` ... `inputs_embeds *= np.sqrt(self.d_model_size)`)."""
    return _unique(_products(ckpt, _outputs_of(embed), augmented=True)) if embed else None


def _scaled_name(ckpt: Checkpoint, embed: str | None) -> tuple[str, bool, str] | None:
    """The one config expression a name holding the embedding's output is multiplied by (HRM-Text's
    `inputs_embeds = self.embed_tokens(input_ids)` ... `inputs_embeds = inputs_embeds * self.embedding_scale`)."""
    return _unique(_products(ckpt, _outputs_of(embed))) if embed else None


def _embedding_scale_argument(ckpt: Checkpoint, embed: str | None) -> tuple[str, bool, str] | None:
    """The config expression handed to the embedding's class as `embed_scale=` (transformers' scaled word
    embeddings: MiniCPM3's `embed_scale=config.scale_emb`)."""
    attr = embed.rsplit(".", 1)[-1] if embed else None
    found = []
    for file, _cls, _func, name, value in codekeys.self_assignments(modeling_sources(ckpt)):
        if name != attr or not isinstance(value, ast.Call):
            continue
        for keyword in value.keywords:
            if keyword.arg == "embed_scale" and (expr := configexpr.expression(keyword.value)) is not None:
                found.append((expr, False, f"{file}:{value.lineno}"))
    return _unique(found)


def _scaled_scores(ckpt: Checkpoint) -> tuple[str, bool, str] | None:
    """The one config expression the code multiplies the attention scores (a matmul of q and k) by."""
    def scores(x: ast.AST, _func=None) -> bool:
        return (isinstance(x, ast.BinOp) and isinstance(x.op, ast.MatMult)) or (
            isinstance(x, ast.Call) and codekeys.callee(x) in ("matmul", "bmm", "einsum"))
    # One config key (Granite's attention_multiplier): an expression such as head_dim ** -0.5 is the default
    # scale written out, which the port computes as it is.
    return _unique([f for f in _products(ckpt, scores) if re.fullmatch(r"config\.\w+", f[0])])


def _unscaled_scores(ckpt: Checkpoint, spec: Spec) -> str:
    """FILE:LINE where the attention's code computes its scores as q @ k^T and nothing scales them
    (dataflow.Attention.unscaled_scores); "" where the code does not say so."""
    sources = modeling_sources(ckpt)
    if not sources or spec.qkv_layout == "latent":
        return ""
    layers = spec.names.get("layers") if isinstance(spec.names, dict) else None
    try:
        flow = (dataflow.analyze_layer(sources, ckpt.config, layers.rsplit(".", 1)[-1]) if layers else None) \
            or dataflow.analyze_layer(sources, ckpt.config)
    except RecursionError:
        return ""
    attention = flow.attention_flow if flow is not None else None
    return attention.unscaled_scores if attention is not None else ""


def _as_multiplier(ckpt: Checkpoint, found: tuple[str, bool, str], what: str) -> tuple[float, Source]:
    expr, divides, where = found
    value = configexpr.evaluate(expr, ckpt.config)
    if value is None or value == 0:
        raise CheckpointError(f"the code scales {what} by {expr} ({where}), but config.json's values do not make "
                              "it a non-zero number.", ckpt.config_file)
    if divides:
        return 1.0 / value, Source("code", f"{where}: {what} divided by {expr}", f"1.0 / {_grouped(expr)}")
    return float(value), Source("code", f"{where}: {what} multiplied by {expr}", expr)


def _grouped(expr: str) -> str:
    return expr if expr.startswith("config.") and expr.replace(".", "").replace("_", "").isalnum() else f"({expr})"
