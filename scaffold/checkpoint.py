"""Read a Hugging Face checkpoint without loading tensor data or running its code.

This module reads config.json, the safetensors index, the JSON header of every
shard, the tokenizer files and the checkpoint's own Python sources as text. It
imports neither torch nor transformers, so `scaffold inspect` answers in well
under a second even on checkpoints of hundreds of gigabytes.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from scaffold.errors import CheckpointError

# Bytes per element of the safetensors dtypes a port can load.
DTYPE_SIZES = {"F32": 4, "F16": 2, "BF16": 2}
# Dtypes that exist in the format but mean quantized or non-float weights.
KNOWN_UNSUPPORTED_DTYPES = {"F64", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2"}

MAX_HEADER_BYTES = 100 * 1024 * 1024
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


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


def _inside(root: Path, candidate: Path, what: str, where: Path) -> Path:
    """Resolve `candidate` and refuse it unless it stays inside `root`."""
    resolved = candidate.resolve()
    try:
        resolved.relative_to(root)
    except ValueError:
        raise CheckpointError(
            f"{what} points outside the checkpoint ({resolved}); a checkpoint may only "
            "name files inside its own folder.",
            where,
        ) from None
    return resolved


def _shard_name(name: object, where: Path) -> str:
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"the weight map names a shard as {name!r}, which is not a file name.", where)
    if os.path.isabs(name) or name.startswith("/") or "\\" in name:
        raise CheckpointError(f"the weight map names the absolute path {name!r}; shards must be relative.", where)
    if ".." in Path(name).parts:
        raise CheckpointError(f"the weight map names {name!r}, a path that leaves the checkpoint.", where)
    return name


def read_json(path: Path, what: str) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointError(f"{what} is missing.", path) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{what} cannot be read ({exc}).", path) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"{what} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}).", path
        ) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{what} must hold a JSON object, not {type(data).__name__}.", path)
    return data


def read_safetensors_header(path: Path) -> dict[str, dict]:
    """Return the tensor entries of one shard's header, validated against its size."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError("the safetensors file is truncated: it has no header length.", path)
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or n + 8 > size:
                raise CheckpointError(
                    f"the safetensors header claims {n} bytes but the file has {size}; "
                    "the file is truncated or not a safetensors file.",
                    path,
                )
            raw = f.read(n)
    except OSError as exc:
        raise CheckpointError(f"the shard cannot be read ({exc}).", path) from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError("the safetensors header is not valid JSON; the file is corrupt.", path) from None
    if not isinstance(header, dict):
        raise CheckpointError("the safetensors header is not a JSON object; the file is corrupt.", path)
    data_size = size - 8 - n
    entries = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
            raise CheckpointError(f"the header entry of tensor {name!r} is malformed.", path)
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPE_SIZES:
            kind = "a quantized or non-float" if dtype in KNOWN_UNSUPPORTED_DTYPES else "an unknown"
            raise CheckpointError(
                f"tensor {name!r} has dtype {dtype!r}, {kind} dtype; ports load F32, F16 and BF16 weights.",
                path,
            )
        if (
            not isinstance(shape, list)
            or not all(isinstance(d, int) and d >= 0 for d in shape)
            or not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
        ):
            raise CheckpointError(f"the shape or offsets of tensor {name!r} are malformed.", path)
        begin, end = offsets
        if not 0 <= begin <= end <= data_size or end - begin != math.prod(shape) * DTYPE_SIZES[dtype]:
            raise CheckpointError(
                f"tensor {name!r} ({dtype}, shape {shape}) does not fit its data offsets {offsets} "
                f"in {data_size} bytes of data; the file is truncated or corrupt.",
                path,
            )
        entries[name] = entry
    return entries


def _read_tensors(root: Path) -> tuple[dict[str, TensorInfo], list[str], str | None]:
    index_path = root / INDEX_FILE
    single = root / SINGLE_FILE
    if index_path.exists():
        index = read_json(index_path, "the safetensors index")
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError("the index has no 'weight_map' object naming tensors and shards.", index_path)
        shards = sorted({_shard_name(s, index_path) for s in weight_map.values()})
        index_file = INDEX_FILE
    elif single.exists():
        weight_map, shards, index_file = None, [SINGLE_FILE], None
    else:
        others = sorted(p.name for p in root.glob("*.safetensors"))
        if len(others) == 1:
            weight_map, shards, index_file = None, others, None
        else:
            found = ", ".join(p.name for p in root.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
            extra = f" It holds {found}; convert the weights to safetensors first." if found else ""
            raise CheckpointError(
                f"no {SINGLE_FILE} and no {INDEX_FILE}; scaffold reads safetensors checkpoints only.{extra}",
                root,
            )

    tensors: dict[str, TensorInfo] = {}
    for shard in shards:
        shard_path = root / shard
        if not shard_path.exists() and not shard_path.is_symlink():
            raise CheckpointError(f"the index names the shard {shard!r}, which does not exist.", root / (index_file or shard))
        _inside(root, shard_path, f"the shard {shard!r}", root / (index_file or shard))
        for name, entry in read_safetensors_header(shard_path).items():
            if name in tensors:
                raise CheckpointError(
                    f"tensor {name!r} is stored twice, in {tensors[name].file} and in {shard}.", shard_path
                )
            tensors[name] = TensorInfo(name, entry["dtype"], tuple(entry["shape"]), shard)

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


def _read_tokenizer(root: Path) -> TokenizerInfo:
    info = TokenizerInfo()
    for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                 "special_tokens_map.json", "chat_template.jinja"):
        if (root / name).exists():
            info.files.append(name)
    if "tokenizer.json" in info.files:
        data = read_json(root / "tokenizer.json", "tokenizer.json")
        ids = []
        vocab = (data.get("model") or {}).get("vocab")
        if isinstance(vocab, dict):
            ids.extend(v for v in vocab.values() if isinstance(v, int))
        elif isinstance(vocab, list):
            ids.append(len(vocab) - 1)
        ids.extend(t["id"] for t in data.get("added_tokens") or [] if isinstance(t, dict) and isinstance(t.get("id"), int))
        if ids:
            info.vocab_size = max(ids) + 1
            info.source = "tokenizer.json"
    elif "vocab.json" in info.files:
        vocab = read_json(root / "vocab.json", "vocab.json")
        info.vocab_size = max((v for v in vocab.values() if isinstance(v, int)), default=-1) + 1
        info.source = "vocab.json"
    if "tokenizer_config.json" in info.files:
        tc = read_json(root / "tokenizer_config.json", "tokenizer_config.json")

        def token(key):
            v = tc.get(key)
            return v.get("content") if isinstance(v, dict) else v

        info.chat_template = bool(tc.get("chat_template")) or "chat_template.jinja" in info.files
        info.pad_token, info.bos_token, info.eos_token = token("pad_token"), token("bos_token"), token("eos_token")
        for t in (tc.get("added_tokens_decoder") or {}).keys():
            if str(t).isdigit() and info.vocab_size is not None:
                info.vocab_size = max(info.vocab_size, int(t) + 1)
    return info


def _read_sources(root: Path, config: dict) -> dict[str, str]:
    """The checkpoint's own Python files: those `auto_map` names, plus any modeling_*.py."""
    names: set[str] = set()
    auto_map = config.get("auto_map") or {}
    if isinstance(auto_map, dict):
        for ref in auto_map.values():
            refs = ref if isinstance(ref, list) else [ref]
            for r in refs:
                if isinstance(r, str) and "." in r:
                    module = r.split("--")[-1].rsplit(".", 1)[0]
                    names.add(module.replace(".", "/") + ".py")
    names |= {p.name for p in root.glob("modeling_*.py")} | {p.name for p in root.glob("configuration_*.py")}
    sources = {}
    for name in sorted(names):
        path = root / name
        if not path.exists():
            raise CheckpointError(f"config.json's auto_map names {name}, which the checkpoint does not contain.",
                                  root / "config.json")
        _inside(root, path, f"the source file {name}", root / "config.json")
        sources[name] = path.read_text(encoding="utf-8", errors="replace")
    return sources


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint folder. Raises CheckpointError with a one-paragraph message."""
    root = Path(path)
    if not root.exists():
        raise CheckpointError("no such checkpoint folder.", root)
    if not root.is_dir():
        raise CheckpointError("a checkpoint is a folder holding config.json and safetensors files.", root)
    root = root.resolve()
    config = read_json(root / "config.json", "config.json")
    if "text_config" in config and "num_hidden_layers" not in config:
        raise CheckpointError(
            "this is a multimodal checkpoint (config.json has a 'text_config'); scaffold ports text decoders.",
            root / "config.json",
        )
    tensors, shards, index_file = _read_tensors(root)
    generation = None
    if (root / "generation_config.json").exists():
        generation = read_json(root / "generation_config.json", "generation_config.json")
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
