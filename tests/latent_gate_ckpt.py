"""A lab checkpoint with A.X-K2's gated latent query and plain norms, shipped as remote code.

transformers' own modeling_axk2.py with its relative imports made absolute and two changes: the query up-projection
keeps the checkpoint's name (`q_b_proj`, which A.X-K2's conversion table renames to `q_gate_proj` for transformers'
own model type only), and the decoder layer builds plain RMSNorms where A.X-K2 builds its gated ones (those are
read by gatednorm and verified on A.X-K2 itself: the catalogue and the axk2 architecture row). Everything else is A.X-K2's: the query up-projection over cat([norm(c), c]), each head's
rows [query | gate], sigmoid(gate) on the attention output, the top-k indexer, the sigmoid router with its
correction bias, the fused experts and the dense first layer. Saved from the remote code itself (no conversion
table for its model type), at the latent sizes vLLM's CPU MLA kernel takes.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from ckpt_factory import edit_once, lab_modeling_source

NAME = "axk2lab"
ARCHITECTURE = "Axk2labForCausalLM"
# catalogue.LATENT_SIZES and the MoE shrink the axk2 rows use
SIZES = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "head_dim": 64, "q_lora_rank": 96, "qk_nope_head_dim": 32,
         "v_head_dim": 32, "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
         "moe_intermediate_size": 64, "n_group": 1, "topk_group": 1, "bos_token_id": 1, "eos_token_id": 2}


def modeling_source() -> str:
    text = lab_modeling_source("axk2", "AXK2Config", NAME, "Axk2labConfig")
    assert text.count("self.q_gate_proj") == 2
    text = text.replace("self.q_gate_proj", "self.q_b_proj")
    text = edit_once(text, "        self.input_layernorm = AXK2GatedRMSNorm(config)\n",
                 "        self.input_layernorm = AXK2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)\n")
    text = edit_once(text, "            AXK2GatedRMSNorm(config)\n            if config.mlp_layer_types[layer_idx] == \"sparse\"\n",
                 "            AXK2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)\n"
                 "            if config.mlp_layer_types[layer_idx] == \"sparse\"\n")
    # The gated norm's classes go with it (no layer builds them).
    start, end = text.index("class AXK2GateMLP(nn.Module):"), text.index("class AXK2RotaryEmbedding(nn.Module):")
    text = text[:start] + text[end:]
    return text.replace("AXK2ForCausalLM", ARCHITECTURE)


CONFIGURATION = f'''from transformers.models.axk2.configuration_axk2 import AXK2Config


class Axk2labConfig(AXK2Config):
    model_type = "{NAME}"
'''


def build(out: Path, *, seed: int = 0, std: float = 0.08, groups: int | None = 1) -> Path:
    """Write the checkpoint into `out` (created; replaced if there) and return it. `groups`: n_group and topk_group
    (None: A.X-K2-Light's routing without expert groups, the code's group scoring skipped)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from scaffold.tiny import randomize, tiny_sizes

    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    code = Path(tempfile.mkdtemp(prefix=f".{out.name}-code-", dir=out.parent))
    try:
        (code / f"configuration_{NAME}.py").write_text(CONFIGURATION)
        (code / f"modeling_{NAME}.py").write_text(modeling_source())
        from transformers.models.axk2.configuration_axk2 import AXK2Config

        config = AXK2Config(**tiny_sizes({**SIZES, "n_group": groups, "topk_group": groups})).to_dict()
        config.update(model_type=NAME, architectures=[ARCHITECTURE],
                      auto_map={"AutoConfig": f"configuration_{NAME}.Axk2labConfig",
                                "AutoModelForCausalLM": f"modeling_{NAME}.{ARCHITECTURE}"})
        (code / "config.json").write_text(json.dumps(config, indent=2))
        loaded = AutoConfig.from_pretrained(code, trust_remote_code=True)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(loaded, trust_remote_code=True, dtype=torch.float32)
        randomize(model, std)
        model.save_pretrained(out, safe_serialization=True)
        for file in (f"configuration_{NAME}.py", f"modeling_{NAME}.py"):
            shutil.copy(code / file, out / file)
        saved = json.loads((out / "config.json").read_text())
        saved.update(architectures=[ARCHITECTURE], auto_map=config["auto_map"])
        (out / "config.json").write_text(json.dumps(saved, indent=2))
    finally:
        shutil.rmtree(code, ignore_errors=True)
    return out
