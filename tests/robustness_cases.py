"""The catalogue of hostile and broken inputs that tests/test_robustness.py runs through the CLI.

Each case builds a checkpoint (a valid one from ckpt_factory, then broken in one
precise way), names the command to run, the words the error must contain and the
file it must name. docs/robustness.md is the table of these cases with the exit
code and message the CLI actually gave, and its peak memory and time, written by
scripts/robustness_doc.py.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ckpt_factory import Shape, read_header, rewrite_header, shard_of, tensors_for, write_shard

BASE = Shape(family="llama", architecture="RobustLlamaForCausalLM", hidden=64, heads=4, kv_heads=2, head_dim=16,
             layers=2, intermediate=96, vocab=128)
SHARD1 = "model-00001-of-00002.safetensors"
INDEX = "model.safetensors.index.json"


@dataclass
class Case:
    id: str
    what: str  # the bad input, in words, for the table
    build: Callable[[Path], None]  # breaks the checkpoint folder it is given (a valid one exists there)
    expect: str  # words the error message must contain
    names: str = "config.json"  # the file the message must name, relative to the checkpoint ("" = the folder)
    command: str = "new"  # inspect / new
    shards: int = 1
    spec: str | None = None  # the --spec file's text, written as CKPT/override.toml ("FIFO": a named pipe there)


# ------------------------------------------------------------------ helpers
def config(root: Path) -> dict:
    return json.loads((root / "config.json").read_text())


def set_config(root: Path, **changes) -> None:
    cfg = config(root)
    cfg.update(changes)
    (root / "config.json").write_text(json.dumps(cfg))


def raw_config(text: str | bytes) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        path = root / "config.json"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())

    return build


def config_edit(**changes) -> Callable[[Path], None]:
    return lambda root: set_config(root, **changes)


def index(root: Path) -> dict:
    return json.loads((root / INDEX).read_text())


def index_edit(fn: Callable[[dict], None]) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        data = index(root)
        fn(data["weight_map"])
        (root / INDEX).write_text(json.dumps(data))

    return build


def header_edit(fn: Callable[[dict], None], tensor: str = "model.embed_tokens.weight") -> Callable[[Path], None]:
    """Edit the header entries of the shard holding `tensor`, keeping its data bytes."""

    def build(root: Path) -> None:
        path = shard_of(root, tensor)
        entries, _ = read_header(path)
        fn(entries)
        rewrite_header(path, entries)

    return build


def rebuild(tensors_fn: Callable[[dict], None], shape: Shape = BASE) -> Callable[[Path], None]:
    """Rewrite model.safetensors with a changed tensor table (consistent header and data)."""

    def build(root: Path) -> None:
        tensors = tensors_for(shape)
        tensors_fn(tensors)
        write_shard(root / "model.safetensors", tensors)

    return build


def replace_header_text(old: str, new: str) -> Callable[[Path], None]:
    """Edit the raw header JSON text (same length or not), fixing the length prefix."""

    def build(root: Path) -> None:
        path = root / "model.safetensors"
        blob = path.read_bytes()
        (n,) = struct.unpack("<Q", blob[:8])
        text = blob[8:8 + n].decode()
        assert old in text, old
        raw = text.replace(old, new, 1).encode()
        path.write_bytes(struct.pack("<Q", len(raw)) + raw + blob[8 + n:])

    return build


def truncate(keep: Callable[[int], int], file: str = "model.safetensors") -> Callable[[Path], None]:
    def build(root: Path) -> None:
        path = root / file
        size = path.stat().st_size
        with open(path, "r+b") as f:
            f.truncate(keep(size))

    return build


def append(extra: bytes) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        with open(root / "model.safetensors", "ab") as f:
            f.write(extra)

    return build


def flip_header_byte(root: Path) -> None:
    path = root / "model.safetensors"
    blob = bytearray(path.read_bytes())
    blob[8 + 1] = ord("!")  # the first byte of the first key's opening quote
    path.write_bytes(bytes(blob))


def symlink_config_outside(root: Path) -> None:
    outside = root.parent / f"{root.name}-outside.json"
    outside.write_text((root / "config.json").read_text())
    (root / "config.json").unlink()
    (root / "config.json").symlink_to(outside)


def symlink_shard_outside(root: Path) -> None:
    outside = root.parent / f"{root.name}-outside.safetensors"
    os.replace(root / SHARD1, outside)
    (root / SHARD1).symlink_to(outside)


def fifo_config(root: Path) -> None:
    (root / "config.json").unlink()
    os.mkfifo(root / "config.json")


def only_bin(root: Path) -> None:
    (root / "model.safetensors").rename(root / "pytorch_model.bin")


def two_shards_no_index(root: Path) -> None:
    (root / INDEX).unlink()


def duplicate_in_header(root: Path) -> None:
    """The same tensor name twice in one header (JSON would silently keep the last)."""
    path = root / "model.safetensors"
    entries, _ = read_header(path)
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    name = "model.norm.weight"
    first = json.dumps({name: entries[name]}, separators=(",", ":"))[1:-1]
    text = blob[8:8 + n].decode()
    raw = (text[:-1] + "," + first + "}").encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + blob[8 + n:])


def duplicate_across_shards(root: Path) -> None:
    """A tensor of shard 2 also stored in shard 1 (the index still names shard 2)."""
    data = index(root)
    name = next(n for n, f in data["weight_map"].items() if f != SHARD1)
    tensors = {n: tensors_for(BASE)[n] for n, f in data["weight_map"].items() if f == SHARD1}
    tensors[name] = tensors_for(BASE)[name]
    write_shard(root / SHARD1, tensors)


def marker_code(root: Path, marker: Path) -> None:
    """Checkpoint code that leaves a marker file and raises if anything imports it."""
    body = (f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported ' + __name__)\n"
            "raise RuntimeError('checkpoint code was imported')\n")
    (root / "modeling_evil.py").write_text(body + "class EvilForCausalLM:\n    pass\n")
    (root / "configuration_evil.py").write_text(body + "class EvilConfig:\n    pass\n")
    set_config(root, auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                               "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})


def nested(depth: int):
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def mixer_tensors(tensors: dict) -> None:
    tensors["model.layers.0.mixer.A_log"] = [4]
    tensors["model.layers.1.mixer.A_log"] = [4]


def drop(name: str) -> Callable[[dict], None]:
    return lambda tensors: tensors.pop(name)


def reshape(name: str, shape: list[int]) -> Callable[[dict], None]:
    def fn(tensors: dict) -> None:
        tensors[name] = shape

    return fn


def layer0_bias_only(tensors: dict) -> None:
    tensors["model.layers.0.self_attn.q_proj.bias"] = [BASE.heads * BASE.head_dim]


def stray(tensors: dict) -> None:
    tensors["model.layers.0.self_attn.rotary_scale"] = [4]


def set_entry(tensor: str, key: str, value) -> Callable[[dict], None]:
    def fn(entries: dict) -> None:
        entries[tensor][key] = value

    return fn


def rename_tensor(new: str, old: str = "model.norm.weight") -> Callable[[dict], None]:
    def fn(entries: dict) -> None:
        entries[new] = entries.pop(old)

    return fn


def overlap(entries: dict) -> None:
    a, b = entries["model.norm.weight"]["data_offsets"]
    entries["model.norm.weight"]["data_offsets"] = [a - 4, b - 4]


# ------------------------------------------------------------ bombs (issue 17)
# Built at test time with few, large writes: nothing big is committed, and sparse files
# cost no disk where only the size matters.
def source_bomb(name: str, size: int) -> Callable[[Path], None]:
    """A Python file of `size` bytes: one list literal, two characters per item (the densest syntax tree)."""

    def build(root: Path) -> None:
        items = (size - 6) // 2
        (root / name).write_bytes(b"x = [" + b"1," * items + b"]\n")

    return build


def many_sources(root: Path) -> None:
    line = b"# " + b"x" * 97 + b"\n"
    for i in range(6):
        (root / f"modeling_bomb{i}.py").write_bytes(line * 9000)


def sparse_file(name: str, size: int) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        with open(root / name, "wb") as f:
            f.write(b"{")
            f.truncate(size)

    return build


def huge_index(root: Path) -> None:
    data = index(root)
    names = {f"x.{i}": SHARD1 for i in range(600_000)}
    (root / INDEX).write_text(json.dumps({**data, "weight_map": {**data["weight_map"], **names}},
                                         separators=(",", ":")))


def header_bomb(length: int) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        with open(root / "model.safetensors", "wb") as f:
            f.write(struct.pack("<Q", length) + b"{")
            f.truncate(8 + length)

    return build


def many_tensors(root: Path) -> None:
    """A consistent header (every tensor empty, at offset 0) of 260,000 entries: valid safetensors."""
    entry = b'":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}'
    raw = b"{" + b",".join(b'"t%d' % i + entry for i in range(260_000)) + b"}"
    (root / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)


# ------------------------------------------------------------------ catalogue
CASES = [
    # config.json
    Case("config-missing", "no config.json", lambda r: (r / "config.json").unlink(), "config.json is missing"),
    Case("config-not-json", "config.json is not JSON", raw_config("{not json"), "not valid JSON"),
    Case("config-list", "config.json holds a list", raw_config("[1, 2]"), "must hold a JSON object"),
    Case("config-not-utf8", "config.json is not UTF-8", raw_config(b'{"a": "\xff\xfe"}'), "not UTF-8"),
    Case("config-duplicate-key", "config.json names hidden_size twice (with different values)",
         lambda r: (r / "config.json").write_text((r / "config.json").read_text()[:-1] + ', "hidden_size": 32}'),
         "twice"),
    Case("config-key-self", 'config.json has the key "self" (no config class can take it)',
         config_edit(self=1), "'self'"),
    Case("config-key-dunder", 'config.json has the key "__class__"', config_edit(__class__=6), "'__class__'"),
    Case("config-symlink-out", "config.json is a symlink to a file outside the checkpoint",
         symlink_config_outside, "points outside the checkpoint"),
    Case("config-fifo", "config.json is a FIFO (would block a reader forever)", fifo_config,
         "not a regular file"),
    Case("hidden-size-string", 'hidden_size is "abc"', config_edit(hidden_size="abc"), "positive integer"),
    Case("layers-negative", "num_hidden_layers is -1", config_edit(num_hidden_layers=-1), "positive integer"),
    Case("heads-bool", "num_attention_heads is true", config_edit(num_attention_heads=True), "positive integer"),
    Case("hidden-size-float", "hidden_size is 64.0", config_edit(hidden_size=64.0), "positive integer"),
    Case("layer-types-not-list", 'layer_types is the string "full_attention"',
         config_edit(layer_types="full_attention", sliding_window=8), "list of strings"),
    Case("eps-nan", "rms_norm_eps is NaN", config_edit(rms_norm_eps=float("nan")), "finite number"),
    Case("rope-theta-infinity", "rope_theta is Infinity", config_edit(rope_theta=float("inf")), "finite number"),
    Case("rope-scaling-string", 'rope_scaling is the string "linear"', config_edit(rope_scaling="linear"),
         "an object"),
    Case("tie-string", 'tie_word_embeddings is "yes"', config_edit(tie_word_embeddings="yes"), "true or false"),
    Case("heads-do-not-divide", "4 attention heads over 3 KV heads", config_edit(num_key_value_heads=3),
         "do not divide"),
    Case("vocab-rows", "vocab_size 100 but the embedding has 128 rows", config_edit(vocab_size=100),
         "vocab_size 100"),
    Case("layers-mismatch", "config says 3 layers, the tensors hold 2", config_edit(num_hidden_layers=3), "layers"),
    Case("arch-injection", 'architectures is ["X(); import os"]', config_edit(architectures=["X(); import os"]),
         "not a Python class name"),
    Case("arch-not-list", 'architectures is the string "LlamaForCausalLM"',
         config_edit(architectures="LlamaForCausalLM"), "must be a list"),
    Case("model-type-injection", "model_type holds quotes and a newline",
         config_edit(model_type='llama"""\nimport os'), "simple name"),
    Case("deep-nesting", "an unread key nested 40 levels deep", config_edit(x_nested=nested(40)),
         "nested more than 32 levels"),
    Case("very-deep-nesting", "an unread key nested 100000 levels deep",
         raw_config('{"x": ' + "[" * 100000 + "]" * 100000 + "}"), "nested too deeply"),
    Case("huge-integer", "an integer of 5000 digits", raw_config('{"x": 1' + "0" * 5000 + "}"), "not valid JSON"),
    Case("lone-surrogate", "a string with an unpaired UTF-16 surrogate", raw_config('{"x": "\\ud800"}'),
         "surrogate"),
    Case("quantized", "quantization_config says GPTQ", config_edit(quantization_config={"quant_method": "gptq"}),
         "quantized"),
    Case("multimodal", "a multimodal config (text_config, no num_hidden_layers)",
         raw_config('{"architectures": ["XForConditionalGeneration"], "model_type": "x", "text_config": {}}'),
         "multimodal"),
    Case("linear-attention-layers", 'layer_types lists "linear_attention" layers',
         config_edit(layer_types=["linear_attention", "full_attention"]), "linear or recurrent attention"),
    Case("state-space-config", "config.json has Mamba keys (ssm_state_size)", config_edit(ssm_state_size=16),
         "state-space"),
    Case("state-space-tensors", "tensors of Mamba mixer blocks (mixer.A_log)", rebuild(mixer_tensors),
         "state-space"),
    Case("linear-attention-tensors", "tensors of a linear-attention block (linear_attn.)",
         rebuild(reshape("model.layers.0.linear_attn.in_proj.weight", [8, 64])), "linear or recurrent attention"),
    Case("auto-map-missing", "auto_map names a module file the checkpoint lacks",
         config_edit(auto_map={"AutoConfig": "configuration_gone.GoneConfig"}), "does not contain"),
    Case("auto-map-escape", "auto_map names a module by an absolute path (...etc.passwd, read as /etc/passwd.py)",
         config_edit(auto_map={"AutoConfig": "...etc.passwd.Config"}), "not a plain module file name"),
    # index and shard files
    Case("index-missing-shard", "the index names a shard that does not exist",
         index_edit(lambda m: m.update({"model.norm.weight": "model-00009-of-00009.safetensors"})),
         "does not exist", INDEX, shards=2),
    Case("index-dotdot", "the index names ../outside.safetensors",
         index_edit(lambda m: m.update({"model.norm.weight": "../outside.safetensors"})),
         "leaves the checkpoint", INDEX, shards=2),
    Case("index-absolute", "the index names /etc/passwd", index_edit(lambda m: m.update({"model.norm.weight":
                                                                                       "/etc/passwd"})),
         "absolute path", INDEX, shards=2),
    Case("shard-symlink-out", "a shard is a symlink to a file outside the checkpoint", symlink_shard_outside,
         "points outside the checkpoint", INDEX, shards=2),
    Case("index-wrong-shard", "the index places a tensor in the other shard",
         index_edit(lambda m: m.update({"model.embed_tokens.weight": "model-00002-of-00002.safetensors"})),
         "but it is stored in", INDEX, shards=2),
    Case("index-phantom-tensor", "the index lists a tensor no shard holds",
         index_edit(lambda m: m.update({"model.layers.9.mlp.up_proj.weight": SHARD1})),
         "whose header lacks it", INDEX, shards=2),
    Case("index-unlisted-tensor", "a shard holds a tensor the index does not list",
         index_edit(lambda m: m.pop("model.embed_tokens.weight")), "does not list", INDEX, shards=2),
    Case("index-duplicate", "the index lists a tensor twice",
         lambda r: (r / INDEX).write_text((r / INDEX).read_text().replace(
             '"weight_map": {', f'"weight_map": {{"model.norm.weight": "{SHARD1}", ', 1)),
         "twice", INDEX, shards=2),
    Case("index-not-object", "the index's weight_map is a list",
         lambda r: (r / INDEX).write_text('{"weight_map": []}'), "weight_map", INDEX, shards=2),
    Case("two-shards-no-index", "two .safetensors files and no index", two_shards_no_index,
         "no index naming them", "", shards=2),
    Case("only-bin", "only pytorch_model.bin, no safetensors", only_bin, "convert the weights to safetensors", ""),
    Case("tensor-in-two-shards", "a tensor is stored in both shards", duplicate_across_shards, "stored twice",
         "model-00002-of-00002.safetensors", shards=2),
    # safetensors headers
    Case("shard-tiny", "a shard of 5 bytes", truncate(lambda size: 5), "truncated", "model.safetensors"),
    Case("header-length-lies", "the header length claims more bytes than the file has",
         lambda r: (r / "model.safetensors").write_bytes(struct.pack("<Q", 10**9) + b"{}"), "truncated",
         "model.safetensors"),
    Case("header-flipped-byte", "a byte of the header JSON overwritten", flip_header_byte, "not valid JSON",
         "model.safetensors"),
    Case("header-not-object", "the header is a JSON list",
         lambda r: (r / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"[]"), "not a JSON object",
         "model.safetensors"),
    Case("data-truncated", "the shard's last 100 bytes cut off", truncate(lambda size: size - 100),
         "truncated or corrupt", "model.safetensors"),
    Case("data-appended", "16 bytes appended after the last tensor", append(bytes(16)), "bytes appended",
         "model.safetensors"),
    Case("tensor-twice-in-header", "a tensor named twice in one header", duplicate_in_header, "twice",
         "model.safetensors"),
    Case("dtype-int8", "a tensor of dtype I8", header_edit(set_entry("model.norm.weight", "dtype", "I8")),
         "quantized or non-float", "model.safetensors"),
    Case("dtype-fp8", "a tensor of dtype F8_E4M3", header_edit(set_entry("model.norm.weight", "dtype", "F8_E4M3")),
         "quantized or non-float", "model.safetensors"),
    Case("dtype-unknown", 'a tensor of dtype "Q4"', header_edit(set_entry("model.norm.weight", "dtype", "Q4")),
         "unknown dtype", "model.safetensors"),
    Case("shape-offsets", "a shape that does not match its data offsets",
         header_edit(set_entry("model.norm.weight", "shape", [65])), "does not fit", "model.safetensors"),
    Case("shape-bool", "a shape holding true", header_edit(set_entry("model.norm.weight", "shape", [True, 64])),
         "malformed", "model.safetensors"),
    Case("offsets-overlap", "two tensors' data overlapping", header_edit(overlap), "overlaps",
         "model.safetensors"),
    Case("metadata-bad", "__metadata__ is not a map of strings",
         header_edit(lambda e: e.update({"__metadata__": {"format": 1}})), "__metadata__", "model.safetensors"),
    Case("name-newline", "a tensor name with a newline",
         header_edit(rename_tensor("model.norm.weight\nevil")), "not a plain name", "model.safetensors"),
    Case("name-quote-backtick", "a tensor name with a quote, a backtick and a pipe",
         header_edit(rename_tensor('x"`|.rotary_emb.inv_freq')), "not a plain name", "model.safetensors"),
    Case("name-unicode-digit", "a tensor name with a non-ASCII digit (model.layers.٠...)",
         header_edit(rename_tensor("model.layers.\u0660.input_layernorm.weight")), "not a plain name",
         "model.safetensors"),
    # shapes against the config
    Case("q-rows", "q_proj with rows for 5 heads instead of 4",
         rebuild(reshape("model.layers.1.self_attn.q_proj.weight", [80, 64])), "q_proj"),
    Case("o-proj-shape", "o_proj of shape [64, 32]", rebuild(reshape("model.layers.1.self_attn.o_proj.weight",
                                                                     [64, 32])), "o_proj"),
    Case("bias-shape", "a q_proj bias with the wrong length",
         rebuild(reshape("model.layers.0.self_attn.q_proj.bias", [63])), "the bias needs"),
    Case("norm-shape", "a layer norm of 32 values in a 64-wide model",
         rebuild(reshape("model.layers.1.input_layernorm.weight", [32])), "input_layernorm"),
    Case("lm-head-rows", "lm_head with 127 rows", rebuild(reshape("lm_head.weight", [127, 64])), "lm_head"),
    Case("tensor-missing", "layer 1 has no q_proj weight",
         rebuild(drop("model.layers.1.self_attn.q_proj.weight")), "q_proj"),
    Case("bias-one-layer", "a q_proj bias in layer 0 only", rebuild(layer0_bias_only), "never loaded", ""),
    Case("tensor-homeless", "a tensor the port has no home for",
         rebuild(stray), "rotary_scale"),
    Case("head-missing-untied", "no lm_head.weight while tie_word_embeddings is false",
         rebuild(drop("lm_head.weight")), "lm_head"),
    # --- issue 17: bombs and names
    # Memory and time bombs under the reader's old size caps: each is refused by a bound checked before the
    # work (file sizes, value counts, counts against the tensors), in seconds and well under 1 GB (the
    # measured peak RSS and time are in docs/robustness.md; test_bad_input_fails_cleanly asserts the bounds).
    Case("bomb-modeling-15mb", "a 15 MB modeling_bomb.py (one list literal of 7.5M items)",
         source_bomb("modeling_bomb.py", 15 * 2**20), "bytes each", "modeling_bomb.py", "inspect"),
    Case("bomb-modeling-dense", "a 1 MB modeling_bomb.py of 500,000 list items (its syntax tree: ~500 MB)",
         source_bomb("modeling_bomb.py", 10**6), "tokens", "modeling_bomb.py", "inspect"),
    Case("bomb-modeling-many", "six 900 KB modeling_*.py files (comments only)", many_sources, "in all",
         "modeling_bomb4.py", "inspect"),
    Case("bomb-layers-1e9", "num_hidden_layers = 10**9 with two layers of tensors",
         config_edit(num_hidden_layers=10**9), "more than the 1024 layers"),
    Case("bomb-layers-1000", "num_hidden_layers = 1000 with two layers of tensors",
         config_edit(num_hidden_layers=1000), "tensors hold layers 0..1"),
    Case("bomb-experts-1e8", "num_local_experts = 10**8", config_edit(num_local_experts=10**8),
         "more than the 8192 experts"),
    Case("bomb-arch-1m", "a 1M-character architecture name (config.json over 1 MiB)",
         config_edit(architectures=["A" * 2**20 + "ForCausalLM"]), "bytes, more than"),
    Case("bomb-arch-40k", "a 40,000-character architecture name of capitals",
         config_edit(architectures=["A" * 40000 + "ForCausalLM"]), "more than the 200 allowed"),
    Case("bomb-tokenizer-230mb", "a 230 MB tokenizer.json (sparse)", sparse_file("tokenizer.json", 230 * 2**20),
         "more than the 67108864 allowed", "tokenizer.json"),
    Case("bomb-tokenizer-values", "a 36 MB tokenizer.json holding 12M empty lists",
         lambda r: (r / "tokenizer.json").write_bytes(b'{"x": [' + b"[]," * (12 * 10**6) + b"[]]}"),
         "JSON values", "tokenizer.json"),
    Case("bomb-index-228mb", "a 228 MB model.safetensors.index.json (sparse)",
         sparse_file(INDEX, 228 * 2**20), "more than the 33554432 allowed", INDEX, shards=2),
    Case("bomb-index-values", "a 27 MB index listing 600,000 tensors", huge_index, "JSON values", INDEX,
         shards=2),
    Case("bomb-header-95mb", "a shard whose header length is 95 MB (the rest of the file sparse)",
         header_bomb(95 * 2**20), "more than the 16777216 allowed", "model.safetensors"),
    Case("bomb-header-tensors", "a valid 14 MB shard header listing 260,000 empty tensors (the bound: 150,000)", many_tensors,
         "tensors", "model.safetensors"),
    Case("bomb-config-7mb", "a 7 MB config.json holding a list of 3.5M integers",
         config_edit(x_list=[1] * (35 * 10**5)), "bytes, more than"),
    Case("bomb-config-values", "a 150 KB config.json holding a list of 50,000 integers",
         config_edit(x_list=list(range(50000))), "JSON values"),
    Case("bomb-added-token-digits", "tokenizer_config.json's added_tokens_decoder has a 5000-digit id",
         lambda r: (r / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {"9" * 5000: {}}})),
         "5000 digits", "tokenizer_config.json"),
    Case("bomb-spec-layers", "--spec num_layers = 10**9", lambda r: None, "between 0 and 1024", "override.toml",
         spec="num_layers = 1000000000\n"),
    Case("bomb-spec-experts", "--spec num_experts = 10**8", lambda r: None, "between 0 and 8192", "override.toml",
         spec="num_experts = 100000000\n"),
    Case("bomb-spec-list", "--spec sliding_window_layers lists 100,000 layers", lambda r: None,
         "more than the 1024 allowed", "override.toml",
         spec="sliding_window_layers = [" + "0, " * 100000 + "]\n"),
    Case("bomb-spec-fifo", "--spec names a FIFO (would block a reader forever)", lambda r: None,
         "not a regular file", "override.toml", spec="FIFO"),
    Case("bomb-spec-2mb", "a 2 MB --spec file", lambda r: None, "more than the 1048576 allowed", "override.toml",
         spec="# " + "x" * (2 * 2**20) + "\n"),
    # Names that would break what is generated or installed.
    *[Case(f"name-package-{name}", f'--spec package = "{name}" (shadows {why})', lambda r: None,
           "would shadow", "override.toml", spec=f'package = "{name}"\n')
      for name, why in (("vllm", "vLLM"), ("torch", "torch"), ("transformers", "transformers"),
                        ("os", "the standard library"), ("json", "the standard library"),
                        ("scaffold", "this tool"), ("pip", "pip"))],
    Case("name-package-underscore", '--spec package = "_x" (distribution name "-x")', lambda r: None,
         "distribution name", "override.toml", spec='package = "_x"\n'),
    Case("name-package-newline", '--spec package = "x\\n" (a trailing newline)', lambda r: None,
         "not a valid Python identifier", "override.toml", spec='package = "x\\n"\n'),
    Case("name-model-type-newline", 'model_type is "llama\\n" (a trailing newline)',
         config_edit(model_type="llama\n"), "simple name"),
    Case("name-arch-newline", 'architectures is ["XForCausalLM\\n"] (a trailing newline)',
         config_edit(architectures=["XForCausalLM\n"]), "not a Python class name"),
    Case("name-tensor-newline", "a tensor name ending in a newline",
         header_edit(rename_tensor("model.norm.weight\n")), "not a plain name", "model.safetensors"),
]
