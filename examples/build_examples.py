#!/usr/bin/env python
"""Build the example checkpoint shipped in ``examples/demolm/``.

DemoLM is a tiny, randomly initialised causal LM distributed the way a custom
architecture is on the Hugging Face Hub: as *remote code*
(``configuration_demolm.py`` and ``modeling_demolm.py`` next to the weights,
wired up through ``auto_map`` and loaded with ``trust_remote_code=True``).
It is modelled on "DemoLM-1B" from the porting guide, shrunk to ~4 MB:

* a Llama-like pre-norm decoder (RMSNorm, NeoX-style rotary embeddings, no
  projection biases, untied ``lm_head``);
* grouped-query attention with three query heads per key/value head
  (6 query heads, 2 KV heads, head_dim 32);
* a SwiGLU MLP whose gate projection carries an extra ``gating_bias`` tensor:
  ``down_proj(silu(gate_proj(x) + gating_bias) * up_proj(x))``;
* sliding-window attention (window 8) on every layer except every third one,
  which attends fully (``config.layer_types``);
* the rope base (500000) is *not* in ``config.json``: it only exists as a
  default in the modeling code, reproducing a common real-world pitfall;
* a 250-token byte-level BPE tokenizer while the embedding and lm_head have
  320 rows: the checkpoint's vocabulary is padded beyond the tokenizer's (the
  70 padding rows are zero, so they are never the greedy choice).

The weights are random (seeded) but the norms and the gating bias are
non-trivial, so a port that drops any of these details produces visibly
different logits.  The model and config sources live in
``examples/sources/demolm/`` and are copied verbatim into the checkpoint.

The build is deterministic: running it twice gives byte-identical files.

Usage::

    python examples/build_examples.py [--out DIR] [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EXAMPLES_DIR = Path(__file__).resolve().parent
SOURCES_DIR = EXAMPLES_DIR / "sources" / "demolm"
DEFAULT_OUT = EXAMPLES_DIR / "demolm"

SEED = 0
GATING_BIAS_STD = 0.5
NORM_WEIGHT_STD = 0.1
TOKENIZER_VOCAB_SIZE = 250
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>"]  # ids 0, 1, 2; no pad token on purpose
MODEL_MAX_LENGTH = 512

AUTO_MAP = {
    "AutoConfig": "configuration_demolm.DemoLMConfig",
    "AutoModelForCausalLM": "modeling_demolm.DemoLMForCausalLM",
}

# Fixed training text for the tokenizer.  Changing it changes tokenizer.json.
CORPUS = """\
The quick brown fox jumps over the lazy dog. A small language model reads the
text one token at a time and tries to guess the next one. It is not very
clever, but it is quick, and it never gets tired of reading.

Rivers carry water from the mountains down to the sea. In the spring the snow
melts and the rivers rise; in the autumn they are low and clear. People have
always built their towns near rivers, because water is needed for drinking,
for farming and for trade.

The library opens at nine in the morning and closes at six in the evening.
Readers may borrow up to five books for three weeks. There is a quiet room on
the second floor where students can work, and a small garden with benches
behind the building.

Bread is made from flour, water, salt and yeast. The dough rests for an hour,
then it is shaped, baked in a hot oven and left to cool on a rack. Good bread
has a crisp crust and a soft, open crumb.

Numbers such as 1, 2, 3, 10, 42 and 2024 appear in many sentences, and so do
questions: What is the time? Where is the station? How far is it to the next
village? "Not far," she said, "just follow the road past the old mill."
"""


# --------------------------------------------------------------------------
# config


def load_config_class():
    """Import DemoLMConfig from the template source file."""
    path = SOURCES_DIR / "configuration_demolm.py"
    spec = importlib.util.spec_from_file_location("_demolm_configuration_template", path)
    module = importlib.util.module_from_spec(spec)
    dont_write_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # keep sources/ clean
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = dont_write_bytecode
    return module.DemoLMConfig


def write_config(config, out: Path) -> None:
    """config.json: save_pretrained's output, plus auto_map/architectures/dtype, minus any rope keys."""
    config.save_pretrained(out)
    path = out / "config.json"
    data = json.loads(path.read_text())
    for key in ("rope_theta", "rope_parameters", "rope_scaling"):
        data.pop(key, None)
    data["architectures"] = ["DemoLMForCausalLM"]
    data["auto_map"] = AUTO_MAP
    data["dtype"] = "float32"
    data["torch_dtype"] = "float32"
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_generation_config(config, out: Path) -> None:
    import transformers

    data = {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "transformers_version": transformers.__version__,
    }
    (out / "generation_config.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------
# tokenizer


def byte_level_alphabet() -> list[str]:
    """Printable ASCII plus space and newline, in ByteLevel's char mapping.

    Seeding the alphabet means any plain-ASCII prompt tokenizes without <unk>,
    even for characters the corpus lacks.  (The full 256-byte alphabet would
    not fit in a 250-token vocabulary.)
    """
    full = pre_tokenizers.ByteLevel.alphabet()  # the 256 mapped chars, unordered
    # ByteLevel maps printable ASCII to itself, space to "Ġ" and "\n" to "Ċ".
    chars = [chr(c) for c in range(0x21, 0x7F)] + ["\u0120", "\u010a"]
    assert all(c in full for c in chars)
    return chars


def build_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=byte_level_alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    if tokenizer.get_vocab_size() != TOKENIZER_VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tokenizer.get_vocab_size()} tokens, wanted {TOKENIZER_VOCAB_SIZE}")
    return tokenizer


def write_tokenizer(tokenizer: Tokenizer, out: Path) -> None:
    tokenizer.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": MODEL_MAX_LENGTH,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------
# weights


def make_weights(config, num_real_tokens: int) -> dict[str, torch.Tensor]:
    """Seeded random float32 weights, generated in a fixed order."""
    gen = torch.Generator().manual_seed(SEED)
    std = config.initializer_range
    h, inter = config.hidden_size, config.intermediate_size
    q_dim = config.num_attention_heads * config.head_dim
    kv_dim = config.num_key_value_heads * config.head_dim

    def normal(*shape, scale=std):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * scale

    def norm_weight():
        return 1.0 + normal(h, scale=NORM_WEIGHT_STD)

    weights = {"model.embed_tokens.weight": normal(config.vocab_size, h)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        weights[p + "input_layernorm.weight"] = norm_weight()
        weights[p + "self_attn.q_proj.weight"] = normal(q_dim, h)
        weights[p + "self_attn.k_proj.weight"] = normal(kv_dim, h)
        weights[p + "self_attn.v_proj.weight"] = normal(kv_dim, h)
        weights[p + "self_attn.o_proj.weight"] = normal(h, q_dim)
        weights[p + "post_attention_layernorm.weight"] = norm_weight()
        weights[p + "mlp.gate_proj.weight"] = normal(inter, h)
        weights[p + "mlp.up_proj.weight"] = normal(inter, h)
        weights[p + "mlp.down_proj.weight"] = normal(h, inter)
        weights[p + "mlp.gating_bias"] = normal(inter, scale=GATING_BIAS_STD)
    weights["model.norm.weight"] = norm_weight()
    weights["lm_head.weight"] = normal(config.vocab_size, h)

    # Rows past the tokenizer's vocabulary are padding, zero as in real padded
    # checkpoints: their logit is exactly 0, far below the best real token, so
    # greedy decoding never emits an id the tokenizer cannot decode.
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        weights[name][num_real_tokens:] = 0.0
    return {k: v.contiguous() for k, v in weights.items()}


def shard_of(name: str, num_layers: int) -> int:
    """Embedding and the first half of the layers in shard 0, the rest in shard 1."""
    if name.startswith("model.layers."):
        return 0 if int(name.split(".")[2]) < (num_layers + 1) // 2 else 1
    return 0 if name.startswith("model.embed_tokens.") else 1


def write_weights(weights: dict[str, torch.Tensor], num_layers: int, out: Path) -> None:
    num_shards = 2
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(num_shards)]
    for name, tensor in weights.items():
        shards[shard_of(name, num_layers)][name] = tensor
    weight_map = {}
    for idx, shard in enumerate(shards):
        filename = f"model-{idx + 1:05d}-of-{num_shards:05d}.safetensors"
        save_file(shard, str(out / filename), metadata={"format": "pt"})
        weight_map.update({name: filename for name in shard})
    total_size = sum(t.numel() * t.element_size() for t in weights.values())
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


# --------------------------------------------------------------------------
# driver


def build(out: Path) -> None:
    tokenizer = build_tokenizer()
    bos_id, eos_id = tokenizer.token_to_id("<s>"), tokenizer.token_to_id("</s>")

    DemoLMConfig = load_config_class()
    config = DemoLMConfig(bos_token_id=bos_id, eos_token_id=eos_id)

    write_config(config, out)
    write_generation_config(config, out)
    write_tokenizer(tokenizer, out)
    write_weights(make_weights(config, tokenizer.get_vocab_size()), config.num_hidden_layers, out)
    for name in ("configuration_demolm.py", "modeling_demolm.py"):
        shutil.copyfile(SOURCES_DIR / name, out / name)


def replace_dir(src: Path, dest: Path) -> None:
    """Move the finished build into place, keeping the old copy until the swap is done."""
    old = None
    if dest.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
        old.rmdir()
        dest.rename(old)
    src.rename(dest)
    if old is not None:
        shutil.rmtree(old)


def check(out: Path) -> None:
    """Load the result the way users would and run one forward pass."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # trust_remote_code=False: the tokenizer needs no custom code, and saying so
    # keeps AutoTokenizer from prompting about the model's auto_map.
    tok = AutoTokenizer.from_pretrained(out, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, dtype=torch.float32)
    ids = tok("The quick brown fox jumps over the lazy dog.", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert len(tok) == TOKENIZER_VOCAB_SIZE, len(tok)
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size), logits.shape
    assert torch.isfinite(logits).all()
    print(f"check ok: len(tokenizer)={len(tok)}, logits {tuple(logits.shape)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default: {DEFAULT_OUT})")
    parser.add_argument("--check", action="store_true", help="load the result with transformers afterwards")
    args = parser.parse_args(argv)

    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        build(tmp)
        for path in tmp.iterdir():
            path.chmod(0o644)
        tmp.chmod(0o755)
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    total = 0
    print(f"wrote {out}:")
    for path in sorted(out.iterdir()):
        size = path.stat().st_size
        total += size
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        print(f"  {path.name:40s} {size:>9d} bytes  sha256:{digest}")
    print(f"  {'total':40s} {total:>9d} bytes")

    if args.check:
        check(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
