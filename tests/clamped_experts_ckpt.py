"""A lab checkpoint whose routed experts clamp gate and up before the SiLU, the way HY-V4 and GLM-5-Next do:

    silu(gate.clamp(max=L)) * up.clamp(-L, L)

It is a tiny Qwen3-MoE (softmax top-k routing) or GLM-4-MoE (HY-V4's routing: sigmoid scores, a correction bias,
expert groups, a scaling factor; shared experts) from scaffold.tiny.build_tiny, shipped as remote code:
transformers' own modeling file with its relative imports made absolute and its experts class replaced by a lab's, written otherwise than HY-V4's
(no `_apply_gate`, no @use_experts_implementation, torch.clamp with a positional bound, silu spelled as
g * sigmoid(g), the bound in a config key of its own, `expert_clip`). The default bound is well inside the
range of the tiny model's gate and up values, so a port without the clamp is far from transformers.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from ckpt_factory import stack_experts, tiny_base

NAME = "clampmoe"
ARCHITECTURE = "ClampmoeForCausalLM"
# base model_type -> (its classes' prefix, its config class, the config key of the expert count, tiny overrides)
BASES = {
    "qwen3_moe": ("Qwen3Moe", "Qwen3MoeConfig", "num_experts",
                  {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "norm_topk_prob": True,
                   "mlp_only_layers": [1]}),
    "glm4_moe": ("Glm4Moe", "Glm4MoeConfig", "n_routed_experts",
                 {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "n_routed_experts": 8,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 64, "n_shared_experts": 2, "n_group": 4,
                  "topk_group": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "first_k_dense_replace": 1}),
}

LAB_EXPERTS = '''class Qwen3MoeExperts(nn.Module):
    """A lab's experts: every expert's [gate; up] rows in one 3-D tensor, both clipped to expert_clip."""

    def __init__(self, config):
        super().__init__()
        self.n_routed = config.num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(config.num_experts, 2 * config.moe_intermediate_size,
                                                     config.hidden_size))
        self.down_proj = nn.Parameter(torch.empty(config.num_experts, config.hidden_size,
                                                  config.moe_intermediate_size))
        self.clip = config.expert_clip

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = hidden_states.new_zeros(hidden_states.shape)
        for e in range(self.n_routed):
            rows, slots = torch.nonzero(top_k_index == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            projected = nn.functional.linear(hidden_states[rows], self.gate_up_proj[e])
            g, u = projected.chunk(2, dim=-1)
            g = torch.clamp(g, max=self.clip)
            u = torch.clamp(u, -self.clip, self.clip)
            y = nn.functional.linear(g * torch.sigmoid(g) * u, self.down_proj[e])
            out.index_add_(0, rows, y * top_k_weights[rows, slots].unsqueeze(-1))
        return out


'''


def modeling_source(base: str = "qwen3_moe") -> str:
    prefix, config_class, count, _ = BASES[base]
    root = Path(next(iter(importlib.util.find_spec("transformers").submodule_search_locations)))
    text = (root / "models" / base / f"modeling_{base}.py").read_text(encoding="utf-8")
    text = text.replace("from ... import", "from transformers import").replace("from ...", "from transformers.")
    assert text.count(f"from .configuration_{base} import {config_class}") == 1
    text = text.replace(f"from .configuration_{base} import {config_class}",
                        f"from .configuration_{NAME} import ClampmoeConfig as {config_class}")
    # The experts class, its decorator included, up to the next class: replaced whole.
    found = re.search(rf"@use_experts_implementation\nclass {prefix}Experts\(nn\.Module\):.*?\n(?=class )", text,
                      flags=re.DOTALL)
    assert found, f"modeling_{base}.py: no @use_experts_implementation class {prefix}Experts"
    lab = LAB_EXPERTS.replace("Qwen3MoeExperts", f"{prefix}Experts").replace("config.num_experts", f"config.{count}")
    text = text[:found.start()] + lab + text[found.end():]
    return text.replace(f"{prefix}ForCausalLM", ARCHITECTURE)


def configuration(base: str = "qwen3_moe") -> str:
    config_class = BASES[base][1]
    return f'''from transformers.models.{base}.configuration_{base} import {config_class}


class ClampmoeConfig({config_class}):
    model_type = "{NAME}"

    def __init__(self, expert_clip=0.25, **kwargs):
        self.expert_clip = expert_clip
        super().__init__(**kwargs)
'''


def build(out: Path, *, base: str = "qwen3_moe", clip: float = 0.25, seed: int = 0) -> Path:
    """Write the checkpoint into `out` (created; replaced if there) and return it."""
    from safetensors.torch import save_file


    out = Path(out)
    tensors, config = tiny_base(base, out, overrides=BASES[base][3], seed=seed)
    stack_experts(tensors)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.update(model_type=NAME, architectures=[ARCHITECTURE], expert_clip=clip,
                  auto_map={"AutoConfig": f"configuration_{NAME}.ClampmoeConfig",
                            "AutoModelForCausalLM": f"modeling_{NAME}.{ARCHITECTURE}"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / f"configuration_{NAME}.py").write_text(configuration(base))
    (out / f"modeling_{NAME}.py").write_text(modeling_source(base))
    return out
