#!/usr/bin/env python
"""Build LabDM's tiny checkpoint: a custom remote-code model scaffold does not understand on its own.

LabDM (configuration_labdm.py, modeling_labdm.py beside this script) names its
sizes and modules its own way, so `scaffold inspect` cannot determine them and
`scaffold new` needs a spec file; spec.toml here is that file, filled in.
The weights are seeded random float32, the tokenizer is DemoLM's (250 tokens,
the embedding's 6 extra rows are zero padding). Deterministic.

Usage: python examples/lab_dmodel/build.py --out DIR [--no-source]
(--no-source leaves the modeling and configuration files out, as when a lab
shares the weights without its code.)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
TOKENIZER = HERE.parent / "demolm"
SOURCES = ("configuration_labdm.py", "modeling_labdm.py")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
REAL_TOKENS = 250  # DemoLM's tokenizer
CONFIG = {
    "architectures": ["LabDMForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_labdm.LabDMConfig",
                 "AutoModelForCausalLM": "modeling_labdm.LabDMForCausalLM"},
    "model_type": "labdm",
    "vocab_size": 256,
    "d_model": 64,
    "n_layers": 2,
    "n_heads": 2,
    "d_ff": 160,
    "max_seq_len": 256,
    "norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "init_std": 0.08,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "float32",
}


def weights() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    d, ff, vocab = CONFIG["d_model"], CONFIG["d_ff"], CONFIG["vocab_size"]

    def normal(*shape, std=CONFIG["init_std"]):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    out = {"transformer.tok_emb.weight": normal(vocab, d)}
    for i in range(CONFIG["n_layers"]):
        p = f"transformer.blocks.{i}."
        out[p + "attn_norm.weight"] = 1.0 + normal(d, std=0.1)
        for w in ("wq", "wk", "wv", "wo"):
            out[p + f"attn.{w}.weight"] = normal(d, d)
        out[p + "ffn_norm.weight"] = 1.0 + normal(d, std=0.1)
        out[p + "ffn.w_gate.weight"] = normal(ff, d)
        out[p + "ffn.w_in.weight"] = normal(ff, d)
        out[p + "ffn.w_out.weight"] = normal(d, ff)
    out["transformer.norm_f.weight"] = 1.0 + normal(d, std=0.1)
    out["lm_head.weight"] = normal(vocab, d)
    for name in ("transformer.tok_emb.weight", "lm_head.weight"):
        out[name][REAL_TOKENS:] = 0.0  # padding rows: never the greedy choice
    return out


def build(out: Path, *, source: bool = True) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    config = dict(CONFIG)
    if not source:
        del config["auto_map"]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(weights(), str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER / name, out / name)
    if source:
        for name in SOURCES:
            shutil.copyfile(HERE / name, out / name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--no-source", action="store_true", help="leave the model's Python files out")
    args = parser.parse_args(argv)
    print(f"wrote {build(args.out, source=not args.no_source)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
