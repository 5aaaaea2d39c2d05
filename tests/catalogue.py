"""The transformers catalogue: every model_type with a causal-LM class, classified, ported and measured.

tests/test_catalogue.py measures one row per model type with `measure`; scripts/catalogue.py runs
it and writes docs/catalogue.md with `render`. As in coverage_doc.py, the rows travel as JSON inside
the document, so a partial run (`-k`, or porting without verifying) keeps the other rows' records.

A type is out of scope by what the model is, read from its config and its modeling code (never
executed): encoder-decoder (config.is_encoder_decoder), an encoder whose causal-LM head is a decoder
mode (the modeling code asks for `is_decoder=True`) or whose default config builds no causal mask (XLM's
causal, XLNet's attn_type, read by scaffold.detect.forms), multimodal (vision / audio sub-configs, or a
causal-LM class whose forward takes image inputs: Fuyu's image_patches), or a
state-space, linear-attention, recurrent or convolutional mixer (layer_types that are not softmax
attention, or such a mixer in the modeling code). Everything else is built tiny (BASE sizes, MoE
shrunk, plus FAMILY_OVERRIDES), renamed so vLLM has no class of its own, and run through
`scaffold new`; what ports is verified with `scaffold verify --json`.
"""

from __future__ import annotations

import ast
import datetime
import importlib.util
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from coverage_doc import recorded_results

REPO = Path(__file__).resolve().parent.parent
CATALOGUE = REPO / "docs" / "catalogue.md"
MARK = "<!-- catalogue rows (read by tests/test_catalogue.py): "
TOLERANCE = 1e-4
BUILD_TIMEOUT_S = 120

# Values a tiny MoE needs whatever its family calls them: few, small experts (defaults such as 256 experts of
# 2048 rows would make a "tiny" checkpoint gigabytes), and expert groups that divide them.
MOE_SHRINK = {
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_k": 2, "moe_topk": 2,
    "moe_intermediate_size": 64, "expert_intermediate_size": 64,
    "n_group": 1, "topk_group": 1,
}

# Multi-head latent attention at the one size vLLM's CPU build runs: its MLA decode kernel takes a 576-wide cache
# row only (kv_lora_rank 512 + qk_rope_head_dim 64, DeepSeek-V3's), transformers' rotary embedding is head_dim
# wide (so head_dim = qk_rope_head_dim), and the code repeats keys and values per KV head (so KV heads = heads).
LATENT_SIZES = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "head_dim": 64, "q_lora_rank": 96, "qk_nope_head_dim": 32,
                "v_head_dim": 32, "num_key_value_heads": 4}
LATENT = (LATENT_SIZES,
          "latent attention at the size vLLM's CPU MLA kernel takes (a 576-wide cache row: kv_lora_rank 512 + "
          "qk_rope_head_dim 64 = head_dim), KV heads = heads")
LATENT_TYPES = ("axk1", "axk2", "deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe_lite", "glm_moe_dsa",
                "minicpm3", "youtu")

# Per-family additions to BASE, each with why the family needs it (kept small on purpose).
FAMILY_OVERRIDES: dict[str, tuple[dict, str]] = {
    **dict.fromkeys(LATENT_TYPES, LATENT),
    "deepseek_v2": ({**LATENT[0], "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1},
                    LATENT[1] + "; its config leaves num_experts_per_tok None (the model cannot be made without it) "
                                "and the expert groups None (one group: its greedy top-k)"),
    "longcat_flash": ({**LATENT[0], "zero_expert_num": 4},
                      LATENT[1] + "; as many identity (zero) experts as routed ones (its default is 256 beside BASE's "
                                  "4 routed experts, so the top-k would choose almost only identity experts)"),
    "gpt_neox": ({"num_key_value_heads": 4}, "no grouped-query attention: kv heads equal heads"),
    "gpt_neo": ({"attention_types": [[["global", "local"], 1], [["global"], 1]], "window_size": 8},
                "attention_types must name one kind per layer (BASE's 3), and a window shorter than the prompts"),
    "dots1": ({"num_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},
              "its config leaves the expert counts None (the model cannot be made without them)"),
    "llama4_text": ({"num_experts_per_tok": 1}, "Llama 4 routes each token to one expert (Scout's and Maverick's "
                                                "configs): its routing weights scale the expert's input, which vLLM's "
                                                "FusedMoE computes for one expert per token"),
    "falcon": ({"head_dim": None}, "its head_dim is a read-only property (hidden_size / heads)"),
    "granitemoeshared": ({"shared_intermediate_size": 64}, "its config's shared expert width defaults to 0: "
                                                            "without it the checkpoint has no shared expert"),
    "reformer": ({"is_decoder": True, "axial_pos_embds_dim": [64, 64], "axial_pos_shape": [16, 32]},
                 "its LM head is causal only as a decoder (the class refuses otherwise), and its axial position "
                 "embedding must add up to BASE's hidden size and cover its positions"),
    "dbrx": ({"d_model": 128, "attn_config": {"rope_theta": 10000.0, "kv_n_heads": 2, "clip_qkv": 8.0},
              "ffn_config": {"moe_num_experts": 4, "moe_top_k": 2, "ffn_hidden_size": 64}},
             "its attention and expert sizes live in sub-configs (attn_config without rope_theta cannot be built), "
             "d_model must be set as itself: the config copies it into ffn_config (the experts' width) before "
             "the hidden_size alias applies, and clip_qkv set (DBRX's 8): with its default null, transformers' "
             "DbrxAttention calls clamp(min=None, max=None), which torch refuses"),
    "cohere_compass_text": ({"rope_parameters": {kind: {"rope_type": "default", "rope_theta": 10000.0,
                                                        "mrope_section": [6, 6, 4]}
                                                 for kind in ("full_attention", "sliding_attention")}},
                            "rope parameters per layer type, and rotary sections that fit BASE's head_dim"),
    "gemma3n_text": ({"layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                      "num_kv_shared_layers": 0, "vocab_size_per_layer_input": 256, "hidden_size_per_layer_input": 32},
                     "layer types with a full-attention layer among BASE's 3, no KV sharing across them, and a "
                     "per-layer embedding the size of BASE's vocabulary (its default is 262144 rows)"),
    "xlnet": ({"max_position_embeddings": None, "d_head": 32},
              "it has no position limit (the config refuses one) and d_head must be hidden / heads"),
    "gptj": ({"rotary_dim": 16}, "its default rotary_dim (64) is wider than BASE's heads: transformers' own "
                                 "forward fails on it"),
    "codegen": ({"rotary_dim": 16}, "its default rotary_dim (64) is wider than BASE's heads: transformers' own "
                                    "forward fails on it"),
}
TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}

# Families vLLM's transformers backend serves wrongly, as measured (shared/ENVIRONMENT.md, 2026-11-29): the table
# says so beside the port's figure, since for these the port is the only correct way to serve them in vLLM.
BACKEND_WRONG = {
    "gpt_neox": "vLLM's transformers backend serves this family wrongly (log-probs off by up to 1.0 in float32)",
}

# Mixers that are not softmax attention, as the modeling code defines them (classes and kernels it calls).
NON_ATTENTION_MIXERS = {
    "state-space": r"selective_scan|class \w*Mamba\w*Mixer|ssm_state|mamba_chunk_scan",
    "linear attention": r"chunk_gated_delta_rule|GatedDeltaNet|lightning_attn|class \w*LinearAttention\b",
    "recurrent": r"class \w*(Rglru|RecurrentBlock|[mMsS]LSTM)\w*|rwkv_linear_attention|def mlstm_\w+",
    "convolutional": r"class \w*ShortConv\w*|causal_conv1d",
}
ATTENTION_LAYER_TYPES = re.compile(r"(full|sliding|chunked|indexed|compressed|heavily_compressed|sparse)\w*attention$")


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def catalogue() -> dict[str, str]:
    """model_type -> causal-LM class name, for every type the installed transformers maps.

    Read from the literal in transformers' auto-mapping source: importing the module costs every test
    worker ~13 s of torch imports at collection (test_catalogue checks the two agree)."""
    source = Path(importlib.util.find_spec("transformers").submodule_search_locations[0]) / "models" / "auto"
    tree = ast.parse((source / "modeling_auto.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES" and isinstance(node.value, ast.Call)):
            return dict(sorted(ast.literal_eval(node.value.args[0])))
    raise LookupError(f"no MODEL_FOR_CAUSAL_LM_MAPPING_NAMES literal in {source / 'modeling_auto.py'}")


def modeling_source(model_type: str) -> str:
    """The text of the family's modeling file (read, never imported); empty when there is none."""
    import transformers
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    module = model_type_to_module_name(model_type)
    folder = Path(transformers.__file__).parent / "models" / module
    # A folder holding several families names each file after its type (data2vec/modeling_data2vec_text.py).
    for path in (folder / f"modeling_{module}.py", folder / f"modeling_{model_type.replace('-', '_')}.py"):
        if path.is_file():
            return path.read_text(encoding="utf-8")
    return ""


def out_of_scope(model_type: str) -> str | None:
    """Why this type is not a decoder-only attention model, read from its config and modeling code; else None."""
    from transformers import CONFIG_MAPPING, AutoConfig

    try:
        config = AutoConfig.for_model(model_type)
    except Exception:  # noqa: BLE001 - the class still names its parts; a config that cannot be made at all is a
        config = None  # build failure, reported by measure()
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder: config.is_encoder_decoder"
    parts = getattr(config if config is not None else CONFIG_MAPPING[model_type], "sub_configs", None) or {}
    media = sorted(k for k in parts if re.search(r"vision|audio|vq|image|speech", k))
    if media:
        return f"multimodal: sub-configs {', '.join(media)}"
    coders = sorted(k for k in parts if re.search(r"encoder|decoder", k))
    if any("encoder" in k for k in coders) and any("decoder" in k for k in coders):
        return f"encoder-decoder: sub-configs {', '.join(coders)}"
    if config is None:
        return None
    decoder_half = decoder_of_encoder_decoder(modeling_source(model_type),
                                              f"modeling_{model_type.replace('-', '_')}.py")
    if decoder_half:
        return f"encoder-decoder: {decoder_half}"
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, (list, tuple)):
        other = sorted({t for t in layer_types if isinstance(t, str) and not ATTENTION_LAYER_TYPES.match(t)})
        if other:
            return f"non-attention mixer: layer_types hold {', '.join(other)}"
    source = modeling_source(model_type)
    if re.search(r"as a standalone, add `is_decoder=True", source):
        return "encoder: the causal-LM head is a decoder mode (is_decoder=True) of a bidirectional encoder"
    media = causal_lm_media_inputs(source, f"modeling_{model_type.replace('-', '_')}.py")
    if media:
        return f"multimodal: {media}"
    bidirectional = bidirectional_attention(source, config.to_dict(), f"modeling_{model_type.replace('-', '_')}.py")
    if bidirectional:
        return f"encoder: {bidirectional}"
    if re.search(r"generate\([^)]*\bassistant_model=", source):
        return "draft model: it proposes tokens for another model's assisted generation (generate(assistant_model=...))"
    for kind, pattern in NON_ATTENTION_MIXERS.items():
        found = re.search(pattern, source)
        if found:
            return f"non-attention mixer: {kind} ({found.group(0)} in the modeling code)"
    return None


def decoder_of_encoder_decoder(source: str, file: str) -> str | None:
    """The causal-LM class declares itself the decoder taken out of an encoder-decoder: its __init__ sets
    `config.is_encoder_decoder = False` on the config it is given (TrOCR's, whose config is only the decoder's and
    so does not say is_encoder_decoder itself; Bart's and Marian's do the same, out of scope by their configs)."""
    if not source:
        return None
    for cls in ast.parse(source).body:
        if not (isinstance(cls, ast.ClassDef) and re.search(r"(ForCausalLM|LMHeadModel)$", cls.name)):
            continue
        for node in ast.walk(cls):
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value is False
                    and any(isinstance(t, ast.Attribute) and t.attr == "is_encoder_decoder" for t in node.targets)):
                return (f"its decoder half: {cls.name}.__init__ sets config.is_encoder_decoder = False "
                        f"({file}:{node.lineno})")
    return None


def causal_lm_media_inputs(source: str, file: str) -> str | None:
    """The tool's own reading (scaffold.detect.forms): every causal-LM class of the file takes image, audio or
    video inputs (Fuyu's image_patches, which its vision_embed_tokens projects into the token sequence)."""
    from scaffold.detect import forms

    found = forms.media_inputs({file: source}, {}) if source else None
    return found.removeprefix("a multimodal model: ").split(", inputs a text")[0] if found else None


def bidirectional_attention(source: str, config: dict, file: str) -> str | None:
    """The tool's own reading (scaffold.detect.forms): a causal mask built only under a config condition that the
    type's default config leaves false (XLM's causal, XLNet's attn_type), or lifted at every key by a term every
    caller fills with ones (CPM-Ant's context); the part before its consequence."""
    from scaffold.detect import forms

    found = source and (forms.bidirectional_by_config({file: source}, config)
                        or forms.bidirectional_by_fill({file: source}, config))
    return found.split(", so every position")[0].replace("config.json's", "the default config's") if found else None


def overrides_for(model_type: str) -> dict:
    """BASE additions for this type: MoE sizes shrunk where the config has them, then the family's own."""
    from transformers import AutoConfig

    from scaffold.tiny import BASE, tiny_sizes

    family = FAMILY_OVERRIDES.get(model_type, ({}, ""))[0]
    config = AutoConfig.for_model(model_type, **tiny_sizes(family))
    shrink = {k: v for k, v in MOE_SHRINK.items() if isinstance(getattr(config, k, None), int)}
    # Default token ids index the family's real vocabulary; in the tiny one they would lie outside the embedding.
    tokens = {k: v for k, v in TOKENS.items()
              if isinstance(getattr(config, k, None), int) and getattr(config, k) >= BASE["vocab_size"]}
    return {**shrink, **tokens, **family}


def architecture_for(class_name: str) -> str:
    """A class name vLLM has no model for, so only a generated port can serve the checkpoint. It ends in
    ForCausalLM whatever the family's own suffix (GPT2LMHeadModel, ...): the name is the rename's, and the
    port is judged on the checkpoint's layout, not on what transformers once called its head class."""
    stem = re.sub(r"(ForCausalLM|WithLMHeadModel|LMHeadModel|ModelWithLMHead|Decoder)$", "", class_name)
    return f"Catalogue{stem}ForCausalLM"


def build(model_type: str, class_name: str, out: Path) -> subprocess.CompletedProcess:
    """Build the tiny checkpoint in a child process (bounded in time; a family's failure stays its own)."""
    try:
        overrides = overrides_for(model_type)
    except Exception as exc:  # noqa: BLE001 - a config transformers cannot make at tiny sizes is this type's result
        return subprocess.CompletedProcess([], 1, "", " ".join(f"tiny config: {type(exc).__name__}: {exc}".split()))
    code = ("import sys, json; from scaffold.tiny import build_tiny; "
            "build_tiny(sys.argv[1], sys.argv[2], architecture=sys.argv[3], overrides=json.loads(sys.argv[4]))")
    args = [sys.executable, "-c", code, model_type, str(out), architecture_for(class_name),
            json.dumps(overrides)]
    try:
        return subprocess.run(args, check=False, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 124, "", f"timed out after {BUILD_TIMEOUT_S} s")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def native_refusal(stderr: str, ckpt: Path) -> str:
    """The native generator's reason from `scaffold new`'s one-paragraph refusal, checkpoint path hidden."""
    message = " ".join(stderr.split()).replace(str(ckpt), "CKPT")
    found = re.search(r"Native port: (.*?)(?:; the generator cannot express this yet|\. vLLM's transformers backend"
                      r"|\. Transformers backend:)", message)
    return found.group(1) if found else message.removeprefix("error: ").removeprefix("CKPT/config.json: ")


def module_of(tensor: str) -> str:
    """'model.layers.1.mlp.shared_experts.down_proj.weight' -> 'mlp.shared_experts' (a layer's module, not a file's)."""
    path = re.sub(r"\.\d+", "", tensor.strip()).split("layers.", 1)[-1]
    path = re.sub(r"\.(weight|bias)$", "", path)
    return re.sub(r"\.\w+_proj$", "", path)


def feature_of(reason: str) -> str:
    """The blocking feature a refusal names, with the family-specific parts (tensor names' layer numbers,
    shapes, values) folded so that the same feature counts once across families."""
    tensors = re.search(r"tensor\(s\) that no part of the port computes with \((.*?)\)", reason)
    if tensors:
        leaves = sorted({module_of(t) for t in tensors.group(1).split(",")})
        return "unconsumed tensors: " + ", ".join(leaves[:3]) + (", ..." if len(leaves) > 3 else "")
    reason = re.sub(r"^CKPT/\S+: ", "", reason)
    while re.search(r"\([^()]*\)", reason):  # examples, where stored (nested too)
        reason = re.sub(r"\s*\([^()]*\)", "", reason)
    reason = reason.split(";")[0]  # what both implementations know
    reason = re.sub(r"\[[\d, ]+\]", "[..]", reason)
    reason = re.sub(r"'[^']*'", "'..'", reason)
    return re.sub(r"\b\d+(\.\d+)?\b(?!-D)", "N", reason).rstrip(".")[:160]


def port(ckpt: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scaffold.cli", "new", str(ckpt), "-o", str(out), "--force"],
                          check=False, capture_output=True, text=True)


def verify(out: Path) -> dict:
    """scaffold verify --json's report (or one that says why there is none)."""
    proc = subprocess.run([sys.executable, "-m", "scaffold.cli", "verify", str(out), "--json"],
                          check=False, capture_output=True, text=True)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return {"passed": False, "checks": [], "error": last_line(proc.stderr) or f"exit {proc.returncode}"}


def measure(model_type: str, class_name: str, workdir: Path, *, run_verify: bool) -> dict:
    """One catalogue row: out of scope, failed to build, refused (with the feature), ports, parity or fail."""
    row = {"model_type": model_type, "class": class_name, "measured": today(), "status": "", "detail": "",
           "feature": None, "max_delta": None, "greedy": None}
    reason = out_of_scope(model_type)
    if reason:
        return {**row, "status": "out of scope", "detail": reason}
    ckpt = workdir / f"ckpt-{model_type}"
    built = build(model_type, class_name, ckpt)
    if built.returncode != 0:
        return {**row, "status": "build failed", "detail": " ".join(last_line(built.stderr).split())[:300]}
    out = workdir / f"port-{model_type}"
    ported = port(ckpt, out)
    if ported.returncode != 0:
        reason = native_refusal(ported.stderr, ckpt)
        return {**row, "status": "refused", "detail": reason[:600], "feature": feature_of(reason)}
    if not run_verify:
        return {**row, "status": "ports", "detail": "ports; parity not measured yet"}
    report = verify(out)
    checks = {c["name"]: c for c in report["checks"]}
    logp = checks.get("parity: log-probabilities", {})
    greedy = checks.get("parity: greedy continuation", {})
    row.update(max_delta=logp.get("max_delta"), greedy=greedy.get("detail"))
    if report["passed"] and row["max_delta"] is not None and row["max_delta"] <= TOLERANCE:
        return {**row, "status": "parity"}
    failed = "; ".join(f"{c['name']}: {c['detail']}" for c in report["checks"] if c["status"] == "FAIL")
    return {**row, "status": "fail", "detail": (failed or report.get("error", ""))[:600]}


# ------------------------------------------------------------------ the document
def recorded_rows(doc: Path = CATALOGUE) -> dict[str, dict]:
    """The rows the document carries (empty when there is none)."""
    return recorded_results(doc, MARK)


def merge(recorded: dict[str, dict], fresh: dict[str, dict], order: list[str]) -> dict[str, dict]:
    """This run's rows over the recorded ones; a port-only row keeps an earlier parity figure of the same type
    (the port still builds, and the figure says when it was measured). Types no longer installed go."""
    merged = dict(recorded)
    for name, row in fresh.items():
        old = recorded.get(name)
        if row["status"] == "ports" and old and old["status"] in ("parity", "fail"):
            continue
        merged[name] = row
    for row in merged.values():  # the feature is read from the refusal, so a better reading applies to old rows
        row["feature"] = feature_of(row["detail"]) if row["status"] == "refused" else None
    return {name: merged[name] for name in order if name in merged}


def totals(rows: dict[str, dict]) -> dict:
    """The counts the document states, from its rows."""
    status = Counter(row["status"] for row in rows.values())
    in_scope = len(rows) - status["out of scope"]
    return {
        "types": len(rows), "in_scope": in_scope, "parity": status["parity"], "fail": status["fail"],
        "ports": status["ports"], "refused": status["refused"], "build_failed": status["build failed"],
        "out_of_scope": status["out of scope"],
        "by_feature": Counter(r["feature"] for r in rows.values() if r["status"] == "refused").most_common(),
        "by_scope": Counter(scope_kind(r["detail"]) for r in rows.values()
                            if r["status"] == "out of scope").most_common(),
    }


def scope_kind(detail: str) -> str:
    return detail.split(":")[0]


def summary_lines(t: dict) -> list[str]:
    scopes = ", ".join(f"{k} {n}" for k, n in t["by_scope"]) or "none"
    return [
        f"**{t['parity']} of {t['in_scope']} in-scope model types at parity** ({t['types']} types in the catalogue).",
        f"Ported but not at parity: {t['fail']}. Ported, parity not measured yet: {t['ports']}.",
        f"Failed to build from a tiny config: {t['build_failed']}.",
        f"Refused by the native generator: {t['refused']}, by {len(t['by_feature'])} features (ranked below).",
        f"Out of scope: {t['out_of_scope']} ({scopes}).",
    ]


def cell(text) -> str:
    return str(text if text not in (None, "") else "-").replace("|", "\\|").replace("\n", " ")


def render(rows: dict[str, dict]) -> str:
    t = totals(rows)
    lines = [
        "# The transformers catalogue",
        "",
        "Generated by `python scripts/catalogue.py` (it runs `pytest tests/test_catalogue.py`); do not edit.",
        "One row per `model_type` of the installed transformers' causal-LM mapping. Each in-scope type is a tiny",
        "random-weight checkpoint (scaffold.tiny BASE sizes; MoE shrunk to 4 experts of 64 rows, top-2; token ids",
        "outside the 256-token vocabulary set to 0/1/2; the family overrides below) with `architectures` renamed",
        "(`Catalogue<Name>ForCausalLM`) so vLLM has no class for it, run through `scaffold new`",
        "and, where it ports, `scaffold verify --json` (float32, max |dlogp| over the top-20 tokens at every",
        f"position, greedy continuations; parity: within {TOLERANCE:.0e} and identical). `measured` is the UTC date",
        "the row was last measured. Rows `ports` have a port whose parity was not measured yet.",
        "",
        *summary_lines(t),
        "",
        "## What blocks the refused types, most types first",
        "",
        "| types | feature the refusal names | model types |",
        "| --- | --- | --- |",
        *(f"| {n} | {cell(f)} | {', '.join(k for k, r in rows.items() if r['status'] == 'refused' and r['feature'] == f)} |"
          for f, n in t["by_feature"]),
        "",
        "## Per-family overrides of the tiny config",
        "",
        "| model_type | overrides | why |",
        "| --- | --- | --- |",
        *(f"| {name} | `{json.dumps(values)}` | {why} |" for name, (values, why) in FAMILY_OVERRIDES.items()),
        "",
        "## Every model type",
        "",
        "| model_type | class | status | max \\|dlogp\\| | greedy | detail | measured |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in rows.items():
        delta = f"{row['max_delta']:.2e}" if row["max_delta"] is not None else "-"
        detail = "; ".join(d for d in (row["detail"], BACKEND_WRONG.get(name)) if d)
        lines.append(f"| {name} | {row['class']} | {row['status']} | {delta} | {cell(row['greedy'])} | "
                     f"{cell(detail)} | {row['measured']} |")
    lines += ["", MARK + json.dumps(rows, sort_keys=True).replace("--", "-\\u002d") + " -->", ""]
    return "\n".join(lines)
