"""DBRX's forms read from the code (never run): a norm-attention block nested in the decoder layer, inlined and read as
the usual layer (scaffold.detect.nested); experts stored flattened, their roles and sizes (scaffold.detect.subconfigs);
top-k weights divided by their p-norm (scaffold.detect.routing). Each on transformers' file and on a lab's module
written otherwise."""

from __future__ import annotations

from types import SimpleNamespace

from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import blocks, dataflow, subconfigs
from scaffold.detect.routing import routing


def _layer0(shapes: dict) -> dict:
    return {name: SimpleNamespace(shape=shape) for name, shape in shapes.items()}


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(code.splitlines(), 1) if text in line)


DBRX_CONFIG = {"d_model": 128, "attn_config": {"kv_n_heads": 2, "clip_qkv": None, "attn_pdrop": 0.0},
               "ffn_config": {"ffn_hidden_size": 64, "hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2,
                              "moe_normalize_expert_weights": 1.0, "ffn_act_fn": {"name": "silu"}}}


def test_dbrx_block_is_inlined_and_read_as_the_pre_norm_layer():
    code = transformers_code("dbrx")
    found = dataflow.layer_block(code, "blocks")
    assert (found.attr, found.block) == ("norm_attn_norm", "DbrxNormAttentionNorm")
    line = _line(code["modeling_dbrx.py"], "resid_states, hidden_states = self.norm_attn_norm(")
    assert found.evidence.startswith(f"modeling_dbrx.py:{line}: resid_states, hidden_states = self.norm_attn_norm(")
    layer = dataflow.analyze_layer(code, DBRX_CONFIG, "blocks")
    assert (layer.attention, layer.mlp) == ("attn", "ffn")
    assert layer.norms == {"attn_norm": "norm_1", "mlp_norm": "norm_2"}
    assert layer.mlp_norm_parallel is False  # norm_2 reads the attention's residual sum: sequential
    assert layer.attention_flow.layout == "fused" and layer.attention_flow.q == "Wqkv"
    # Inlined, the block is no longer refused.
    assert blocks.norm_attention_block(code, "blocks", _layer0({"attn.Wqkv.weight": [256, 128]})) is None


# A lab's layer nested otherwise: the block `pre` holds the attention's norm and the attention and returns one
# tensor, the residual sum; the layer keeps the MLP's norm itself. Other names throughout.
LAB_BLOCK = "\n" + LAB_PRELUDE + '''class LabMix(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.wq = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self.wk = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self.wv = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self.wo = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, x, mask):
        return self.wo(F.scaled_dot_product_attention(self.wq(x), self.wk(x), self.wv(x), attn_mask=mask))


class LabPre(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_a = LabRMSNorm(cfg.hidden_size)
        self.mix = LabMix(cfg)

    def forward(self, h, mask=None):
        x = self.ln_a(h)
        return h + self.mix(x, mask)


class LabFF(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.w_in = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.w_out = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.w_out(F.gelu(self.w_in(x)))


class LabLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.pre = LabPre(cfg)
        self.ln_b = LabRMSNorm(cfg.hidden_size)
        self.ff = LabFF(cfg)

    def forward(self, x, mask):
        x = self.pre(x, mask=mask)
        return x + self.ff(self.ln_b(x))


class LabModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.stack = nn.ModuleList([LabLayer(cfg) for _ in range(cfg.num_hidden_layers)])
'''
LAB_LAYER0 = _layer0({"pre.ln_a.weight": [64], "ln_b.weight": [64], "ff.w_in.weight": [128, 64],
                      "ff.w_out.weight": [64, 128], **{f"pre.mix.{p}.weight": [64, 64] for p in ("wq", "wk", "wv", "wo")}})


def test_a_lab_block_nested_otherwise_is_read_as_the_pre_norm_layer():
    code = {"modeling_lab.py": LAB_BLOCK}
    found = dataflow.layer_block(code, "stack")
    assert (found.attr, found.block) == ("pre", "LabPre")
    layer = dataflow.analyze_layer(code, {}, "stack")
    assert (layer.attention, layer.mlp) == ("mix", "ff")
    assert layer.norms == {"attn_norm": "ln_a", "mlp_norm": "ln_b"}
    assert layer.mlp_norm_parallel is False


def test_a_block_the_inlining_cannot_follow_stays_refused_by_name():
    """A block whose forward returns early under a condition, or calls a method of its own, is not inlined: the
    refusal names it as before."""
    for variant in (LAB_BLOCK.replace("        x = self.ln_a(h)\n",
                                      "        if mask is None:\n            return h\n        x = self.ln_a(h)\n"),
                    LAB_BLOCK.replace("        x = self.ln_a(h)\n", "        x = self.normed(h)\n").replace(
                        "class LabFF", "    def normed(self, h):\n        return self.ln_a(h)\n\n\nclass LabFF")):
        assert variant != LAB_BLOCK
        code = {"modeling_lab.py": variant}
        assert dataflow.layer_block(code, "stack") is None
        assert dataflow.analyze_layer(code, {}, "stack").attention is None
    returned_pair = LAB_BLOCK.replace("        return h + self.mix(x, mask)\n",
                                      "        if mask is None:\n            return h, h\n        s = h + self.mix(x, mask)\n"
                                      "        return s, self.ln_a(s)\n").replace(
        "        x = self.pre(x, mask=mask)\n", "        x, y = self.pre(x, mask=mask)\n")
    found = blocks.norm_attention_block({"modeling_lab.py": returned_pair}, "stack", LAB_LAYER0)
    assert found is not None and found.startswith("attention inside a block that also holds the layer norms: pre "
                                                  "(LabPre, modeling_lab.py:")


DBRX_FLAT = _layer0({"ffn.experts.mlp.w1": [256, 128], "ffn.experts.mlp.v1": [256, 128],
                     "ffn.experts.mlp.w2": [256, 128]})


def test_dbrx_flattened_experts_roles_storage_and_sizes():
    code = transformers_code("dbrx")
    flat = subconfigs.flattened_experts(code, DBRX_FLAT)
    read = subconfigs.flattened_roles(code, flat, DBRX_CONFIG)
    assert (read.gate, read.up, read.down) == ("w1", "v1", "w2")
    assert read.in_out == {"w2"}  # intermediate_states.matmul(expert_w2): each slice [width, hidden] = [in, out]
    assert (read.width, read.count) == ("ffn_config.ffn_hidden_size", "ffn_config.moe_num_experts")
    line = _line(code["modeling_dbrx.py"], "intermediate_states = gate_proj * up_proj")
    assert read.evidence == f"modeling_dbrx.py:{line}: intermediate_states = gate_proj * up_proj"
    assert subconfigs.flat_activation(code, flat, DBRX_CONFIG)[0] == "silu"
    gelu = {**DBRX_CONFIG, "ffn_config": {**DBRX_CONFIG["ffn_config"], "ffn_act_fn": {"name": "gelu"}}}
    assert subconfigs.flat_activation(code, flat, gelu)[0] == "gelu"


# A lab's flattened experts: its own names, the math inline in a loop over the experts, F.linear with every slice
# stored [out, in] (the down projection's rows are the hidden size), the count and width from the top-level config.
LAB_FLAT = "\n" + LAB_PRELUDE + '''class LabBank(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n = cfg.n_experts
        self.width = cfg.expert_width
        self.up_w = nn.Parameter(torch.empty(self.n * self.width, cfg.hidden_size))
        self.gate_w = nn.Parameter(torch.empty(self.n * self.width, cfg.hidden_size))
        self.down_w = nn.Parameter(torch.empty(self.n * cfg.hidden_size, self.width))

    def forward(self, x, chosen, weights):
        out = torch.zeros_like(x)
        for e in range(self.n):
            u = self.up_w.view(self.n, self.width, -1)[e]
            g = self.gate_w.view(self.n, self.width, -1)[e]
            d = self.down_w.reshape(self.n, -1, self.width)[e]
            h = F.silu(F.linear(x, g)) * F.linear(x, u)
            out = out + F.linear(h, d) * weights[:, e:e + 1]
        return out
'''
LAB_FLAT_LAYER0 = _layer0({"moe.bank.up_w": [4 * 32, 64], "moe.bank.gate_w": [4 * 32, 64],
                           "moe.bank.down_w": [4 * 64, 32]})


def test_a_labs_flattened_experts_are_read_from_what_they_compute():
    code = {"modeling_lab.py": LAB_FLAT}
    flat = subconfigs.flattened_experts(code, LAB_FLAT_LAYER0)
    assert flat.cls == "LabBank" and set(flat.params) == {"up_w", "gate_w", "down_w"}
    read = subconfigs.flattened_roles(code, flat, {"n_experts": 4, "expert_width": 32, "hidden_size": 64})
    assert (read.gate, read.up, read.down, read.in_out) == ("gate_w", "up_w", "down_w", frozenset())
    assert (read.width, read.count) == ("expert_width", "n_experts")
    # The activation on the other operand: the roles follow the code, not the names.
    swapped = LAB_FLAT.replace("F.silu(F.linear(x, g)) * F.linear(x, u)", "F.linear(x, g) * F.silu(F.linear(x, u))")
    read = subconfigs.flattened_roles({"modeling_lab.py": swapped}, flat, {})
    assert (read.gate, read.up) == ("up_w", "gate_w")
    # A product the port's experts do not compute (no activation) is named.
    plain = LAB_FLAT.replace("F.silu(F.linear(x, g))", "F.linear(x, g)")
    assert "otherwise than down(act(gate(x)) * up(x))" in subconfigs.flattened_roles({"modeling_lab.py": plain},
                                                                                     flat, {})


def test_dbrx_p_norm_division_is_read_with_its_order_and_guard():
    """DBRX divides its top-k weights by torch.norm(p=self.moe_normalize_expert_weights) under `is not None`:
    the order and guard are read, so moe.py can decide from config.json (p = 1: the sum) instead of refusing."""
    found = routing(transformers_code("dbrx"), "experts")
    assert found.norm_division.startswith("line ") and "torch.norm(" in found.norm_division
    assert (found.norm_p_attr, found.norm_guard) == ("moe_normalize_expert_weights", "moe_normalize_expert_weights")
    assert ("moe_normalize_expert_weights", "ffn_config.moe_normalize_expert_weights") in found.config_attrs
    assert found.problem() is None


LAB_ROUTER = '''
import torch
import torch.nn as nn


class Picker(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.score = nn.Linear(cfg.d, cfg.n, bias=False)
        self.order = cfg.route_norm
        self.k = cfg.k

    def forward(self, x):
        probs = self.score(x).softmax(-1)
        top, idx = probs.topk(self.k, dim=-1)
        if self.order is not None:
            denominator = top.norm(self.order, dim=-1, keepdim=True)
            top = top / denominator
        return top, idx


class Bank(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.picker = Picker(cfg)
        self.pool = nn.ModuleList([nn.Linear(cfg.d, cfg.d) for _ in range(cfg.n)])

    def forward(self, x):
        top, idx = self.picker(x)
        return x
'''


def test_a_labs_p_norm_in_a_local_is_read_with_its_order_and_guard():
    found = routing({"modeling_lab.py": LAB_ROUTER}, "pool")
    assert (found.norm_p_attr, found.norm_guard) == ("order", "order")
    assert ("order", "route_norm") in found.config_attrs and found.problem() is None
    # A norm of a fixed order (not read from the config) stays refused by name.
    fixed = LAB_ROUTER.replace("top.norm(self.order, dim=-1, keepdim=True)", "top.norm(2, dim=-1, keepdim=True)")
    assert "routing weights divided by a norm" in routing({"modeling_lab.py": fixed}, "pool").problem()


def test_dbrx_p_null_divides_nothing_and_the_port_reads_p_at_run_time(tmp_path):
    """moe_normalize_expert_weights null: the code's `is not None` guard skips the division, so the weights are not
    renormalized; the port still reads p from the config (moe_pnorm) and refuses a config with another p."""
    from scaffold.checkpoint import read_checkpoint
    from scaffold.detect import detect
    from scaffold.tiny import build_tiny

    build_tiny("dbrx", tmp_path / "ckpt", architecture="LabDbrxForCausalLM", overrides={
        "d_model": 128, "attn_config": {"rope_theta": 10000.0, "kv_n_heads": 2, "clip_qkv": 8.0},
        "ffn_config": {"moe_num_experts": 4, "moe_top_k": 2, "ffn_hidden_size": 64,
                       "moe_normalize_expert_weights": None}})
    spec = detect(read_checkpoint(tmp_path / "ckpt"))
    assert (spec.moe_pnorm, spec.moe_norm_p, spec.moe_renormalize) == (True, None, False)
    assert spec.source("moe_norm_p").expr == "config.ffn_config.moe_normalize_expert_weights"
    assert (spec.layer_block, spec.experts_layout, spec.flat_in_out) == ("norm_attn_norm", "flattened", ["flat_down"])
    assert spec.source("num_kv_heads").expr == "config.attn_config.kv_n_heads"
    assert spec.source("num_experts_per_tok").expr == "config.ffn_config.moe_top_k"


def test_dbrx_activation_names_its_config_table(tmp_path):
    """DBRX reads ffn_act_fn only for its "name": the experts' activation's provenance names the table, so verify
    counts the key as read."""
    from scaffold.checkpoint import read_checkpoint
    from scaffold.detect import detect
    from scaffold.detect.configreads import accounted_keys, unaccounted_reads
    from scaffold.tiny import build_tiny

    ckpt_dir = build_tiny("dbrx", tmp_path / "ckpt", architecture="LabDbrxForCausalLM", overrides={
        "d_model": 128, "attn_config": {"rope_theta": 10000.0, "kv_n_heads": 2, "clip_qkv": 8.0},
        "ffn_config": {"moe_num_experts": 4, "moe_top_k": 2, "ffn_hidden_size": 64}})
    ckpt = read_checkpoint(ckpt_dir)
    spec = detect(ckpt)
    assert "the 'name' of config.json ffn_config.ffn_act_fn" in spec.source("hidden_act").detail
    assert "ffn_act_fn" not in unaccounted_reads(ckpt, accounted_keys(spec.provenance))
