"""A lab's attention module named `mixer` (phi-1.5's MixFormer: layers.N.mixer.Wqkv, a fused softmax attention) is
not a state-space block: the policy check, which runs before detection, reads the code as detection does and lets
through the tensors of a module the code builds from a class its dataflow reads as attention, whether the blocks sit
in an nn.ModuleList or in an nn.Sequential between the embedding and the head. A Mamba mixer (A_log) stays refused."""

from __future__ import annotations

import json
import textwrap

import pytest
from ckpt_factory import write_shard

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import policy
from scaffold.errors import UnsupportedArchitecture

ATTENTION = textwrap.dedent('''
    import torch
    from torch import nn
    from transformers import PreTrainedModel


    class FusedAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.n_head = config.n_head
            self.head_dim = config.n_embd // config.n_head
            self.Wqkv = nn.Linear(config.n_embd, 3 * config.n_embd)
            self.out_proj = nn.Linear(config.n_embd, config.n_embd)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.Wqkv(x).split(self.n_head * self.head_dim, dim=2)
            q = q.view(b, s, self.n_head, self.head_dim).transpose(1, 2)
            k = k.view(b, s, self.n_head, self.head_dim).transpose(1, 2)
            v = v.view(b, s, self.n_head, self.head_dim).transpose(1, 2)
            attn = torch.softmax(q @ k.transpose(-1, -2) / self.head_dim ** 0.5, dim=-1)
            return self.out_proj((attn @ v).transpose(1, 2).reshape(b, s, -1))


    class Block(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.ln = nn.LayerNorm(config.n_embd)
            self.mixer = FusedAttention(config)
            self.fc1 = nn.Linear(config.n_embd, 4 * config.n_embd)
            self.fc2 = nn.Linear(4 * config.n_embd, config.n_embd)

        def forward(self, x):
            h = self.ln(x)
            return x + self.mixer(h) + self.fc2(torch.relu(self.fc1(h)))
''')

# The blocks in a ModuleList of their own (the layout detection knows).
LISTED = ATTENTION + textwrap.dedent('''

    class LabModel(PreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.wte = nn.Embedding(config.vocab_size, config.n_embd)
            self.layers = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size)

        def forward(self, input_ids):
            x = self.wte(input_ids)
            for layer in self.layers:
                x = layer(x)
            return self.lm_head(x)
''')

# phi-1.5's stack: one nn.Sequential of the embedding, the blocks and the head.
SEQUENTIAL = ATTENTION + textwrap.dedent('''

    class Embed(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.wte = nn.Embedding(config.vocab_size, config.n_embd)

        def forward(self, input_ids):
            return self.wte(input_ids)


    class Head(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.ln = nn.LayerNorm(config.n_embd)
            self.linear = nn.Linear(config.n_embd, config.vocab_size)

        def forward(self, x):
            return self.linear(self.ln(x))


    class LabModel(PreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            modules = [Embed(config)]
            modules += [Block(config) for _ in range(config.n_layer)]
            modules.append(Head(config))
            self.layers = nn.Sequential(*modules)

        def forward(self, input_ids):
            return self.layers(input_ids)
''')

E, V, L = 64, 128, 2


def _write(root, code: str, names: dict[str, list[int]]):
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({
        "architectures": ["LabModel"], "model_type": "lab_mixer", "n_embd": E, "n_head": 2, "n_layer": L,
        "vocab_size": V, "torch_dtype": "float32", "auto_map": {"AutoModelForCausalLM": "modeling_lab.LabModel"}}))
    (root / "modeling_lab.py").write_text(code)
    write_shard(root / "model.safetensors", names)
    return read_checkpoint(root)


def _block(prefix: str) -> dict[str, list[int]]:
    return {f"{prefix}.ln.weight": [E], f"{prefix}.ln.bias": [E],
            f"{prefix}.mixer.Wqkv.weight": [3 * E, E], f"{prefix}.mixer.Wqkv.bias": [3 * E],
            f"{prefix}.mixer.out_proj.weight": [E, E], f"{prefix}.mixer.out_proj.bias": [E],
            f"{prefix}.fc1.weight": [4 * E, E], f"{prefix}.fc1.bias": [4 * E],
            f"{prefix}.fc2.weight": [E, 4 * E], f"{prefix}.fc2.bias": [E]}


def test_an_attention_named_mixer_in_a_layer_list_is_not_refused_as_state_space(tmp_path):
    names = {"wte.weight": [V, E], "lm_head.weight": [V, E], "lm_head.bias": [V]}
    for i in range(L):
        names |= _block(f"layers.{i}")
    ckpt = _write(tmp_path / "listed", LISTED, names)
    policy.check(ckpt)  # refused before: "the checkpoint uses state-space (Mamba-style) blocks"


def test_an_attention_named_mixer_in_a_sequential_stack_is_not_refused_as_state_space(tmp_path):
    names = {"layers.0.wte.weight": [V, E], f"layers.{L + 1}.ln.weight": [E], f"layers.{L + 1}.ln.bias": [E],
             f"layers.{L + 1}.linear.weight": [V, E], f"layers.{L + 1}.linear.bias": [V]}
    for i in range(1, L + 1):
        names |= _block(f"layers.{i}")
    ckpt = _write(tmp_path / "sequential", SEQUENTIAL, names)
    policy.check(ckpt)  # no decoder layer list here: the module the code builds at `mixer` reads as attention


def test_a_state_space_tensor_under_an_attention_named_mixer_is_still_refused(tmp_path):
    names = {"wte.weight": [V, E], "lm_head.weight": [V, E], "lm_head.bias": [V]}
    for i in range(L):
        names |= _block(f"layers.{i}") | {f"layers.{i}.mixer.A_log": [2]}
    ckpt = _write(tmp_path / "mamba", LISTED, names)
    with pytest.raises(UnsupportedArchitecture, match="state-space"):
        policy.check(ckpt)
