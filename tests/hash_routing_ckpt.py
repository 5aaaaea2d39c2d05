"""A lab checkpoint whose first MoE layers route by a fixed table of token ids (hash routing, as DeepSeek-V4's first
`hash_moe` layers do), the other layers by the router's top-k:

    experts = table[token_ids];  weights = softmax(router(x)).gather(experts), renormalized where the config says

It is a tiny Qwen3-MoE from scaffold.tiny.build_tiny, shipped as remote code: transformers' own modeling file with
its relative imports made absolute, its MoE block replaced by a lab's that builds a gate of its own in the layers
below `config.hashed_layers`, and the token ids handed down from the model through the decoder layer to the block.
Written otherwise than DeepSeek-V4's (DeepseekV4HashRouter, `tid2eid`, `input_ids`, `mlp_layer_types`): the table
is an int32 buffer `expert_table` registered with register_buffer, the ids arrive as `token_ids`, the layers are
chosen by `layer_idx < config.hashed_layers` in an if statement, and the scores are a softmax (Qwen3-MoE's), not a
sqrt-softplus. The table is random, so a port that chose the experts by the router's top-k would be far from
transformers.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from ckpt_factory import stack_experts, tiny_base

NAME = "hashmoe"
ARCHITECTURE = "HashmoeForCausalLM"
OVERRIDES = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "norm_topk_prob": True,
             "mlp_only_layers": [], "num_hidden_layers": 3}

LAB_BLOCK = '''class LabTokenHashGate(nn.Module):
    """A lab's hash routing: the experts of each token come from a fixed table of token ids, weighted by the
    router's softmax at those experts."""

    def __init__(self, config):
        super().__init__()
        self.renorm = config.norm_topk_prob
        self.weight = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))
        self.register_buffer(
            "expert_table", torch.zeros(config.vocab_size, config.num_experts_per_tok, dtype=torch.int32)
        )

    def forward(self, hidden_states, token_ids):
        logits = F.linear(hidden_states, self.weight)
        probs = logits.softmax(dim=-1, dtype=torch.float)
        chosen = self.expert_table[token_ids.view(-1)].long()
        picked = torch.gather(probs, 1, chosen)
        if self.renorm:
            picked = picked / picked.sum(-1, keepdim=True)
        return logits, picked.to(logits.dtype), chosen


class Qwen3MoeSparseMoeBlock(nn.Module):
    def __init__(self, config: Qwen3MoeConfig, layer_idx: int):
        super().__init__()
        self.experts = Qwen3MoeExperts(config)
        self.hashed = layer_idx < config.hashed_layers
        if self.hashed:
            self.gate = LabTokenHashGate(config)
        else:
            self.gate = Qwen3MoeTopKRouter(config)

    def forward(self, hidden_states: torch.Tensor, token_ids: torch.Tensor | None = None) -> torch.Tensor:
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        flat = hidden_states.view(-1, hidden_dim)
        if self.hashed:
            _, weights, experts = self.gate(flat, token_ids)
        else:
            _, weights, experts = self.gate(flat)
        return self.experts(flat, experts, weights).reshape(batch_size, sequence_length, hidden_dim)


'''


def _replace(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"modeling_qwen3_moe.py: {old!r} found {text.count(old)} times"
    return text.replace(old, new)


def modeling_source() -> str:
    root = Path(next(iter(importlib.util.find_spec("transformers").submodule_search_locations)))
    text = (root / "models" / "qwen3_moe" / "modeling_qwen3_moe.py").read_text(encoding="utf-8")
    text = text.replace("from ... import", "from transformers import").replace("from ...", "from transformers.")
    text = _replace(text, "from .configuration_qwen3_moe import Qwen3MoeConfig",
                    f"from .configuration_{NAME} import HashmoeConfig as Qwen3MoeConfig")
    found = re.search(r"class Qwen3MoeSparseMoeBlock\(nn\.Module\):.*?\n(?=(@|class ))", text, flags=re.DOTALL)
    assert found, "modeling_qwen3_moe.py: no class Qwen3MoeSparseMoeBlock"
    text = text[:found.start()] + LAB_BLOCK + text[found.end():]
    # The decoder layer builds the block with its index and hands it the token ids; the model hands them over.
    text = _replace(text, "self.mlp = Qwen3MoeSparseMoeBlock(config)", "self.mlp = Qwen3MoeSparseMoeBlock(config, layer_idx)")
    text = _replace(text, "        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,\n"
                          "        **kwargs: Unpack[TransformersKwargs],\n    ) -> torch.Tensor:\n        residual",
                    "        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,\n"
                    "        token_ids: torch.Tensor | None = None,\n"
                    "        **kwargs: Unpack[TransformersKwargs],\n    ) -> torch.Tensor:\n        residual")
    text = _replace(text, "        hidden_states = self.mlp(hidden_states)\n",
                    "        hidden_states = self.mlp(hidden_states, token_ids)\n")
    text = _replace(text, "                position_embeddings=position_embeddings,\n                **kwargs,\n"
                          "            )\n\n        hidden_states = self.norm(hidden_states)",
                    "                position_embeddings=position_embeddings,\n                token_ids=input_ids,\n"
                    "                **kwargs,\n            )\n\n        hidden_states = self.norm(hidden_states)")
    return text.replace("Qwen3MoeForCausalLM", ARCHITECTURE)


def configuration() -> str:
    return '''from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig


class HashmoeConfig(Qwen3MoeConfig):
    model_type = "hashmoe"

    def __init__(self, hashed_layers=1, **kwargs):
        self.hashed_layers = hashed_layers
        super().__init__(**kwargs)
'''


def build(out: Path, *, hashed_layers: int = 1, seed: int = 0) -> Path:
    """Write the checkpoint into `out` (created; replaced if there) and return it."""
    import torch
    from safetensors.torch import save_file


    out = Path(out)
    tensors, config = tiny_base("qwen3_moe", out, overrides=OVERRIDES, seed=seed)
    stack_experts(tensors)
    # Each token's experts in the hashed layers: distinct experts per token, drawn at random.
    generator = torch.Generator().manual_seed(seed + 1)
    vocab, experts_n, top_k = config["vocab_size"], OVERRIDES["num_experts"], OVERRIDES["num_experts_per_tok"]
    for layer in range(hashed_layers):
        table = torch.stack([torch.randperm(experts_n, generator=generator)[:top_k] for _ in range(vocab)])
        tensors[f"model.layers.{layer}.mlp.gate.expert_table"] = table.to(torch.int32).contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.update(model_type=NAME, architectures=[ARCHITECTURE], hashed_layers=hashed_layers,
                  auto_map={"AutoConfig": f"configuration_{NAME}.HashmoeConfig",
                            "AutoModelForCausalLM": f"modeling_{NAME}.{ARCHITECTURE}"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / f"configuration_{NAME}.py").write_text(configuration())
    (out / f"modeling_{NAME}.py").write_text(modeling_source())
    return out
