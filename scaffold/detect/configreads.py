"""The config keys the modeling code reads (`config.key`, `self.config.key`, `getattr(config, "key", ...)`).

Read from the syntax tree of the checkpoint's own modeling files, else transformers' modeling file for the
model type; never run. `scaffold verify` compares them with the keys the spec accounts for: a key the code
reads that no spec field came from (a rotated fraction or a multiplier under the model's own name) may
change what the model computes without the port knowing.
"""

from __future__ import annotations

import ast
import re

from scaffold.checkpoint import Checkpoint
from scaffold.detect.codekeys import attribute_map
from scaffold.detect.sourcecode import modeling_sources, parse, subtree

# Keys that do not change what a decoder computes at inference: caching and output switches, token ids,
# initialisation and training settings, the attention implementation.
INERT = frozenset({
    "use_cache", "output_attentions", "output_hidden_states", "use_return_dict", "return_dict", "pad_token_id",
    "bos_token_id", "eos_token_id", "initializer_range", "gradient_checkpointing", "_attn_implementation",
    "torch_dtype", "dtype", "is_encoder_decoder", "pretraining_tp", "_name_or_path", "architectures",
    "auto_map", "model_type", "transformers_version", "use_flash_attn", "num_labels", "problem_type",
    "_supports_flash_attn", "_output_attentions", "is_decoder", "add_cross_attention", "chunk_size_feed_forward",
    "use_sliding_window",  # the port reads sliding_window itself; the flag only says whether it is set
    "max_length", "z_loss_weight", "quantization_config", "attn_implementation", "softmax_in_fp32",
    "attention_softmax_in_fp32", "use_cache_kernel",
})
INERT_PATTERN = re.compile(r"(dropout|_pdrop|^init_|initializer|^fp16$|^bf16$|^fp32$|checkpointing|^_)")
# Heads for other tasks: the keys only they read do not concern the causal LM.
OTHER_HEADS = re.compile(r"For(SequenceClassification|TokenClassification|QuestionAnswering|MaskedLM|"
                         r"MultipleChoice|Pretraining|ImageClassification)\w*\Z")


def _is_config(node: ast.AST) -> bool:
    return ((isinstance(node, ast.Name) and node.id == "config")
            or (isinstance(node, ast.Attribute) and node.attr == "config"))


def config_reads(sources: dict[str, str]) -> dict[str, str]:
    """key -> "FILE:LINE" of its first read, over the modeling files (configuration files are left out:
    they define the keys, they do not read them)."""
    found: dict[str, str] = {}
    for name, text in sources.items():
        if name.rsplit("/", 1)[-1].startswith("configuration_"):
            continue
        tree = parse(text)
        if tree is None:
            continue
        for cls in [n for n in tree.body if isinstance(n, ast.ClassDef)] + [tree]:
            if isinstance(cls, ast.ClassDef) and OTHER_HEADS.search(cls.name):
                continue
            body = cls.body if isinstance(cls, ast.ClassDef) else [n for n in tree.body
                                                                     if not isinstance(n, ast.ClassDef)]
            for stmt in body:
                for node in subtree(stmt):
                    key = None
                    if isinstance(node, ast.Attribute) and _is_config(node.value):
                        key = node.attr
                    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                          and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                          and _is_config(node.args[0]) and isinstance(node.args[1], ast.Constant)
                          and isinstance(node.args[1].value, str)):
                        key = node.args[1].value
                    if key is not None and key not in found:
                        found[key] = f"{name}:{node.lineno}"
    return found


def accounted_keys(provenance: dict) -> set[str]:
    """The words of every field's provenance (its detail and its run-time expression): the config keys the
    spec's values came from, or that were found absent."""
    return {w for source in provenance.values() for w in re.findall(r"\w+", f"{source.detail} {source.expr or ''}")}


def unaccounted_reads(ckpt: Checkpoint, accounted: set[str]) -> dict[str, str]:
    """The keys the code reads that are neither accounted for nor inert, with where each is read. A name of the
    config class's attribute_map is the key it is stored under (GLM-5's num_local_experts, n_routed_experts)."""
    reads = config_reads(modeling_sources(ckpt))
    aliases = attribute_map(ckpt)
    return {key: where for key, where in sorted(reads.items())
            if key not in accounted and aliases.get(key) not in accounted and key not in INERT
            and not INERT_PATTERN.search(key) and not callable(getattr(dict, key, None))}
