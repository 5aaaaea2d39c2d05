"""Names: the architecture class, model_type, and the names the port will use."""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import lru_cache
from pathlib import Path

from scaffold.checkpoint import Checkpoint
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.spec import IDENTIFIER, Source, Spec

SUFFIX = "ForCausalLM"


AUTO_TABLES = ("CONFIG_MAPPING_NAMES", "SPECIAL_MODEL_TYPE_TO_MODULE_NAME")


@lru_cache(maxsize=1)
def _auto_tables() -> dict[str, dict[str, str]]:
    """The (key, value) tables AUTO_TABLES of transformers' auto module, read from its source (parsed once)
    without importing it."""
    tables: dict[str, dict[str, str]] = {table: {} for table in AUTO_TABLES}
    found = importlib.util.find_spec("transformers")
    if found is None or not found.submodule_search_locations:
        return tables
    auto = Path(next(iter(found.submodule_search_locations))) / "models" / "auto"
    for path in (auto / "configuration_auto.py", auto / "auto_mappings.py"):  # the tables moved in transformers 5.x
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError):
            continue
        for node in ast.walk(tree):
            table = next((t.id for t in getattr(node, "targets", ()) if isinstance(t, ast.Name) and t.id in tables),
                         None) if isinstance(node, ast.Assign) else None
            if table is not None:
                tables[table].update(
                    (elt.elts[0].value, elt.elts[1].value)
                    for elt in ast.walk(node.value)
                    if isinstance(elt, ast.Tuple) and len(elt.elts) == 2
                    and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elt.elts)
                )
    return tables


def transformers_model_types() -> frozenset[str]:
    """model_types that the installed transformers knows, read from its source without importing it."""
    return frozenset(_auto_tables()["CONFIG_MAPPING_NAMES"])


def transformers_module_name(model_type: str) -> str:
    """The folder under transformers/models that defines `model_type` (gemma3_text lives in gemma3)."""
    return _auto_tables()["SPECIAL_MODEL_TYPE_TO_MODULE_NAME"].get(model_type, model_type.replace("-", "_"))


def snake(name: str) -> str:
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    where = ckpt.config_file
    archs = ckpt.config.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise CheckpointError("config.json needs 'architectures', a list naming the model class.", where)
    arch = archs[0]
    if not IDENTIFIER.match(arch):
        raise CheckpointError(
            f"the architecture {arch!r} is not a Python class name; refusing to put it into generated code.",
            where,
        )
    if not arch.endswith(SUFFIX) or arch == SUFFIX:
        raise UnsupportedArchitecture(
            f"the architecture {arch!r} is not a causal language model (a class named ...{SUFFIX}); "
            "scaffold ports text decoders.",
            where,
        )
    model_type = ckpt.config.get("model_type")
    if not isinstance(model_type, str) or not re.match(r"^[A-Za-z0-9_\-]+$", model_type):
        raise CheckpointError(f"config.json's 'model_type' must be a simple name, not {model_type!r}.", where)
    prefix = arch[: -len(SUFFIX)]
    spec.set("architecture", arch, Source("config", "config.json architectures[0]"))
    spec.set("model_type", model_type, Source("config", "config.json model_type"))
    spec.set("class_prefix", prefix, Source("derived", f"{arch} without '{SUFFIX}'"))
    spec.set("package", snake(prefix).strip("_") + "_vllm", Source("derived", "snake_case of the class prefix"))
    known = model_type in transformers_model_types()
    spec.set(
        "register_config",
        not known,
        Source("derived", f"model_type {model_type!r} is {'known' if known else 'unknown'} to transformers"),
    )
    spec.set("config_class", "" if known else f"{prefix}Config", Source("derived", "class prefix + 'Config'"))
    dtype = ckpt.config.get("torch_dtype") or ckpt.config.get("dtype")
    if isinstance(dtype, str) and dtype in ("float32", "float16", "bfloat16"):
        spec.set("dtype", dtype, Source("config", "config.json torch_dtype"))
    else:
        first = next(iter(ckpt.tensors.values())).dtype
        spec.set("dtype", {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[first],
                 Source("tensor", "dtype of the first tensor"))
    if ckpt.tokenizer.vocab_size is not None:
        spec.set("tokenizer_vocab_size", ckpt.tokenizer.vocab_size, Source("tokenizer", ckpt.tokenizer.source))
