"""Multipliers on the embedding, the residual branches and the logits, and final soft-capping."""

from __future__ import annotations

import ast
import re

from scaffold.checkpoint import Checkpoint
from scaffold.detect import codekeys
from scaffold.detect.attention import _number
from scaffold.detect.sourcecode import Found, modeling_sources, sqrt_hidden_scale, subtree, walk
from scaffold.errors import CheckpointError
from scaffold.spec import Source, Spec


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    hk = spec.source("hidden_size").expr or "config.hidden_size"
    if (mult := _number(ckpt, "embedding_multiplier")) is not None:
        spec.set("embedding_multiplier", mult, Source("config", "config.json embedding_multiplier",
                                                      "config.embedding_multiplier"))
    elif (found := sqrt_hidden_scale(modeling_sources(ckpt))) is not None:
        spec.set("embedding_multiplier", spec.hidden_size**0.5,
                 Source("code", f"{found}: embeddings scaled by hidden_size ** 0.5", f"{hk}**0.5"))
    elif (switched := _switched_sqrt_scale(modeling_sources(ckpt))) is not None:
        # BioGPT's `math.sqrt(config.hidden_size) if config.scale_embedding else 1.0`: the config's flag decides.
        flag, found = switched
        on = ckpt.config.get(flag) is True
        spec.set("embedding_multiplier", spec.hidden_size**0.5 if on else None,
                 Source("code", f"{found}: embeddings scaled by hidden_size ** 0.5 where config.{flag}",
                        f"{hk}**0.5") if on else Source("config", f"config.json {flag} is not true: unscaled"))
    elif (found := _scaled_call(ckpt, spec.names.get("embed_tokens"))) is not None:
        spec.set("embedding_multiplier", *_as_multiplier(ckpt, found, "the embedding's output"))
    else:
        spec.set("embedding_multiplier", None, Source("default", "embeddings used as they are"))
    if (mult := _number(ckpt, "residual_multiplier")) is not None:
        spec.set("residual_multiplier", mult, Source("config", "config.json residual_multiplier",
                                                     "config.residual_multiplier"))
    elif (found := _scaled_call(ckpt, spec.names.get("self_attn"), spec.names.get("mlp"))) is not None:
        spec.set("residual_multiplier", *_as_multiplier(ckpt, found, "each sublayer's output"))
    else:
        spec.set("residual_multiplier", None, Source("default", "sublayer outputs added as they are"))
    if (div := _number(ckpt, "logits_scaling")) is not None:
        spec.set("logits_scale", 1.0 / div, Source("config", "config.json logits_scaling (logits divided by it)",
                                                   "1.0 / config.logits_scaling"))
    elif (mult := _number(ckpt, "logit_scale")) is not None:
        spec.set("logits_scale", mult, Source("config", "config.json logit_scale", "config.logit_scale"))
    elif (found := _scaled_call(ckpt, spec.names.get("lm_head"))) is not None:
        spec.set("logits_scale", *_as_multiplier(ckpt, found, "the head's output"))
    else:
        spec.set("logits_scale", None, Source("default", "logits as the head computes them"))
    if spec.source("attention_scale").kind == "default" and (found := _scaled_scores(ckpt)) is not None:
        spec.set("attention_scale", *_as_multiplier(ckpt, found, "q @ k^T (in place of head_dim ** -0.5)"))
    if (cap := _number(ckpt, "final_logit_softcapping")) is not None:
        spec.set("final_logit_softcap", cap, Source("config", "config.json final_logit_softcapping",
                                                    "config.final_logit_softcapping"))
    else:
        spec.set("final_logit_softcap", None, Source("default", "no final_logit_softcapping in config.json"))


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
# `self.<module>(...) * config.K` (or `/`), where K may first be kept on the module (`self.res_mult = config.K`):
# a constant multiplier under the model's own key name. Read from the syntax tree, never run.
def _config_keys_kept(cls: ast.ClassDef) -> dict[str, str]:
    """self.A -> K for each `self.A = config.K` in the class's methods."""
    kept = {}
    for func in cls.body:
        for node in subtree(func) if isinstance(func, ast.FunctionDef) else ():
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                    and isinstance(node.targets[0].value, ast.Name) and node.targets[0].value.id == "self"
                    and isinstance(node.value, ast.Attribute) and codekeys._is_config(node.value.value)):
                kept[node.targets[0].attr] = node.value.attr
    return kept


def _key_of(node: ast.AST, kept: dict[str, str]) -> str | None:
    if isinstance(node, ast.Attribute) and codekeys._is_config(node.value):
        return node.attr
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return kept.get(node.attr)
    return None


def _products(ckpt: Checkpoint, operand) -> list[tuple[str, bool, str]]:
    """(config key, divides, "FILE:LINE") of each `X * config.K` / `X / config.K` whose X satisfies `operand`."""
    out = []
    for name, text in codekeys.code_sources(ckpt).items():
        tree = codekeys.parse(text)
        for cls in subtree(tree) if tree is not None else ():
            if not isinstance(cls, ast.ClassDef):
                continue
            kept = _config_keys_kept(cls)
            for node in subtree(cls):
                if not (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div))):
                    continue
                sides = [(node.left, node.right)] + ([(node.right, node.left)] if isinstance(node.op, ast.Mult) else [])
                for x, k in sides:
                    if operand(x) and (key := _key_of(k, kept)) is not None:
                        out.append((key, isinstance(node.op, ast.Div), f"{name}:{node.lineno}"))
    return out


def _calls(*modules: str | None):
    attrs = {m.rsplit(".", 1)[-1] for m in modules if m}
    return lambda x: (isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and x.func.attr in attrs
                      and isinstance(x.func.value, ast.Name) and x.func.value.id == "self")


def _unique(found: list[tuple[str, bool, str]]) -> tuple[str, bool, str] | None:
    return found[0] if found and len({(k, d) for k, d, _ in found}) == 1 else None


def _scaled_call(ckpt: Checkpoint, *modules: str | None) -> tuple[str, bool, str] | None:
    """The one config key the code multiplies (or divides) the output of self.<module>(...) by."""
    if not any(modules):
        return None
    return _unique(_products(ckpt, _calls(*modules)))


def _scaled_scores(ckpt: Checkpoint) -> tuple[str, bool, str] | None:
    """The one config key the code multiplies the attention scores (a matmul of q and k) by."""
    def scores(x: ast.AST) -> bool:
        return (isinstance(x, ast.BinOp) and isinstance(x.op, ast.MatMult)) or (
            isinstance(x, ast.Call) and codekeys.callee(x) in ("matmul", "bmm", "einsum"))
    return _unique(_products(ckpt, scores))


def _as_multiplier(ckpt: Checkpoint, found: tuple[str, bool, str], what: str) -> tuple[float, Source]:
    key, divides, where = found
    value = ckpt.config.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value == 0:
        raise CheckpointError(f"the code scales {what} by config.{key} ({where}), but config.json holds "
                              f"{value!r} there, not a non-zero number.", ckpt.config_file)
    if divides:
        return 1.0 / value, Source("code", f"{where}: {what} divided by config.{key}", f"1.0 / config.{key}")
    return float(value), Source("code", f"{where}: {what} multiplied by config.{key}", f"config.{key}")
