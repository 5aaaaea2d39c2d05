#!/usr/bin/env python
"""Build tiny random-weight checkpoints of the lab example models in examples/labs/.

Each model lives in examples/labs/NAME/ as the two files a lab ships on the Hub
(configuration_NAME.py and modeling_NAME.py, loaded through ``auto_map`` with
``trust_remote_code=True``). This script writes OUT/NAME/ with config.json (auto_map,
architectures), those two files copied verbatim, and model.safetensors: seeded random
weights with non-trivial norms and biases, so a port that drops one is visibly wrong.
It then reloads the folder with ``from_pretrained`` and checks that the reloaded model
computes the same float32 logits as the one it saved, with no missing or unexpected keys.

The build is deterministic: running it twice gives byte-identical files.

Usage::

    python examples/labs/build.py OUT [NAME ...]      (default: every model)
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name: the base and causal-LM classes, the config class, config.json's model keys (tiny sizes; head_dim 32 or 64)
LABS: dict[str, dict] = {
    # (1) parallel block, one LayerNorm feeding both attention and the feed-forward
    "kestrel": {
        "base": "KestrelModel", "model": "KestrelForCausalLM", "config_class": "KestrelConfig",
        "config": {"n_vocab": 384, "d_hidden": 128, "n_blocks": 2, "n_heads": 4, "n_kv_heads": 2, "d_ffn": 256,
                   "ln_eps": 1e-5, "rotary_base": 25000.0, "max_seq_len": 512, "ffn_bias": True},
    },
    # (2) GPT-2 style: Conv1D c_attn / c_out / c_up / c_down, learned absolute positions
    "osprey": {
        "base": "OspreyModel", "model": "OspreyLMHeadModel", "config_class": "OspreyConfig",
        "config": {"vocab": 384, "width": 128, "layers": 2, "heads": 4, "mlp_ratio": 4, "context_length": 512,
                   "eps_ln": 1e-5},
    },
    # (3) internlm2-style fused qkv: per KV group, that group's query heads, then its key, then its value
    "heron": {
        "base": "HeronModel", "model": "HeronForCausalLM", "config_class": "HeronConfig",
        "config": {"n_words": 384, "dim": 256, "n_blocks": 2, "n_q_heads": 8, "kv_groups": 2, "hidden_dim": 384,
                   "rms_eps": 1e-6, "theta": 500000.0, "max_len": 512},
    },
    # (4) ALiBi attention with muP multipliers under the lab's own keys
    "plover": {
        "base": "PloverModel", "model": "PloverForCausalLM", "config_class": "PloverConfig",
        "config": {"vocab_sz": 384, "embed_dim": 256, "num_blocks": 2, "attn_heads": 8, "mlp_dim": 512,
                   "norm_epsilon": 1e-5, "mup_emb_mult": 6.0, "mup_res_mult": 0.6, "mup_attn_mult": 0.25,
                   "mup_logit_div": 2.0, "seq_len": 512},
    },
    # (5) gate and up fused up-first in one tensor; the code activates the second half
    "wren": {
        "base": "WrenModel", "model": "WrenForCausalLM", "config_class": "WrenConfig",
        "config": {"tokens": 384, "model_dim": 128, "blocks": 2, "q_heads": 4, "kv_heads": 1, "ff_dim": 256,
                   "eps": 1e-6, "rope_freq_base": 50000.0, "ctx_len": 512},
    },
    # (7) gate and up fused in one projection, split by position inside a helper the static analysis does
    # not follow: which half is the gate is settled by running the MLP (scaffold.settle)
    "finch": {
        "base": "FinchModel", "model": "FinchForCausalLM", "config_class": "FinchConfig",
        "config": {"n_tok": 384, "hidden": 128, "n_stack": 2, "n_qh": 4, "n_kv": 2, "ffn_hidden": 192,
                   "norm_eps": 1e-6, "rope_theta_base": 500000.0, "max_ctx": 512},
    },
    # (6) config keys of its own, reached through attribute_map under transformers' standard names
    "shrike": {
        "base": "ShrikeModel", "model": "ShrikeForCausalLM", "config_class": "ShrikeConfig",
        "config": {"n_vocab": 384, "dim": 128, "depth": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 320,
                   "norm_eps": 1e-6, "rope_base": 100000.0, "max_context": 512},
    },
}

SEED = 1234
NORM_WEIGHT_STD = 0.2
BIAS_STD = 0.1
VOCAB_GAIN = 3.0  # embedding and output rows: logits with a spread of a few nats
CHECK_TOKENS = [[5, 17, 200, 3, 99, 321, 42, 7, 250, 11, 64, 128]]


def write_config(name: str, dest: Path) -> None:
    lab = LABS[name]
    config = {
        "architectures": [lab["model"]],
        "auto_map": {
            "AutoConfig": f"configuration_{name}.{lab['config_class']}",
            "AutoModel": f"modeling_{name}.{lab['base']}",
            "AutoModelForCausalLM": f"modeling_{name}.{lab['model']}",
        },
        "model_type": name,
        **lab["config"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def randomize(model, seed: int) -> None:
    """Seeded weights with O(1) activations: norm weights around 1, biases non-zero, matrices ~ 1/sqrt(fan_in)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    vocab = model.get_input_embeddings().num_embeddings
    with torch.no_grad():
        for mname, module in model.named_modules():
            kind = type(module).__name__
            is_norm = "norm" in kind.lower()
            for pname, p in module.named_parameters(recurse=False):
                noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
                if p.dim() == 1:  # a norm's scale (whatever its name) around 1; biases around 0
                    p.copy_(1.0 + NORM_WEIGHT_STD * noise if is_norm and pname != "bias" else BIAS_STD * noise)
                else:
                    fan_in = p.shape[0] if kind == "Conv1D" else p.shape[-1]  # Conv1D stores [in, out]
                    gain = VOCAB_GAIN if p.shape[0] == vocab else 1.0
                    p.copy_(gain * noise / math.sqrt(fan_in))


def build(name: str, out: Path) -> Path:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    dest = out / name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for kind in ("configuration", "modeling"):
        shutil.copyfile(HERE / name / f"{kind}_{name}.py", dest / f"{kind}_{name}.py")
    write_config(name, dest)

    config = AutoConfig.from_pretrained(dest, trust_remote_code=True)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=True, dtype=torch.float32)
    randomize(model, SEED + sorted(LABS).index(name))
    model.eval()
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, dest / "model.safetensors", metadata={"format": "pt"})

    ids = torch.tensor(CHECK_TOKENS)
    with torch.no_grad():
        expected = model(ids).logits
    reloaded, info = AutoModelForCausalLM.from_pretrained(dest, trust_remote_code=True, dtype=torch.float32,
                                                          output_loading_info=True)
    reloaded.eval()
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise SystemExit(f"{name}: from_pretrained reports {problems}")
    with torch.no_grad():
        got = reloaded(ids).logits
    delta = (got - expected).abs().max().item()
    # A weight lost or mis-mapped on reload moves logits by O(1). What is left is rounding: the reloaded
    # weights sit in other memory, and on some CPUs that picks another kernel (CI saw 1.8e-4 on osprey).
    if delta > 1e-4 * expected.abs().max().item() or not torch.isfinite(got).all():
        raise SystemExit(f"{name}: reloaded logits differ from the saved model's by {delta:.3e}")
    spread = expected.std().item()
    print(f"{name}: {dest} ({sum(v.numel() for v in state.values())} parameters, logit std {spread:.2f}, "
          f"reload delta {delta:.1e})")
    return dest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write the checkpoints into (OUT/NAME/)")
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"models to build (default: all of {sorted(LABS)})")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(LABS))
    if unknown:
        parser.error(f"no lab model named {', '.join(unknown)} (known: {', '.join(sorted(LABS))})")
    for name in args.names or sorted(LABS):
        build(name, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
