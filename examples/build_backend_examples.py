#!/usr/bin/env python
"""Build the two remote-code checkpoints that exercise the transformers-backend fallback.

* ``examples/tinymoe/``: TinyMoE, a small mixture-of-experts decoder (4 experts, top-2,
  3D expert weights) whose code follows vLLM's transformers-backend rules. The native
  generator cannot express MoE blocks, so ``scaffold new --impl auto`` serves it through
  the backend (``examples/sources/tinymoe/``).
* ``examples/tinymoe_sdpa/``: the same architecture and weights, written the way most Hub
  remote code is (attention computed inline with SDPA, no ``**kwargs`` threading, no
  ``_supports_attention_backend``, experts with another signature). Neither path can
  take it, so ``scaffold new`` refuses it and says why (``examples/sources/tinymoe_sdpa/``).

Weights are seeded random float32, written directly with safetensors (the checkpoint's
code is not run to build it), so two builds give byte-identical files.

Usage::

    python examples/build_backend_examples.py [--out-dir DIR] [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

EXAMPLES_DIR = Path(__file__).resolve().parent
SOURCES_DIR = EXAMPLES_DIR / "sources"

SEED = 0
STD = 0.08
NORM_WEIGHT_STD = 0.1
CONFIG = {
    "vocab_size": 256,
    "hidden_size": 128,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "attention_dropout": 0.0,
    "initializer_range": STD,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "dtype": "float32",
    "torch_dtype": "float32",
}
# name -> (python module stem, class prefix)
EXAMPLES = {
    "tinymoe": ("tinymoe", "TinyMoE"),
    "tinymoe_sdpa": ("tinymoe_sdpa", "TinyMoESdpa"),
}


def make_weights() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED)
    c = CONFIG
    h, inter, e = c["hidden_size"], c["moe_intermediate_size"], c["num_experts"]
    q_dim = c["num_attention_heads"] * c["head_dim"]
    kv_dim = c["num_key_value_heads"] * c["head_dim"]

    def normal(*shape, scale=STD):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * scale

    def norm_weight():
        return 1.0 + normal(h, scale=NORM_WEIGHT_STD)

    w = {"model.embed_tokens.weight": normal(c["vocab_size"], h)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight()
        w[p + "self_attn.q_proj.weight"] = normal(q_dim, h)
        w[p + "self_attn.k_proj.weight"] = normal(kv_dim, h)
        w[p + "self_attn.v_proj.weight"] = normal(kv_dim, h)
        w[p + "self_attn.o_proj.weight"] = normal(h, q_dim)
        w[p + "post_attention_layernorm.weight"] = norm_weight()
        w[p + "mlp.gate.weight"] = normal(e, h, scale=0.5)  # a router that actually discriminates
        w[p + "mlp.experts.gate_up_proj"] = normal(e, 2 * inter, h)
        w[p + "mlp.experts.down_proj"] = normal(e, h, inter)
    w["model.norm.weight"] = norm_weight()
    w["lm_head.weight"] = normal(c["vocab_size"], h)
    return {k: v.contiguous() for k, v in w.items()}


def build(name: str, out: Path) -> None:
    stem, prefix = EXAMPLES[name]
    config = {
        **CONFIG,
        "architectures": [f"{prefix}ForCausalLM"],
        "model_type": stem,
        "auto_map": {
            "AutoConfig": f"configuration_{stem}.{prefix}Config",
            "AutoModel": f"modeling_{stem}.{prefix}Model",
            "AutoModelForCausalLM": f"modeling_{stem}.{prefix}ForCausalLM",
        },
        "transformers_version": "5.19.0",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(make_weights(), str(out / "model.safetensors"), metadata={"format": "pt"})
    for kind in ("configuration", "modeling"):
        shutil.copyfile(SOURCES_DIR / stem / f"{kind}_{stem}.py", out / f"{kind}_{stem}.py")


def check(out: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([[3, 14, 15, 92, 65, 35]])).logits
    assert logits.shape == (1, 6, CONFIG["vocab_size"]) and torch.isfinite(logits).all()
    print(f"check ok: {out.name} logits {tuple(logits.shape)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=EXAMPLES_DIR, help="folder to write the examples into")
    parser.add_argument("--check", action="store_true", help="load each result with transformers afterwards")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in EXAMPLES:
        out = (args.out_dir / name).resolve()
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=out.parent))
        try:
            build(name, tmp)
            for path in tmp.iterdir():
                path.chmod(0o644)
            tmp.chmod(0o755)
            if out.exists():
                shutil.rmtree(out)
            tmp.rename(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        print(f"wrote {out}:")
        for path in sorted(out.iterdir()):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
            print(f"  {path.name:32s} {path.stat().st_size:>9d} bytes  sha256:{digest}")
        if args.check:
            check(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
