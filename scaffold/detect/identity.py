"""Names: the architecture class, model_type, and the names the port will use."""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import lru_cache
from pathlib import Path

from scaffold.checkpoint import MAX_NAME_CHARS, MODEL_TYPE, Checkpoint
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.spec import IDENTIFIER, Source, Spec

SUFFIX = "ForCausalLM"
AUTO_CAUSAL_LM = "AutoModelForCausalLM"


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
    """FooBARBaz -> foo_bar_baz, in one pass: a regex with a `[A-Z]+` run backtracks quadratically on long
    capital runs, and names come from the checkpoint."""
    out = []
    for i, char in enumerate(name):
        if "A" <= char <= "Z" and i > 0:
            before, after = name[i - 1], name[i + 1: i + 2]
            if before.islower() or before.isdigit() or ("A" <= before <= "Z" and after.islower()):
                out.append("_")
        out.append(char.lower())
    return "".join(out)


def package_name(prefix: str, model_type: str) -> tuple[str, str]:
    """The package name a port of `prefix`ForCausalLM gets, and how it was derived.

    It is also the distribution name (with - for _), so it must start and end with a
    letter or digit (PEP 508) and be an identifier: snake_case of the class prefix, else
    of the model_type, else a neutral name.
    """
    from_type = f"snake_case of model_type (the class prefix {prefix!r} gives no name)"
    for base, how in ((snake(prefix), "snake_case of the class prefix"),
                      (re.sub(r"[^a-z0-9]+", "_", model_type.lower()), from_type)):
        base = base.strip("_")
        if base[:1].isalpha() and base.isascii():
            return base + "_vllm", how
    return "port_vllm", f"neither the class prefix {prefix!r} nor model_type {model_type!r} gives a name"


def causal_lm_class(ckpt: Checkpoint) -> str | None:
    """The class config.json's auto_map names for AutoModelForCausalLM ("modeling_x.Class" or
    "repo--modeling_x.Class"), if any: remote code says there which class is the causal LM, whatever its name."""
    auto_map = ckpt.config.get("auto_map")
    entry = auto_map.get(AUTO_CAUSAL_LM) if isinstance(auto_map, dict) else None
    if isinstance(entry, list) and entry:  # tokenizers list (slow, fast); a model class is a string
        entry = entry[0]
    if not isinstance(entry, str):
        return None
    name = entry.rsplit(".", 1)[-1]
    # Not a class name: it names nothing the port could be, so it says nothing (architectures[0], checked on its
    # own, is what goes into generated code).
    return name if len(name) <= MAX_NAME_CHARS and IDENTIFIER.fullmatch(name) else None


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    where = ckpt.config_file
    archs = ckpt.config.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise CheckpointError("config.json needs 'architectures', a list naming the model class.", where)
    arch = archs[0]
    if len(arch) > MAX_NAME_CHARS or not IDENTIFIER.fullmatch(arch):
        raise CheckpointError(
            f"the architecture {arch[:80]!r} is not a Python class name; refusing to put it into generated code.",
            where,
        )
    causal = causal_lm_class(ckpt)
    if causal is not None and causal != arch:
        raise UnsupportedArchitecture(
            f"config.json's auto_map names {causal!r} as the causal language model (AutoModelForCausalLM) but "
            f"architectures[0] is {arch!r}; scaffold ports the causal language model.",
            where,
        )
    if causal is None and (not arch.endswith(SUFFIX) or arch == SUFFIX):
        raise UnsupportedArchitecture(
            f"the architecture {arch!r} is not a causal language model (a class named ...{SUFFIX}, or the class "
            "config.json's auto_map names for AutoModelForCausalLM); scaffold ports text decoders.",
            where,
        )
    model_type = ckpt.config.get("model_type")
    if not isinstance(model_type, str) or not MODEL_TYPE.fullmatch(model_type):
        raise CheckpointError(f"config.json's 'model_type' must be a simple name, not {model_type!r}.", where)
    spec.set("architecture", arch, Source("config", "config.json architectures[0]"))
    spec.set("model_type", model_type, Source("config", "config.json model_type"))
    if arch.endswith(SUFFIX) and arch != SUFFIX:
        prefix = arch[: -len(SUFFIX)]
        spec.set("class_prefix", prefix, Source("derived", f"{arch} without '{SUFFIX}'"))
    else:
        # auto_map's causal LM under another name (QWenLMHeadModel): the port's classes are named from it.
        prefix = re.sub(r"(ForConditionalGeneration|LMHeadModel|ForCausalLM)\Z", "", arch) or arch
        spec.set("class_prefix", prefix, Source("derived", f"{arch} (auto_map's AutoModelForCausalLM) without "
                                                           f"its suffix"))
    package, how = package_name(prefix, model_type)
    spec.set("package", package, Source("derived", how))
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
