"""Read a Hugging Face checkpoint without loading tensor data or running its code.

This module reads config.json, the safetensors index, the JSON header of every
shard, the tokenizer files and the checkpoint's own Python sources as text. It
imports neither torch nor transformers, so `scaffold inspect` answers in well
under a second even on checkpoints of hundreds of gigabytes.

Everything in a checkpoint is untrusted. Every file read must be a regular file
inside the checkpoint folder (or, for a Hugging Face cache snapshot, in the blob
store of the same repository); JSON must be plain, finite in the values the
generator reads, and not nested absurdly deep; tensor names must be plain ASCII
names; shard headers must describe their data exactly, as safetensors requires.
Anything else is a CheckpointError naming the file, never a traceback.
"""

from __future__ import annotations

import ast
import json
import keyword
import math
import os
import re
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from scaffold import quantized
from scaffold.errors import CheckpointError, NonFloatTensor, UnsupportedArchitecture

# Bytes per element of the safetensors dtypes a port can load.
DTYPE_SIZES = {"F32": 4, "F16": 2, "BF16": 2}
# Dtypes that exist in the format but mean quantized or non-float weights.
# Integer dtypes a table of the code may be stored in (DeepSeek-V4's tid2eid: I64), read where the caller names the
# table (`integer_tables`: the last component of its tensors' names), never as a weight.
INTEGER_DTYPES = {"I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1}
# A boolean buffer the code registers and saves with the weights (CodeGen-style `attn.causal_mask`), read where the
# caller names it (`integer_tables` too), never as a weight: the port recomputes it.
MASK_DTYPES = {"BOOL": 1}
KNOWN_UNSUPPORTED_DTYPES = {
    "F64", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0",
    "F6_E2M3", "F6_E3M2", "F4", "C64",
}

# Bounds on what the reader accepts, each far above what real checkpoints reach and low
# enough that the work they allow stays within seconds and a few hundred MB. Each is
# checked before the work it bounds (parsing, a loop over a count).
# Real config.json files are < 100 KB; Qwen3-235B's index is ~3 MB (~19,000 tensors);
# the largest real tokenizer.json files are ~30 MB (Gemma 3: 33 MB).
MAX_JSON_BYTES = {"config": 2**20, "index": 32 * 2**20, "tokenizer": 64 * 2**20}
# Upper bound on the values a JSON file may hold, counted from its separators and
# brackets before it is parsed: the parsed objects cost ~50-100 bytes each, however
# small their text, so a size bound alone does not bound memory. An index holds two per
# tensor (MAX_TENSORS below); a real tokenizer.json of 30 MB holds ~2M.
MAX_JSON_VALUES = {"config": 20_000, "index": 400_000, "tokenizer": 4_000_000}
# Shard headers: safetensors allows 100 MB; a real one lists a few thousand tensors in < 1 MB.
MAX_HEADER_BYTES = 16 * 2**20
MAX_TENSORS = 150_000  # DeepSeek-V3 holds ~92,000 (with its FP8 scales), Kimi-K2 in BF16 ~70,000
MAX_SHARDS = 10_000  # the largest real checkpoints have a few hundred
# Checkpoint Python code: the largest modeling file transformers ships is ~190 KB
# (~30,000 tokens); a syntax tree costs ~1 KB per node, so the token count bounds it.
MAX_SOURCE_BYTES = 2**20
MAX_SOURCES_BYTES = 4 * 2**20
MAX_SOURCE_TOKENS = 400_000
MAX_JSON_DEPTH = 32
# Counts the generator loops over: real decoders have < 200 layers and < 1,000 experts.
MAX_LAYERS = 1024
MAX_EXPERTS = 8192
MAX_NAME_CHARS = 200  # architecture names; real ones are < 50 characters
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "moe_top_k")
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Tensor names: what real checkpoints use. Anything else (quotes, backticks, pipes,
# spaces, control or non-ASCII characters) could break the generated REVIEW.md or
# fool a reader, and never names a tensor the port has a home for.
# Every name pattern is used with fullmatch: `$` would also accept a trailing newline.
TENSOR_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/+\-]{0,511}")
SOURCE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-/]{0,254}\.py")
# What a source-size check counts as a token: a word or one punctuation character
# (an upper bound on Python's tokens, counted in C, in linear time).
_TOKEN = re.compile(r"\w+|[^\w\s]")

# config.json keys the detectors read, with the type each must have when present (null is absent).
POSITIVE_INT_KEYS = (
    "hidden_size", "n_embd", "d_model", "num_hidden_layers", "n_layer", "num_layers", "num_attention_heads",
    "n_head", "num_key_value_heads", "num_kv_heads", "head_dim", "intermediate_size", "n_inner", "ffn_dim",
    "ffn_hidden_size", "vocab_size", "max_position_embeddings", "n_positions",
)
# MLP widths a config may hold one per layer (Gemma-3n's intermediate_size): detect.sizes reads whether the code builds
# each layer's MLP from its own entry, and refuses the list otherwise.
LAYER_LIST_KEYS = ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size")
# Head counts a config may hold one per layer where the checkpoint's code indexes them (OpenELM's num_kv_heads):
# detect.layerheads reads whether each layer's attention is built from its own entry, and refuses the list otherwise.
LAYER_HEAD_KEYS = ("num_attention_heads", "n_head", "num_key_value_heads", "num_kv_heads")
POSITIVE_NUMBER_KEYS = ("rms_norm_eps", "layer_norm_eps", "norm_eps", "layer_norm_epsilon", "rope_theta")
BOOL_KEYS = ("tie_word_embeddings", "use_sliding_window", "attention_bias", "mlp_bias")
STRING_KEYS = ("hidden_act", "hidden_activation", "activation_function", "torch_dtype", "dtype")
OBJECT_KEYS = ("rope_scaling", "rope_parameters", "auto_map", "quantization_config")
MODEL_TYPE = re.compile(r"[A-Za-z0-9_\-]{1,100}")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a shard header describes it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str  # shard file name, relative to the checkpoint

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class TokenizerInfo:
    files: list[str] = field(default_factory=list)
    vocab_size: int | None = None  # number of token ids the tokenizer can emit
    source: str | None = None  # the file the size was read from
    chat_template: bool = False
    pad_token: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None


@dataclass
class Checkpoint:
    """Everything read from a checkpoint folder, as plain data."""

    path: Path
    config: dict
    tensors: dict[str, TensorInfo]
    shards: list[str]
    index_file: str | None
    tokenizer: TokenizerInfo
    sources: dict[str, str]  # file name -> text of the checkpoint's own Python code
    generation_config: dict | None = None

    @property
    def config_file(self) -> Path:
        return self.path / "config.json"

    def tensor(self, name: str) -> TensorInfo | None:
        return self.tensors.get(name)


# ------------------------------------------------------------- files inside
def _allowed_roots(root: Path) -> list[Path]:
    """The checkpoint folder, plus the blob store when it is a Hugging Face cache snapshot.

    The hub cache keeps files as `models--org--name/blobs/<hash>` and links them from
    `models--org--name/snapshots/<revision>/`; those links leave the snapshot folder
    but stay inside the same repository's cache.
    """
    roots = [root]
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        roots.append(root.parent.parent / "blobs")
    return roots


def _inside(root: Path, candidate: Path, what: str, where: Path) -> Path:
    """Resolve `candidate` and refuse it unless it stays inside `root`."""
    try:
        resolved = candidate.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise CheckpointError(f"{what} cannot be resolved ({exc}).", where) from None
    for allowed in _allowed_roots(root):
        try:
            resolved.relative_to(allowed)
            return resolved
        except ValueError:
            continue
    raise CheckpointError(
        f"{what} points outside the checkpoint ({resolved}); a checkpoint may only name files inside its own folder.",
        where,
    )


def _regular_file(root: Path, path: Path, what: str, where: Path | None = None) -> Path:
    """`path`, checked to be a regular file inside the checkpoint (not a FIFO, device or folder)."""
    resolved = _inside(root, path, what, where or path)
    try:
        mode = resolved.stat().st_mode
    except FileNotFoundError:
        raise CheckpointError(f"{what} is missing.", path) from None
    except OSError as exc:
        raise CheckpointError(f"{what} cannot be read ({exc.strerror}).", path) from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{what} is not a regular file.", path)
    return resolved


def _shard_name(name: object, where: Path) -> str:
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"the weight map names a shard as {name!r}, which is not a file name.", where)
    if os.path.isabs(name) or name.startswith("/") or "\\" in name or re.match(r"^[A-Za-z]:", name):
        raise CheckpointError(f"the weight map names the absolute path {name!r}; shards must be relative.", where)
    if ".." in Path(name).parts:
        raise CheckpointError(f"the weight map names {name!r}, a path that leaves the checkpoint.", where)
    if "\x00" in name or not name.isprintable():
        raise CheckpointError(f"the weight map names the shard {name!r}, which holds control characters.", where)
    return name


def _tensor_name(name: object, where: Path) -> str:
    if not isinstance(name, str) or not TENSOR_NAME.fullmatch(name):
        raise CheckpointError(
            f"the tensor name {name!r} is not a plain name (ASCII letters, digits and _ . : / + -, at most "
            "512 characters); refusing it.",
            where,
        )
    return name


# ------------------------------------------------------------------- JSON
def _no_duplicates(what: str, path: Path):
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        out: dict = dict(pairs)
        if len(out) == len(pairs):  # the common case, at C speed: no key twice
            return out
        out = {}
        for key, value in pairs:
            if key in out:
                raise CheckpointError(
                    f"{what} names the key {key!r} twice; which one is meant is ambiguous.", path
                )
            out[key] = value
        return out

    return hook


def _depth_and_text(value: Any, what: str, path: Path) -> None:
    """Refuse absurd nesting and strings that are not valid Unicode (lone surrogates)."""
    _depth(value, what, path, 0)
    try:  # every string at once, in C; the walk below only runs to name the string at fault
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        _surrogates(value, what, path)


def _depth(value: Any, what: str, path: Path, depth: int) -> None:
    """The walk visits containers only: a value (or key) inside a container at depth d is at depth d + 1."""
    if depth > MAX_JSON_DEPTH or (depth == MAX_JSON_DEPTH and value):
        raise CheckpointError(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep.", path)
    for item in value.values() if isinstance(value, dict) else value:
        if isinstance(item, (dict, list)):
            _depth(item, what, path, depth + 1)


def _surrogates(value: Any, what: str, path: Path) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise CheckpointError(
                f"{what} holds the string {value[:60]!r}, which has an unpaired surrogate: it is not valid "
                "Unicode.",
                path,
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _surrogates(key, what, path)
            _surrogates(item, what, path)
    elif isinstance(value, list):
        for item in value:
            _surrogates(item, what, path)


def _bounded_values(text: str, what: str, kind: str, path: Path) -> None:
    """Refuse, before parsing, a JSON text that may hold more values than MAX_JSON_VALUES[kind].

    Every value but the last of a container is followed by a comma and every key by a
    colon, so their count bounds the objects json.loads would build, up to the last values
    of nested containers, which the nesting limit bounds (strings holding these characters
    only make the bound looser). Brackets are not counted: absurd nesting gets its own error.
    """
    count = text.count(",") + text.count(":")
    if count > MAX_JSON_VALUES[kind]:
        raise CheckpointError(
            f"{what} may hold about {count} JSON values, more than the {MAX_JSON_VALUES[kind]} allowed.", path
        )


def read_json(path: Path, what: str, *, kind: str = "config", strict: bool = True, root: Path | None = None) -> dict:
    """A JSON object from `path`; CheckpointError for anything else.

    strict: refuse duplicate keys, deep nesting and invalid Unicode (config.json, the
    index, generation_config.json); tokenizer files are only required to parse.
    """
    source = _regular_file(root, path, what) if root is not None else path
    try:
        size = source.stat().st_size
        if size > MAX_JSON_BYTES[kind]:
            raise CheckpointError(f"{what} is {size} bytes, more than the {MAX_JSON_BYTES[kind]} allowed.", path)
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointError(f"{what} is missing.", path) from None
    except IsADirectoryError:
        raise CheckpointError(f"{what} is a folder, not a file.", path) from None
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{what} is not UTF-8 text (byte {exc.start}).", path) from None
    except OSError as exc:
        raise CheckpointError(f"{what} cannot be read ({exc.strerror or exc}).", path) from None
    _bounded_values(text, what, kind, path)
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates(what, path) if strict else None)
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"{what} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}).", path
        ) from None
    except RecursionError:
        raise CheckpointError(f"{what} is nested too deeply to read.", path) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise CheckpointError(f"{what} is not valid JSON ({exc}).", path) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{what} must hold a JSON object, not {type(data).__name__}.", path)
    if strict:
        _depth_and_text(data, what, path)
    return data


# ----------------------------------------------------------- config values
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _short_list(values: list) -> str:
    """The list as Python writes it, at most 8 items, each cut to 24 characters (a 4000-digit number is no message)."""
    write = repr if len(values) <= 8 else str
    items = [text if len(text := write(v)) <= 24 else text[:20] + "..." for v in values[:8]]
    return f"[{', '.join(items)}" + ("]" if len(values) <= 8 else f", ... {len(values)} values]")


def per_layer_reads(sources: dict[str, str], key: str) -> list[str]:
    """Where the checkpoint's code indexes `config.KEY` (or `self.config.KEY`), as "FILE:LINE: CODE in CLASS.METHOD"
    (OpenELM's attention: `q_heads = config.num_query_heads[layer_idx]`): what a refusal of a per-layer size names."""
    found = []
    for name, text in sorted(sources.items()):
        try:
            tree = ast.parse(text)
        except (SyntaxError, RecursionError, MemoryError, ValueError):
            continue
        scopes: list[tuple[ast.AST, str]] = [(tree, "")]
        while scopes:
            node, scope = scopes.pop()
            for child in ast.iter_child_nodes(node):
                inner = f"{scope}.{child.name}".lstrip(".") if isinstance(
                    child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) else scope
                if (isinstance(child, ast.Subscript) and isinstance(child.value, ast.Attribute)
                        and child.value.attr == key
                        and ast.unparse(child.value.value) in ("config", "self.config")):
                    found.append((name, child.lineno, f"{name}:{child.lineno}: {ast.unparse(child)}"
                                  + (f" in {scope}" if scope else "")))
                scopes.append((child, inner))
    return [text for _name, _line, text in sorted(found)]


def validate_config(config: dict, where: Path, sources: Callable[[], dict[str, str]] | None = None) -> None:
    """Types of the config.json values the generator reads; null counts as absent.

    A value of the wrong type would otherwise surface as an exception deep in a
    detector. Keys the generator does not read may hold anything JSON allows.
    `sources`: gives the checkpoint's code, read only to name where it indexes a size given per layer.
    """

    def bad(key: str, must: str) -> CheckpointError:
        return CheckpointError(f"config key {key!r} must be {must}, not {config[key]!r}.", where)

    for key in POSITIVE_INT_KEYS:
        value = config.get(key)
        if isinstance(value, list) and value and all(_is_int(v) and v > 0 for v in value):
            if key in LAYER_LIST_KEYS:
                continue  # Gemma-3n's intermediate_size: the sizes detector ports it where the code reads it per layer
            try:
                reads = per_layer_reads(sources() if sources else {}, key)
            except CheckpointError:  # unreadable code: the refusal names the config key alone
                reads = []
            if key in LAYER_HEAD_KEYS and reads:
                continue  # OpenELM's num_kv_heads: detect.layerheads ports it where the attention reads it per layer
            raise UnsupportedArchitecture(
                f"per-layer sizes: config key {key!r} holds one value per layer ({_short_list(value)}), "
                + (f"which the code reads per layer ({'; '.join(reads[:3])}), " if reads else "")
                + "where the port builds every layer from one value.", where)
        if value is not None and (not _is_int(value) or value <= 0):
            raise bad(key, "a positive integer")
    for key in POSITIVE_NUMBER_KEYS:
        value = config.get(key)
        if value is not None and (not _is_number(value) or value <= 0):
            raise bad(key, "a positive finite number")
    for key in BOOL_KEYS:
        value = config.get(key)
        if value is not None and not isinstance(value, bool):
            raise bad(key, "true or false")
    for key in STRING_KEYS:
        value = config.get(key)
        if value is not None and not isinstance(value, str):
            raise bad(key, "a string")
    for key in OBJECT_KEYS:
        value = config.get(key)
        if value is not None and not isinstance(value, dict):
            raise bad(key, "an object")
    if "self" in config:
        raise CheckpointError("config.json has the key 'self', which no config class's __init__ can take "
                              "(transformers passes every key as a keyword argument).", where)
    dunder = sorted(k for k in config if k.startswith("__") and k.endswith("__"))
    if dunder:
        raise CheckpointError(f"config.json has the key {dunder[0]!r}, which would overwrite a Python attribute of "
                              "the config object when transformers sets it.", where)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not MODEL_TYPE.fullmatch(model_type):
        raise CheckpointError(
            f"config key 'model_type' must be a simple name (letters, digits, _ and -), not {model_type!r}.", where
        )
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise CheckpointError(
            f"config key 'architectures' must be a list naming the model class, not {archs!r}.", where
        )
    arch = archs[0]
    if len(arch) > MAX_NAME_CHARS:
        raise CheckpointError(
            f"the architecture name has {len(arch)} characters, more than the {MAX_NAME_CHARS} allowed.", where
        )
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", arch) or keyword.iskeyword(arch):
        raise CheckpointError(
            f"the architecture {arch!r} is not a Python class name; refusing to put it into generated code.", where
        )
    for keys, limit, what in ((LAYER_COUNT_KEYS, MAX_LAYERS, "layers"), (EXPERT_COUNT_KEYS, MAX_EXPERTS, "experts")):
        for key in keys:
            if _is_int(config.get(key)) and config[key] > limit:
                raise CheckpointError(
                    f"config key {key!r} is {config[key]}, more than the {limit} {what} any real decoder has.", where
                )
    layer_types = config.get("layer_types")
    if layer_types is not None and (
        not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types)
    ):
        raise bad("layer_types", "a list of strings, one per layer")
    factor = config.get("partial_rotary_factor")
    if factor is not None and (not _is_number(factor) or not 0 < factor <= 1):
        raise bad("partial_rotary_factor", "a number in (0, 1]")
    for key in ("rope_scaling", "rope_parameters"):
        params = config.get(key)
        if not isinstance(params, dict):
            continue
        for name, value in params.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise CheckpointError(f"config key {key!r} holds {name!r} = {value!r}, not a finite number.", where)
        kind = params.get("rope_type", params.get("type"))
        if kind is not None and not isinstance(kind, str):
            raise CheckpointError(f"config key {key!r} names the rope type {kind!r}, which is not a string.", where)
        theta = params.get("rope_theta")
        if theta is not None and (not _is_number(theta) or theta <= 0):
            raise CheckpointError(f"config key {key!r} holds rope_theta {theta!r}, not a positive number.", where)
    quantized.check_supported(config, where)


# ------------------------------------------------------------ safetensors
def read_safetensors_header(source: Path, path: Path | None = None, checked: dict | None = None,
                            packed: bool = False, integer_tables: frozenset[str] = frozenset()) -> dict[str, dict]:
    """Return the tensor entries of one shard's header, validated as safetensors validates them.

    The entries must be well-formed, name each tensor once, have a supported dtype,
    and tile the data area exactly: sorted by offset, each tensor starts where the
    previous one ends, its size is its shape times its dtype, and the last one ends
    at the end of the file. `source` is read; errors name `path` (the name in the checkpoint).
    `checked`: tensor names already validated (the index's), not checked again.
    """
    path = path or source
    try:
        size = source.stat().st_size
        with source.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(
                    f"the safetensors file is truncated: it has {len(head)} bytes, fewer than the 8 of the header "
                    "length.",
                    path,
                )
            (n,) = struct.unpack("<Q", head)
            if n + 8 > size:
                raise CheckpointError(
                    f"the safetensors header claims {n} bytes but the file has {size}; "
                    "the file is truncated or not a safetensors file.",
                    path,
                )
            if n > MAX_HEADER_BYTES:
                raise CheckpointError(
                    f"the safetensors header is {n} bytes, more than the {MAX_HEADER_BYTES} allowed (real shards "
                    "describe their tensors in well under 1 MB).",
                    path,
                )
            raw = f.read(n)
    except OSError as exc:
        raise CheckpointError(f"the shard cannot be read ({exc.strerror or exc}).", path) from None
    if raw.count(b"{") > MAX_TENSORS + 2:  # an entry per tensor, and __metadata__: bounded before parsing
        raise CheckpointError(f"the safetensors header lists more than the {MAX_TENSORS} tensors allowed.", path)
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates("the safetensors header", path))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CheckpointError("the safetensors header is not valid JSON; the file is corrupt.", path) from None
    if not isinstance(header, dict):
        raise CheckpointError("the safetensors header is not a JSON object; the file is corrupt.", path)
    data_size = size - 8 - n
    entries = {}
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise CheckpointError("the header's __metadata__ must map names to strings; the file is corrupt.",
                                      path)
            continue
        if checked is None or name not in checked:
            _tensor_name(name, path)
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
            raise CheckpointError(f"the header entry of tensor {name!r} is malformed.", path)
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        # A quantization method's integer and FP8 tensors only where config.json says the checkpoint is quantized.
        table = (dtype in INTEGER_DTYPES or dtype in MASK_DTYPES) and name.rsplit(".", 1)[-1] in integer_tables
        if dtype not in DTYPE_SIZES and not (packed and quantized.is_packed(name, dtype)) and not table:
            kind = "a quantized or non-float" if dtype in KNOWN_UNSUPPORTED_DTYPES else "an unknown"
            error = (NonFloatTensor if dtype in KNOWN_UNSUPPORTED_DTYPES else CheckpointError)(
                f"tensor {name!r} has dtype {dtype!r}, {kind} dtype; ports load F32, F16 and BF16 weights.",
                path,
            )
            error.tensor, error.dtype = name, dtype
            raise error
        if (
            not isinstance(shape, list)
            or len(shape) > 8
            # JSON gives exactly int for integers (bool is a type of its own): the inline test is _is_int.
            or not all(type(d) is int and d >= 0 for d in shape)
            or not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int for o in offsets)
        ):
            raise CheckpointError(
                f"the shape {shape!r} or data offsets {offsets!r} of tensor {name!r} are malformed.", path
            )
        begin, end = offsets
        if not 0 <= begin <= end <= data_size or end - begin != math.prod(shape) * {**DTYPE_SIZES, **quantized.PACKED_DTYPES, **INTEGER_DTYPES, **MASK_DTYPES}[dtype]:
            raise CheckpointError(
                f"tensor {name!r} ({dtype}, shape {shape}) does not fit its data offsets {offsets} "
                f"in {data_size} bytes of data; the file is truncated or corrupt.",
                path,
            )
        entries[name] = entry
        spans.append((begin, end, name))
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            what = "overlaps the tensor before it" if begin < position else f"leaves a gap of {begin - position} bytes"
            raise CheckpointError(
                f"tensor {name!r} starts at byte {begin} of the data, which {what}; the file is corrupt.", path
            )
        position = end
    if position != data_size:
        raise CheckpointError(
            f"the tensors end at byte {position} of the data but the file holds {data_size}; the file is "
            "corrupt or has bytes appended.",
            path,
        )
    return entries


def _read_tensors(root: Path, packed: bool = False, integer_tables: frozenset[str] = frozenset(),
                  ) -> tuple[dict[str, TensorInfo], list[str], str | None]:
    index_path = root / INDEX_FILE
    single = root / SINGLE_FILE
    if index_path.exists() or index_path.is_symlink():
        index = read_json(index_path, "the safetensors index", kind="index", root=root)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError("the index has no 'weight_map' object naming tensors and shards.", index_path)
        if len(weight_map) > MAX_TENSORS:
            raise CheckpointError(f"the index lists {len(weight_map)} tensors, more than the {MAX_TENSORS} allowed.",
                                  index_path)
        for name in weight_map:
            _tensor_name(name, index_path)
        names: set[str] = set()
        for s in weight_map.values():  # each distinct name checked once (~40,000 tensors, ~100 shards)
            if not (isinstance(s, str) and s in names):
                names.add(_shard_name(s, index_path))
        if len(names) > MAX_SHARDS:
            raise CheckpointError(f"the index names {len(names)} shards, more than the {MAX_SHARDS} allowed.",
                                  index_path)
        shards = sorted(names)
        index_file = INDEX_FILE
    elif single.exists() or single.is_symlink():
        weight_map, shards, index_file = None, [SINGLE_FILE], None
    else:
        others = sorted(p.name for p in root.glob("*.safetensors"))
        if len(others) == 1:
            weight_map, shards, index_file = None, others, None
        else:
            found = ", ".join(sorted(p.name for p in root.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf")))
            many = f" It holds {len(others)} .safetensors files but no index naming them." if others else ""
            extra = f" It holds {found}; convert the weights to safetensors first." if found else ""
            raise CheckpointError(
                f"no {SINGLE_FILE} and no {INDEX_FILE}; scaffold reads safetensors checkpoints only.{many}{extra}",
                root,
            )

    tensors: dict[str, TensorInfo] = {}
    for shard in shards:
        shard_path = root / shard
        where = root / (index_file or shard)
        if not shard_path.exists() and not shard_path.is_symlink():
            raise CheckpointError(f"the index names the shard {shard!r}, which does not exist.", where)
        resolved = _regular_file(root, shard_path, f"the shard {shard!r}", where)
        for name, entry in read_safetensors_header(resolved, shard_path, weight_map, packed,
                                                        integer_tables).items():
            if name in tensors:
                raise CheckpointError(
                    f"tensor {name!r} is stored twice, in {tensors[name].file} and in {shard}.", shard_path
                )
            tensors[name] = TensorInfo(name, entry["dtype"], tuple(entry["shape"]), shard)
        if len(tensors) > MAX_TENSORS:
            raise CheckpointError(f"the shards hold more than the {MAX_TENSORS} tensors allowed.", shard_path)

    if weight_map is not None:
        for name, shard in weight_map.items():
            if name not in tensors:
                raise CheckpointError(f"the index places tensor {name!r} in {shard}, whose header lacks it.", index_path)
            if tensors[name].file != shard:
                raise CheckpointError(
                    f"the index places tensor {name!r} in {shard}, but it is stored in {tensors[name].file}.",
                    index_path,
                )
        unlisted = sorted(set(tensors) - set(weight_map))
        if unlisted:
            raise CheckpointError(
                f"the index does not list {len(unlisted)} tensor(s) its shards hold, e.g. {unlisted[0]!r}.",
                index_path,
            )
    if not tensors:
        raise CheckpointError("the checkpoint holds no tensors.", root)
    return tensors, shards, index_file


# ------------------------------------------------------ tokenizer, sources
def _read_tokenizer(root: Path) -> TokenizerInfo:
    info = TokenizerInfo()
    for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                 "special_tokens_map.json", "chat_template.jinja"):
        if (root / name).exists() or (root / name).is_symlink():
            _regular_file(root, root / name, name)
            info.files.append(name)
    if "tokenizer.json" in info.files:
        data = read_json(root / "tokenizer.json", "tokenizer.json", kind="tokenizer", strict=False)
        ids = []
        model = data.get("model")
        vocab = model.get("vocab") if isinstance(model, dict) else None
        if isinstance(vocab, dict):
            ids.extend(v for v in vocab.values() if _is_int(v))
        elif isinstance(vocab, list):
            ids.append(len(vocab) - 1)
        added = data.get("added_tokens")
        if isinstance(added, list):
            ids.extend(t["id"] for t in added if isinstance(t, dict) and _is_int(t.get("id")))
        ids = [i for i in ids if i >= 0]
        if ids:
            info.vocab_size = max(ids) + 1
            info.source = "tokenizer.json"
    elif "vocab.json" in info.files:
        vocab = read_json(root / "vocab.json", "vocab.json", kind="tokenizer", strict=False)
        ids = [v for v in vocab.values() if _is_int(v) and v >= 0]
        if ids:
            info.vocab_size = max(ids) + 1
            info.source = "vocab.json"
    if "tokenizer_config.json" in info.files:
        tc = read_json(root / "tokenizer_config.json", "tokenizer_config.json", kind="tokenizer", strict=False)

        def token(key):
            v = tc.get(key)
            v = v.get("content") if isinstance(v, dict) else v
            return v if isinstance(v, str) else None

        info.chat_template = bool(tc.get("chat_template")) or "chat_template.jinja" in info.files
        info.pad_token, info.bos_token, info.eos_token = token("pad_token"), token("bos_token"), token("eos_token")
        decoder = tc.get("added_tokens_decoder")
        for t in decoder.keys() if isinstance(decoder, dict) else ():
            if t.isascii() and t.isdigit() and len(t) > 12:  # int() of it would be slow, or refused
                raise CheckpointError(f"added_tokens_decoder names a token id of {len(t)} digits; real ids have "
                                      "at most 7.", root / "tokenizer_config.json")
            if t.isascii() and t.isdigit() and info.vocab_size is not None:
                info.vocab_size = max(info.vocab_size, int(t) + 1)
    return info


def _read_sources(root: Path, config: dict) -> dict[str, str]:
    """The checkpoint's own Python files: those `auto_map` names, plus any modeling_*.py.

    They are read as text and parsed by the detectors, never imported or run.
    """
    where = root / "config.json"
    names: set[str] = set()
    auto_map = config.get("auto_map") or {}
    for ref in auto_map.values():
        refs = ref if isinstance(ref, list) else [ref]
        for r in refs:
            if isinstance(r, str) and "." in r:
                module = r.split("--")[-1].rsplit(".", 1)[0]
                names.add(module.replace(".", "/") + ".py")
    names |= {p.name for p in root.glob("modeling_*.py")} | {p.name for p in root.glob("configuration_*.py")}
    if len(names) > 64:
        raise CheckpointError(f"the checkpoint has {len(names)} Python source files to read; real ones have a few.",
                              where)
    sources = {}
    total = tokens = 0
    for name in sorted(names):
        if not SOURCE_NAME.fullmatch(name) or ".." in name.split("/"):
            raise CheckpointError(f"the source file name {name!r} is not a plain module file name.", where)
        path = root / name
        if not path.exists() and not path.is_symlink():
            raise CheckpointError(f"config.json's auto_map names {name}, which the checkpoint does not contain.",
                                  where)
        resolved = _regular_file(root, path, f"the source file {name}", where)
        size = resolved.stat().st_size
        total += size
        if size > MAX_SOURCE_BYTES or total > MAX_SOURCES_BYTES:
            raise CheckpointError(
                f"the source file {name} is {size} bytes; the checkpoint's Python files may hold at most "
                f"{MAX_SOURCE_BYTES} bytes each and {MAX_SOURCES_BYTES} in all (real modeling files are < 300 KB).",
                path,
            )
        text = resolved.read_text(encoding="utf-8", errors="replace")
        # Bound the syntax trees before building them: they cost far more than the text.
        tokens += sum(1 for _ in _TOKEN.finditer(text))
        if tokens > MAX_SOURCE_TOKENS:
            raise CheckpointError(
                f"the source file {name} brings the checkpoint's Python code to more than {MAX_SOURCE_TOKENS} tokens "
                "(the largest modeling file transformers ships has ~30,000).",
                path,
            )
        try:
            ast.parse(text)
        except SyntaxError:
            pass  # the detectors skip code that does not parse
        except (RecursionError, MemoryError, ValueError) as exc:
            raise CheckpointError(
                f"the source file cannot be parsed ({type(exc).__name__}: nested too deeply or malformed).", path
            ) from None
        sources[name] = text
    return sources


def read_checkpoint(path: str | Path, integer_tables: frozenset[str] = frozenset()) -> Checkpoint:
    """Read a checkpoint folder. Raises CheckpointError with a one-paragraph message. `integer_tables`: the last
    components of tensor names that may hold integers or booleans (a table the code indexes, a mask buffer it
    registers, named by scaffold.detect.forms.read_checkpoint from what the code does with it); every other tensor
    must be float."""
    root = Path(path)
    if not root.exists():
        raise CheckpointError("no such checkpoint folder.", root)
    if not root.is_dir():
        raise CheckpointError("a checkpoint is a folder holding config.json and safetensors files.", root)
    root = root.resolve()
    config_file = root / "config.json"
    config = read_json(config_file, "config.json", root=root)
    if "text_config" in config and "num_hidden_layers" not in config:
        raise CheckpointError(
            "this is a multimodal checkpoint (config.json has a 'text_config'); scaffold ports text decoders.",
            config_file,
        )
    validate_config(config, config_file, lambda: _read_sources(root, config))
    try:
        tensors, shards, index_file = _read_tensors(root, packed=quantized.quantization_method(config) is not None,
                                                    integer_tables=frozenset(integer_tables))
    except NonFloatTensor as exc:  # what the code does with it is for scaffold.detect.forms to name
        exc.config, exc.sources = config, _read_sources(root, config)
        raise
    tensors = quantized.float_view(config, tensors, config_file)  # a quantized module as its weight
    generation = None
    generation_file = root / "generation_config.json"
    if generation_file.exists() or generation_file.is_symlink():
        generation = read_json(generation_file, "generation_config.json", root=root)
    return Checkpoint(
        path=root,
        config=config,
        tensors=tensors,
        shards=shards,
        index_file=index_file,
        tokenizer=_read_tokenizer(root),
        sources=_read_sources(root, config),
        generation_config=generation,
    )
