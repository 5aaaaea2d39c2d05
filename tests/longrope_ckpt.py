"""A lab checkpoint whose remote code applies LongRoPE the way MiniCPM4's does, not the way Phi-3's does.

The rotary table is built once, at construction, for max_position_embeddings positions; a subclass picks its
per-frequency divisors when it builds: the long factors where the table is longer than
original_max_position_embeddings (so, with max_position_embeddings past the original length, at every position,
short sequences included), the short ones otherwise, and scales cos and sin by sqrt(1 + ln(s) / ln(original)),
s = max_position_embeddings / original. The module is built by a method of the decoder stack (`_init_rope`) with
its arguments spelled out (short_factor=..., long_factor=...). vLLM's Phi3LongRoPEScaledRotaryEmbedding picks by
the engine's max_model_len instead, so a port that hands it the config's factors diverges where max_model_len is
at most the original length (the verifier's 256 here).

The lab is a tiny Llama shipped as remote code: transformers' own modeling_llama.py with its relative imports made
absolute, the classes renamed, and its rotary replaced by the module below (written for this lab).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ckpt_factory import edit_once, lab_modeling_source

NAME = "longlab"
ARCHITECTURE = "LonglabForCausalLM"
ORIGINAL = 256
LONGEST = 512

ROTARY = '''

class LonglabCachedRotary(nn.Module):
    """cos/sin of every position up to `length`, computed once."""

    def __init__(self, dim, length=2048, base=10000.0):
        super().__init__()
        self.dim = dim
        self.length = length
        self.base = base
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.build_tables(length)

    def build_tables(self, length):
        t = torch.arange(length, dtype=torch.float32)
        angles = torch.outer(t, self.inv_freq)
        both = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos_table", both.cos(), persistent=False)
        self.register_buffer("sin_table", both.sin(), persistent=False)

    def forward(self, x, position_ids):
        return self.cos_table[position_ids].to(x.dtype), self.sin_table[position_ids].to(x.dtype)


class LonglabScaledRotary(LonglabCachedRotary):
    """Divisors per frequency: the long set for a table past the original length, else the short set."""

    def __init__(self, dim, length, base, short_factor, long_factor, original_length):
        self.short_factor = short_factor
        self.long_factor = long_factor
        self.original_length = original_length
        ratio = length / original_length
        self.magnitude = math.sqrt(1 + math.log(ratio) / math.log(original_length)) if ratio > 1 else 1.0
        super().__init__(dim, length, base)

    def build_tables(self, length):
        if length > self.original_length:
            divisors = torch.tensor(self.long_factor, dtype=torch.float32)
        else:
            divisors = torch.tensor(self.short_factor, dtype=torch.float32)
        t = torch.arange(length, dtype=torch.float32)
        angles = torch.outer(t, self.inv_freq / divisors)
        both = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos_table", both.cos() * self.magnitude, persistent=False)
        self.register_buffer("sin_table", both.sin() * self.magnitude, persistent=False)
'''

INIT_ROPE = '''
    def _init_rope(self, config):
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        scaling = config.rope_parameters
        self.rotary_emb = LonglabScaledRotary(
            head_dim,
            length=config.max_position_embeddings,
            base=scaling["rope_theta"],
            short_factor=scaling["short_factor"],
            long_factor=scaling["long_factor"],
            original_length=scaling["original_max_position_embeddings"],
        )
'''

# transformers 5 builds the model on the meta device: non-persistent buffers come back as uninitialized memory
# after from_pretrained unless _init_weights computes them.
INIT_WEIGHTS = '''
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, LonglabCachedRotary):
            module.inv_freq = 1.0 / (module.base ** (torch.arange(0, module.dim, 2, dtype=torch.float32) / module.dim))
            module.build_tables(module.length)
'''


def modeling_source() -> str:
    text = lab_modeling_source("llama", "LlamaConfig", NAME, "LonglabConfig", before="import math\n\n")
    text = edit_once(text, "\n\n@auto_docstring\nclass LlamaPreTrainedModel(PreTrainedModel):",
                 ROTARY + "\n\n@auto_docstring\nclass LlamaPreTrainedModel(PreTrainedModel):")
    text = edit_once(text, '''        "attentions": LlamaAttention,
    }
''', '''        "attentions": LlamaAttention,
    }
''' + INIT_WEIGHTS)
    text = edit_once(text, "        self.rotary_emb = LlamaRotaryEmbedding(config=config)\n", "        self._init_rope(config)\n")
    text = _insert_init_rope(text)
    return text.replace("LlamaForCausalLM", ARCHITECTURE)


def _insert_init_rope(text: str) -> str:
    """_init_rope placed after LlamaModel.__init__ (before its forward)."""
    head = text.index("class LlamaModel(LlamaPreTrainedModel):")
    forward = text.index("    def forward(", head)
    start = text.rfind("\n\n", head, forward)
    return text[:start] + "\n" + INIT_ROPE + text[start:]


CONFIGURATION = f'''from transformers.models.llama.configuration_llama import LlamaConfig


class LonglabConfig(LlamaConfig):
    model_type = "{NAME}"
'''


def build(out: Path, *, seed: int = 0, longest: int = LONGEST, original: int = ORIGINAL) -> Path:
    """Write the checkpoint into `out` (created; replaced if there) and return it."""
    from scaffold.tiny import build_tiny

    out = Path(out)
    base = build_tiny("llama", out.parent / f".{out.name}-llama", seed=seed)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(base, out)
    shutil.rmtree(base)
    config = json.loads((out / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    half = head_dim // 2
    config.pop("rope_scaling", None)
    config.update(model_type=NAME, architectures=[ARCHITECTURE], max_position_embeddings=longest,
                  rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                   "original_max_position_embeddings": original,
                                   "short_factor": [1.0 + 0.25 * k for k in range(half)],
                                   "long_factor": [1.0 + 0.75 * k for k in range(half)]},
                  auto_map={"AutoConfig": f"configuration_{NAME}.LonglabConfig",
                            "AutoModelForCausalLM": f"modeling_{NAME}.{ARCHITECTURE}"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / f"configuration_{NAME}.py").write_text(CONFIGURATION)
    (out / f"modeling_{NAME}.py").write_text(modeling_source())
    return out
