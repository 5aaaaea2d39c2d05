"""A latent attention's output gated by a projection of its own, with sinks (HY-V4's gate_proj and sinks): the gate
read from what the attention's forward computes (layout._latent_output_gate), in transformers' file and in a lab's
module written otherwise; a gate whose product does not reach the output projection is not taken."""

from __future__ import annotations

from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import layout

# A lab's latent attention: other names (out_gate, proj_out, latent_up), the attention by
# F.scaled_dot_product_attention (one value returned), the gate on the left of the product, tanh, and the gated
# context reshaped before the output projection.
LAB_CODE = "\n" + LAB_PRELUDE + '''class LabLatentAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.h = config.num_attention_heads
        self.dv = config.v_head_dim
        self.q_down = nn.Linear(config.hidden_size, config.q_lora_rank, bias=False)
        self.q_norm = LabRMSNorm(config.q_lora_rank)
        self.q_up = nn.Linear(config.q_lora_rank, self.h * 96, bias=False)
        self.latent_down = nn.Linear(config.hidden_size, config.kv_lora_rank + 64, bias=False)
        self.latent_norm = LabRMSNorm(config.kv_lora_rank)
        self.latent_up = nn.Linear(config.kv_lora_rank, self.h * (32 + self.dv), bias=False)
        self.out_gate = nn.Linear(config.hidden_size, self.h * self.dv, bias=False)
        self.proj_out = nn.Linear(self.h * self.dv, config.hidden_size, bias=False)
        self.sink_logits = nn.Parameter(torch.zeros(self.h))

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        gates = self.out_gate(x).view(b, t, self.h, self.dv)
        q = self.q_up(self.q_norm(self.q_down(x))).view(b, t, self.h, 96).transpose(1, 2)
        latent, k_rot = self.latent_down(x).split([self.latent_up.in_features, 64], dim=-1)
        kv = self.latent_up(self.latent_norm(latent)).view(b, t, self.h, 32 + self.dv).transpose(1, 2)
        k_pass, v = kv.split([32, self.dv], dim=-1)
        k = torch.cat([k_pass, k_rot[:, None].expand(-1, self.h, -1, -1)], dim=-1)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        ctx = ctx.transpose(1, 2)
        ctx = torch.tanh(gates) * ctx
        flat = ctx.reshape(b, t, -1)
        return self.proj_out(flat)


'''


def test_hy_v4s_gate_is_read_from_its_attention_forward():
    sources = transformers_code("hy_v4")
    gate = layout._latent_output_gate(sources, "HYV4Attention", {"gate_proj": "self_attn.linear_gate.weight",
                                                                 "sinks": "self_attn.learnable_sink_param"})
    line = next(i for i, text in enumerate(sources["modeling_hy_v4.py"].splitlines(), 1)
                if "attn_output = attn_output * torch.sigmoid(gate_states)" in text)
    assert (gate.code, gate.stored, gate.act, gate.flows) == ("gate_proj", "self_attn.linear_gate.weight", "sigmoid",
                                                              True)
    assert f"modeling_hy_v4.py:{line}" in gate.what
    # Not offered the gate's module, the reader finds none.
    assert layout._latent_output_gate(sources, "HYV4Attention", {"sinks": "self_attn.learnable_sink_param"}) is None


def test_a_labs_gate_written_otherwise_is_read():
    gate = layout._latent_output_gate({"modeling_lab.py": LAB_CODE}, "LabLatentAttention",
                                      {"out_gate": "self_attn.out_gate.weight"}, "proj_out")
    assert (gate.code, gate.act, gate.flows) == ("out_gate", "tanh", True)
    # Another output projection's name: the product does not reach it, so the gate is not the port's form.
    assert layout._latent_output_gate({"modeling_lab.py": LAB_CODE}, "LabLatentAttention",
                                      {"out_gate": "self_attn.out_gate.weight"}, "o_proj").flows is False


def test_a_gate_on_a_value_no_attention_call_returns_is_not_taken():
    # The gate scales the query before the attention: the product is not of the attention's output.
    code = LAB_CODE.replace("        ctx = torch.tanh(gates) * ctx\n", "").replace(
        "        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n",
        "        q = torch.tanh(gates.transpose(1, 2)) * q\n"
        "        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n").replace(
        "torch.tanh(gates.transpose(1, 2)) * q", "torch.tanh(g) * q").replace(
        "        gates = self.out_gate(x).view(b, t, self.h, self.dv)\n",
        "        g = self.out_gate(x).view(b, t, self.h, self.dv).transpose(1, 2)\n")
    gate = layout._latent_output_gate({"modeling_lab.py": code}, "LabLatentAttention",
                                      {"out_gate": "self_attn.out_gate.weight"}, "proj_out")
    assert gate is not None and gate.flows is False
