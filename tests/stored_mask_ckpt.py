"""A lab checkpoint whose attention registers its causal mask as a persistent boolean buffer, saved with the weights.

MOSS's remote code (CodeGen's lineage, as CodeGen and GPT-J were before transformers made their masks
non-persistent) does this in MossAttention.__init__:

    self.register_buffer(
        "causal_mask",
        torch.tril(torch.ones((max_positions, max_positions), dtype=torch.bool)).view(
            1, 1, max_positions, max_positions
        ),
    )

so its checkpoints hold a BOOL tensor `transformer.h.N.attn.causal_mask` in every layer beside the float weights.
The lab is a tiny CodeGen shipped as remote code: transformers' own modeling_codegen.py with its relative imports
made absolute, the classes renamed and that buffer registered in the attention (its forward keeps building the mask
as transformers does: the buffer only has to be stored, as MOSS's is); the masks are written into the checkpoint
as one more shard.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ckpt_factory import edit_once, lab_modeling_source

NAME = "storedmasklab"
ARCHITECTURE = "StoredmasklabForCausalLM"
MASK = ("        self.register_buffer(\n"
        "            \"causal_mask\",\n"
        "            torch.tril(torch.ones((self.max_positions, self.max_positions), dtype=torch.bool)).view(\n"
        "                1, 1, self.max_positions, self.max_positions\n"
        "            ),\n"
        "        )\n")


def modeling_source() -> str:
    text = lab_modeling_source("codegen", "CodeGenConfig", NAME, "StoredmasklabConfig")
    text = edit_once(text, "        self.max_positions = config.max_position_embeddings\n",
                     "        self.max_positions = config.max_position_embeddings\n" + MASK)
    return text.replace("CodeGenForCausalLM", ARCHITECTURE)


CONFIGURATION = f'''from transformers.models.codegen.configuration_codegen import CodeGenConfig


class StoredmasklabConfig(CodeGenConfig):
    model_type = "{NAME}"
'''


def build(out: Path, *, seed: int = 0) -> Path:
    """Write the checkpoint into `out` (created; replaced if there) and return it."""
    import numpy as np
    from safetensors.numpy import save_file

    from scaffold.tiny import build_tiny

    out = Path(out)
    base = build_tiny("codegen", out.parent / f".{out.name}-codegen", seed=seed, overrides={"rotary_dim": 16})
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(base, out)
    shutil.rmtree(base)
    config = json.loads((out / "config.json").read_text())
    config.pop("intermediate_size", None)  # a size CodeGen never reads (scaffold.tiny's): n_inner null, as MOSS's
    config.update(model_type=NAME, architectures=[ARCHITECTURE],
                  auto_map={"AutoConfig": f"configuration_{NAME}.StoredmasklabConfig",
                            "AutoModelForCausalLM": f"modeling_{NAME}.{ARCHITECTURE}"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / f"configuration_{NAME}.py").write_text(CONFIGURATION)
    (out / f"modeling_{NAME}.py").write_text(modeling_source())
    n = config["n_positions"]
    mask = np.tril(np.ones((n, n), dtype=bool)).reshape(1, 1, n, n)
    masks = {f"transformer.h.{i}.attn.causal_mask": mask for i in range(config["n_layer"])}
    save_file(masks, out / "model-causal-masks.safetensors", metadata={"format": "pt"})
    index = out / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"].update(dict.fromkeys(masks, "model-causal-masks.safetensors"))
    else:  # one shard: an index over it and the masks
        data = {"metadata": {}, "weight_map": {**dict.fromkeys(_names(out / "model.safetensors"), "model.safetensors"),
                                               **dict.fromkeys(masks, "model-causal-masks.safetensors")}}
    index.write_text(json.dumps(data, indent=2))
    return out


def _names(shard: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(shard, "np") as f:
        return list(f.keys())
