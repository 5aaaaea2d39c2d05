"""A lab checkpoint whose base model registers its causal mask as a non-persistent buffer named `bias`.

CodeShell's remote code (GPT-BigCode's lineage) does this in CodeShellModel.__init__:

    self.register_buffer("bias", torch.tril(torch.ones((max_positions, max_positions), dtype=torch.bool)),
                         persistent=False)

while every norm of the model, the final one included, is an nn.LayerNorm whose `bias` is a parameter the checkpoint
stores. The lab is a tiny StableLM (LayerNorm with a bias before attention, before the MLP and at the end) shipped as
remote code: transformers' own modeling_stablelm.py with its relative imports made absolute, the classes renamed and
that one buffer added to the base model. A non-persistent buffer is never saved, so `model.norm.bias` in the
checkpoint is the final norm's parameter, not the mask.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ckpt_factory import edit_once, lab_modeling_source

NAME = "masklab"
ARCHITECTURE = "MasklabForCausalLM"
MASK = ("        max_positions = config.max_position_embeddings\n"
        "        self.register_buffer(\n"
        "            \"bias\", torch.tril(torch.ones((max_positions, max_positions), dtype=torch.bool)), persistent=False\n"
        "        )\n")


def modeling_source() -> str:
    text = lab_modeling_source("stablelm", "StableLmConfig", NAME, "MasklabConfig")
    text = edit_once(text, "        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)\n",
                 "        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)\n" + MASK)
    return text.replace("StableLmForCausalLM", ARCHITECTURE)


CONFIGURATION = f'''from transformers.models.stablelm.configuration_stablelm import StableLmConfig


class MasklabConfig(StableLmConfig):
    model_type = "{NAME}"
'''


def build(out: Path, *, seed: int = 0) -> Path:
    """Write the checkpoint into `out` (created; replaced if there) and return it."""
    from scaffold.tiny import build_tiny

    out = Path(out)
    base = build_tiny("stablelm", out.parent / f".{out.name}-stablelm", seed=seed)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(base, out)
    shutil.rmtree(base)
    config = json.loads((out / "config.json").read_text())
    config.update(model_type=NAME, architectures=[ARCHITECTURE],
                  auto_map={"AutoConfig": f"configuration_{NAME}.MasklabConfig",
                            "AutoModelForCausalLM": f"modeling_{NAME}.{ARCHITECTURE}"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / f"configuration_{NAME}.py").write_text(CONFIGURATION)
    (out / f"modeling_{NAME}.py").write_text(modeling_source())
    return out
