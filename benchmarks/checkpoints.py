"""Checkpoints for the benchmarks: sparse ones (real headers, holes for data) and random ones.

A sparse checkpoint has the config.json, the index and the safetensors headers of a real
release, but its tensor data are holes in the files: the tool reads headers only, so it
sees the real thing, and the disk holds a few kilobytes. A random checkpoint has real
random weights, made with transformers (on the GPU for the large ones).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

# Qwen3-4B's shape (its config.json on the Hub, weights aside).
QWEN3_4B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_bias": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}

# Qwen3-235B-A22B's shape: 94 layers, 128 experts of which 8 are routed per token.
QWEN3_235B_A22B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_hidden_layers": 94,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_bias": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
}

# Qwen3-30B-A3B's shape: 48 layers, 128 experts of 768 of which 8 are routed per token, width 2048,
# 32 heads of 128 with 4 KV heads (its config.json on the Hub, weights aside). Cut to fewer layers
# with --layers (6 layers: 8.7 GB of bf16 weights, for three engines on one GPU).
QWEN3_30B_A3B = {
    **QWEN3_235B_A22B,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
}

SHAPES = {"qwen3-4b": QWEN3_4B, "qwen3-235b-a22b": QWEN3_235B_A22B, "qwen3-30b-a3b": QWEN3_30B_A3B}


def decoder_tensors(config: dict) -> dict[str, list[int]]:
    """Tensor names and shapes of a Llama/Qwen3-family decoder (Qwen3-MoE experts where the config has them)."""
    h, heads, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim") or h // heads
    tensors = {"model.embed_tokens.weight": [config["vocab_size"], h]}
    qk_norm = config["model_type"].startswith("qwen3")
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update(
            {
                p + "input_layernorm.weight": [h],
                p + "post_attention_layernorm.weight": [h],
                p + "self_attn.q_proj.weight": [heads * d, h],
                p + "self_attn.k_proj.weight": [kv * d, h],
                p + "self_attn.v_proj.weight": [kv * d, h],
                p + "self_attn.o_proj.weight": [h, heads * d],
            }
        )
        if qk_norm:
            tensors.update({p + "self_attn.q_norm.weight": [d], p + "self_attn.k_norm.weight": [d]})
        if config.get("num_experts"):
            m = config["moe_intermediate_size"]
            tensors[p + "mlp.gate.weight"] = [config["num_experts"], h]
            for e in range(config["num_experts"]):
                q = f"{p}mlp.experts.{e}."
                tensors.update(
                    {q + "gate_proj.weight": [m, h], q + "up_proj.weight": [m, h], q + "down_proj.weight": [h, m]}
                )
        else:
            m = config["intermediate_size"]
            tensors.update(
                {
                    p + "mlp.gate_proj.weight": [m, h],
                    p + "mlp.up_proj.weight": [m, h],
                    p + "mlp.down_proj.weight": [h, m],
                }
            )
    tensors["model.norm.weight"] = [h]
    if not config.get("tie_word_embeddings"):
        tensors["lm_head.weight"] = [config["vocab_size"], h]
    return tensors


def write_sparse(root: Path, config: dict, shards: int, architecture: str | None = None) -> Path:
    """config.json, the index and `shards` safetensors files of bf16 tensors whose data are holes."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    config = dict(config)
    if architecture:
        config["architectures"] = [architecture]
    (root / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = list(decoder_tensors(config).items())
    sizes = [2 * _numel(shape) for _, shape in tensors]
    per_shard = sum(sizes) / shards
    weight_map, groups, current, filled = {}, [[] for _ in range(shards)], 0, 0.0
    for (name, shape), size in zip(tensors, sizes):
        if filled >= per_shard * (current + 1) and current < shards - 1:
            current += 1
        groups[current].append((name, shape))
        filled += size
    total = 0
    for s, group in enumerate(groups):
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, shape in group:
            size = 2 * _numel(shape)
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(root / fname, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + offset)  # a hole, not data
        weight_map.update({name: fname for name, _ in group})
        total += offset
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return root


def write_random(root: Path, config: dict, architecture: str, device: str = "cuda", std: float = 0.02) -> Path:
    """Real random bf16 weights for `config`, saved by transformers; config.json names `architecture`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "torch_dtype")}
    hf_config = AutoConfig.for_model(config["model_type"], **fields)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            else:
                param.normal_(0.0, std)
    model.save_pretrained(root, safe_serialization=True)
    cfg_path = Path(root) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["architectures"] = [architecture]
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    # transformers 5 holds a layer's experts as fused 3-D tensors and splits them back on save;
    # make sure what was saved is the per-expert layout a released checkpoint has.
    saved, expected = saved_tensors(root), decoder_tensors(config)
    if saved != expected:
        diff = sorted(set(saved) ^ set(expected)) or [k for k in expected if saved[k] != expected[k]]
        raise RuntimeError(f"saved tensors differ from the release layout, e.g. {diff[:3]}")
    return Path(root)


def saved_tensors(root: Path) -> dict[str, list[int]]:
    """Name -> shape of every tensor in the safetensors files of `root`, from their headers."""
    tensors = {}
    for path in sorted(Path(root).glob("*.safetensors")):
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        tensors.update({k: v["shape"] for k, v in header.items() if k != "__metadata__"})
    return tensors


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["sparse", "random"])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--architecture", default=None)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--layers", type=int, default=None, help="keep only the first N decoder layers")
    parser.add_argument("--device", default="cuda", help="where random weights are made (random only)")
    args = parser.parse_args()
    shape = dict(SHAPES[args.shape])
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    if args.kind == "sparse":
        print(write_sparse(args.out, shape, args.shards, args.architecture))
    else:
        print(write_random(args.out, shape, args.architecture or shape["architectures"][0], device=args.device))
