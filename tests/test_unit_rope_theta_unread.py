"""A rope_theta in config.json that the checkpoint's own code never reads (InternLM v1's remote code: its
InternLMRotaryEmbedding(head_dim, max_position_embeddings=...) is built without a base and rotates at its default
10000 whatever config.json holds). Before, the generator took config.json's rope_theta and the port read the config's
rope_parameters at run time: on a tiny InternLM checkpoint whose config.json says rope_theta 500000, verify failed
with max |dlogp| 8.04 (first divergence at layer 0's attention). The lab below is written here in that form."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape
from helpers import LAB_DECODER, LAB_PRELUDE, detect_until, read, scaffold

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import rope

LAB_CODE = "\n" + LAB_PRELUDE + '''class LabTurns(nn.Module):
    def __init__(self, dim, max_position_embeddings=2048, base=10000, device=None):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        t = torch.arange(max_position_embeddings).float()
        emb = torch.cat((torch.outer(t, inv_freq),) * 2, dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, x, seq_len=None):
        return self.cos_cached[:seq_len], self.sin_cached[:seq_len]


class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.d_head = config.hidden_size // config.num_attention_heads
        self.q_proj = nn.Linear(config.hidden_size, self.n_heads * self.d_head, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.n_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.n_heads * self.d_head, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.d_head, config.hidden_size, bias=False)
        self.rotary_emb = LabTurns(self.d_head, max_position_embeddings=config.max_position_embeddings)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        cos, sin = self.rotary_emb(v, seq_len=t)
        q, k = apply_rope(q, k, cos, sin)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(ctx.transpose(1, 2).reshape(b, t, -1))


''' + LAB_DECODER


def lab_checkpoint(root, code=LAB_CODE, theta=500000.0):
    read(root, Shape(architecture="LabForCausalLM", model_type="lab_turns", extra={"rope_theta": theta}))
    (root / "modeling_lab.py").write_text(code)
    return read_checkpoint(root)


def test_a_rope_theta_the_code_never_reads_gives_way_to_the_default_of_the_rotary_class(tmp_path):
    spec = detect_until(lab_checkpoint(tmp_path), rope)
    assert spec.rope_parameters == {"rope_theta": 10000.0, "rope_type": "default"}
    detail = spec.source("rope_parameters").detail
    assert spec.source("rope_parameters").kind == "code"
    assert "LabTurns(...) is built without its base, whose default is 10000" in detail
    assert "config.json's rope_theta is never read by the modeling code (500000.0" in detail


def test_code_that_names_rope_theta_or_passes_a_base_keeps_config_jsons_value(tmp_path):
    reads = LAB_CODE.replace("LabTurns(self.d_head, max_position_embeddings=config.max_position_embeddings)",
                             "LabTurns(self.d_head, config.max_position_embeddings, config.rope_theta)")
    assert reads != LAB_CODE
    spec = detect_until(lab_checkpoint(tmp_path / "reads", reads), rope)
    assert spec.rope_parameters["rope_theta"] == 500000.0 and spec.source("rope_parameters").kind == "config"
    # A base the build passes (a literal): the class default is not what runs, and nothing else shows the base.
    passes = LAB_CODE.replace("max_position_embeddings=config.max_position_embeddings)",
                              "max_position_embeddings=config.max_position_embeddings, base=20000)")
    assert rope._default_base({"modeling_lab.py": passes}) is None


@pytest.mark.slow  # ~4 s: generates a port
def test_the_port_writes_the_rotary_parameters_out_instead_of_reading_the_config(tmp_path):
    lab_checkpoint(tmp_path / "ckpt")
    scaffold("new", tmp_path / "ckpt", "-o", tmp_path / "port")
    model = next((tmp_path / "port").glob("*/model.py")).read_text()
    assert "# The rotary parameters the modeling code applies; config.json's rope_theta is never read by it.\n" \
           'ROPE_PARAMETERS = {"rope_theta": 10000.0, "rope_type": "default"}' in model
    assert "rope_parameters = ROPE_PARAMETERS" in model and "config.rope_parameters" not in model
