"""Checks that need no engine: mapping coverage, shapes, concat order, vocab, ties, rope."""

from __future__ import annotations

import ast
from collections import defaultdict

from scaffold.checkpoint import Checkpoint
from scaffold.detect import detect
from scaffold.errors import ScaffoldError
from scaffold.mapping import STACKED, weight_table
from scaffold.spec import FIELDS, Spec
from scaffold.verify.port import Port
from scaffold.verify.report import Report

# What each checkpoint module must be in the fused parameter: (fused module, shard id).
CANONICAL_SHARDS = {shard_name: (fused, shard_id) for shard_name, fused, shard_id in STACKED}
SHARDS_OF = {"self_attn.qkv_proj": ("q", "k", "v"), "mlp.gate_up_proj": (0, 1)}


def expected_params(spec: Spec) -> dict[str, tuple]:
    """Every parameter the port holds that a checkpoint tensor must fill -> the shards it needs."""
    params: dict[str, tuple] = {"model.embed_tokens.weight": (None,), "model.norm.weight": (None,)}
    if spec.norm_kind == "layer":
        params["model.norm.bias"] = (None,)
    if not spec.tie_word_embeddings:
        params["lm_head.weight"] = (None,)
    if spec.lm_head_bias:
        params["lm_head.bias"] = (None,)
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        kinds = ("weight", "bias") if spec.norm_kind == "layer" else ("weight",)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            for kind in kinds:
                params[f"{p}{norm}.{kind}"] = (None,)
        qkv = SHARDS_OF["self_attn.qkv_proj"] if spec.qkv_layout == "separate" else (None,)
        params[f"{p}self_attn.qkv_proj.weight"] = qkv
        if spec.qkv_bias:
            params[f"{p}self_attn.qkv_proj.bias"] = qkv
        params[f"{p}self_attn.o_proj.weight"] = (None,)
        if spec.o_bias:
            params[f"{p}self_attn.o_proj.bias"] = (None,)
        if spec.qk_norm != "none":
            params[f"{p}self_attn.q_norm.weight"] = (None,)
            params[f"{p}self_attn.k_norm.weight"] = (None,)
        params[f"{p}mlp.gate_up_proj.weight"] = SHARDS_OF["mlp.gate_up_proj"]
        params[f"{p}mlp.down_proj.weight"] = (None,)
        if spec.mlp_bias:
            params[f"{p}mlp.gate_up_proj.bias"] = SHARDS_OF["mlp.gate_up_proj"]
            params[f"{p}mlp.down_proj.bias"] = (None,)
        if spec.gate_extra_bias:
            params[f"{p}mlp.{spec.gate_extra_bias}"] = (None,)
    return params


def check_mapping(report: Report, spec: Spec, ckpt: Checkpoint) -> None:
    rows, homeless = weight_table(spec, ckpt)
    filled: dict[str, list] = defaultdict(list)
    for row in rows:
        if row.param:
            filled[row.param].append(row.shard)
    problems = [f"tensor {n} has no home in the port" for n in homeless]
    for param, shards in expected_params(spec).items():
        got = filled.get(param, [])
        for shard in shards:
            if got.count(shard) != 1:
                what = "never loaded" if shard not in got else "loaded twice"
                problems.append(f"{param}{'' if shard is None else f' shard {shard!r}'} is {what}")
    extra = sorted(set(filled) - set(expected_params(spec)))
    problems += [f"tensor(s) load {p}, which the port does not have" for p in extra]
    loaded = sum(1 for r in rows if r.param)
    report.add("mapping coverage", not problems, "; ".join(problems[:3]) if problems else
               f"{loaded} tensors fill {len(filled)} parameters, every shard exactly once")


def check_shapes(report: Report, spec: Spec, ckpt: Checkpoint) -> None:
    q, kv, inter, hidden = (spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim,
                            spec.intermediate_size, spec.hidden_size)
    want = {"self_attn.q_proj": q, "self_attn.k_proj": kv, "self_attn.v_proj": kv,
            "self_attn.qkv_proj": q + 2 * kv, "mlp.gate_proj": inter, "mlp.up_proj": inter,
            "mlp.gate_up_proj": 2 * inter, "self_attn.o_proj": hidden, "mlp.down_proj": hidden}
    problems = []
    for name, info in ckpt.tensors.items():
        parts = name.split(".")
        if parts[:2] != ["model", "layers"] or parts[-1] != "weight":
            continue
        module = ".".join(parts[3:-1])
        if module in want and info.shape[0] != want[module]:
            problems.append(f"{name} has {info.shape[0]} rows, the spec needs {want[module]}")
    report.add("per-shard shapes", not problems, problems[0] if problems else
               f"q {q}, k {kv}, v {kv} rows (GQA {spec.num_heads}:{spec.num_kv_heads}); gate/up {inter} rows each")


def stacked_mapping_of(model_file) -> list[tuple]:
    """The stacked_params_mapping literal of a generated model file, read with ast."""
    tree = ast.parse(model_file.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "stacked_params_mapping" for t in node.targets
        ):
            return [tuple(t) for t in ast.literal_eval(node.value)]
    raise ScaffoldError("the model file has no stacked_params_mapping.", model_file)


def check_concat_order(report: Report, spec: Spec, model_file) -> None:
    problems = []
    mapping = stacked_mapping_of(model_file)
    seen = set()
    for param, shard_name, shard_id in mapping:
        expected = CANONICAL_SHARDS.get(shard_name)
        if expected is None:
            problems.append(f"{shard_name} is not a known shard of a fused projection")
        elif (param, shard_id) != expected:
            problems.append(f"{shard_name} loads into {param} shard {shard_id!r}, but belongs in "
                            f"{expected[0]} shard {expected[1]!r}")
        seen.add(shard_name)
    if spec.qkv_layout == "separate":
        missing = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"} - seen
        problems += [f"{m} has no entry" for m in sorted(missing)]
    if spec.mlp_kind == "gated" and spec.qkv_layout == "separate":
        problems += [f"{m} has no entry" for m in sorted({"mlp.gate_proj", "mlp.up_proj"} - seen)]
    swapped = ""
    ids = {name: sid for _, name, sid in mapping}
    if ids.get("self_attn.k_proj") == "v" and ids.get("self_attn.v_proj") == "k":
        swapped = " (k and v are swapped)"
    if ids.get("mlp.gate_proj") == 1 and ids.get("mlp.up_proj") == 0:
        swapped = " (gate and up are swapped)"
    report.add("q/k/v and gate/up order", not problems,
               (problems[0] + swapped) if problems else "q, k, v -> qkv_proj shards q, k, v; gate, up -> 0, 1")


def check_vocab(report: Report, spec: Spec, ckpt: Checkpoint) -> None:
    rows = ckpt.tensors["model.embed_tokens.weight"].shape[0]
    head = ckpt.tensors.get("lm_head.weight")
    tok = ckpt.tokenizer.vocab_size
    problems = []
    if spec.vocab_size != rows:
        problems.append(f"vocab_size {spec.vocab_size} but embed_tokens has {rows} rows")
    if head is not None and head.shape[0] != rows:
        problems.append(f"lm_head has {head.shape[0]} rows, embed_tokens {rows}")
    if tok is not None and tok > spec.vocab_size:
        problems.append(f"the tokenizer has {tok} tokens, more than vocab_size {spec.vocab_size}")
    detail = f"vocab_size {spec.vocab_size} = embedding rows" + (f" = lm_head rows" if head is not None else "")
    if tok is not None:
        detail += f"; tokenizer {tok} tokens" + (f" ({spec.vocab_size - tok} padded rows)" if tok < rows else "")
    report.add("vocabulary", not problems, problems[0] if problems else detail)


def check_tied(report: Report, spec: Spec, ckpt: Checkpoint) -> None:
    has_head = "lm_head.weight" in ckpt.tensors
    if spec.tie_word_embeddings and has_head:
        same = _tensors_equal(ckpt, "lm_head.weight", "model.embed_tokens.weight")
        report.add("tied embeddings", same, "lm_head.weight equals embed_tokens" if same else
                   "the port ties lm_head to embed_tokens, but the checkpoint's lm_head.weight differs from it")
    elif spec.tie_word_embeddings:
        report.add("tied embeddings", True, "no lm_head.weight: the head is the embedding")
    elif not has_head:
        report.add("tied embeddings", False, "the port has its own lm_head but the checkpoint has no lm_head.weight")
    else:
        report.add("tied embeddings", True, "untied: lm_head.weight is loaded on its own")


def _tensors_equal(ckpt: Checkpoint, a: str, b: str) -> bool:
    from safetensors import safe_open

    def load(name):
        with safe_open(str(ckpt.path / ckpt.tensors[name].file), framework="pt") as f:
            return f.get_tensor(name)

    import torch

    return torch.equal(load(a), load(b))


def check_rope(report: Report, spec: Spec, detected: Spec | None) -> None:
    theta = spec.rope_parameters.get("rope_theta")
    if not theta:
        report.add("rope parameters", False, "the spec has no rope_theta")
        return
    detail = f"{spec.rope_parameters}"
    if detected is not None:
        detail += f" (checkpoint: {detected.source('rope_parameters')})"
    report.add("rope parameters", True, detail)


def spec_drift(spec: Spec, detected: Spec) -> list[str]:
    """Fields where the port's spec differs from what the checkpoint says now."""
    out = []
    for name in FIELDS:
        if name in ("package",):
            continue
        mine, theirs = getattr(spec, name), getattr(detected, name)
        if mine != theirs:
            out.append(f"{name}: port {mine!r}, checkpoint {theirs!r} ({detected.source(name)})")
    return out


def run_static(report: Report, port: Port, ckpt: Checkpoint) -> list[str]:
    spec = port.spec
    try:
        detected = detect(ckpt)
    except ScaffoldError:
        detected = None
    check_mapping(report, spec, ckpt)
    check_shapes(report, spec, ckpt)
    check_concat_order(report, spec, port.model_file)
    check_vocab(report, spec, ckpt)
    check_tied(report, spec, ckpt)
    check_rope(report, spec, detected)
    drift = spec_drift(spec, detected) if detected is not None else []
    if drift:
        report.note("spec matches checkpoint", f"{len(drift)} field(s) differ: " + "; ".join(drift))
    else:
        report.add("spec matches checkpoint", True, "every field is what the checkpoint says")
    return drift
