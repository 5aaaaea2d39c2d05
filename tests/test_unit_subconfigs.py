"""Two forms a refusal names behind DBRX's norm-attention block, read from the code (never run): sizes the code reads
from sub-configs (config.json keys holding dicts, read by attribute or handed to a class as its config), and experts
stored flattened (one 2-D parameter per projection holding every expert's rows, viewed per expert in forward)."""

from __future__ import annotations

from types import SimpleNamespace

from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import subconfigs


def _layer0(shapes: dict) -> dict:
    return {name: SimpleNamespace(shape=shape) for name, shape in shapes.items()}


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(code.splitlines(), 1) if text in line)


DBRX_CONFIG = {"d_model": 128, "attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "attn_pdrop": 0.0},
               "ffn_config": {"ffn_hidden_size": 64, "hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2,
                              "moe_normalize_expert_weights": 1.0, "moe_jitter_eps": None}}


def test_dbrx_reads_its_sizes_from_two_sub_configs():
    code = transformers_code("dbrx")["modeling_dbrx.py"]
    reads = subconfigs.subconfig_reads(transformers_code("dbrx"), DBRX_CONFIG)
    # Through a local (attn_config = config.attn_config), directly (config.ffn_config.moe_top_k), and in the classes
    # built with the sub-config as their config (DbrxRouter(config.ffn_config): its config.hidden_size).
    assert {"attn_config.kv_n_heads", "attn_config.clip_qkv", "ffn_config.moe_top_k", "ffn_config.moe_num_experts",
            "ffn_config.ffn_hidden_size", "ffn_config.hidden_size"} <= set(reads.reads)
    assert [(k, c) for k, c, _ in reads.handed] == [("ffn_config", "DbrxRouter"), ("ffn_config", "DbrxExperts")]
    assert reads.first == f"modeling_dbrx.py:{_line(code, 'self.attention_dropout = attn_config.attn_pdrop')}"
    assert reads.sizes(DBRX_CONFIG) == ("attn_config.kv_n_heads", "ffn_config.ffn_hidden_size",
                                        "ffn_config.hidden_size", "ffn_config.moe_num_experts", "ffn_config.moe_top_k")


def test_a_family_with_a_flat_config_reads_no_sub_config():
    assert subconfigs.subconfig_reads(transformers_code("mixtral"), {"num_local_experts": 4}) is None
    # rope_parameters is a dict of config.json, but no sub-config of sizes.
    assert subconfigs.subconfig_reads(transformers_code("llama"), {"rope_parameters": {"rope_theta": 1e4}}) is None


# A lab's MoE written unlike DBRX's: the sub-config is called `moe`, kept on the block as an attribute, handed to the
# experts class under a keyword, and the experts keep their flattened matrices as `up`, `gate`, `down` built with
# torch.zeros over a tuple and reshaped per expert with the count first.
LAB_MOE = "\n" + LAB_PRELUDE + '''class LabExperts(nn.Module):
    def __init__(self, config):
        super().__init__()
        n_exp, d_ff, d_model = config.n_experts, config.d_ff, config.d_model
        self.gate = nn.Parameter(torch.zeros((n_exp * d_ff, d_model)))
        self.up = nn.Parameter(torch.zeros((n_exp * d_ff, d_model)))
        self.down = nn.Parameter(torch.zeros((n_exp * d_ff, d_model)))
        self.n_exp, self.d_ff = n_exp, d_ff

    def forward(self, x, e):
        g = self.gate.reshape(self.n_exp, self.d_ff, -1)[e]
        u = self.up.reshape(self.n_exp, self.d_ff, -1)[e]
        d = self.down.reshape(self.n_exp, self.d_ff, -1)[e]
        return (F.silu(x @ g.T) * (x @ u.T)) @ d


class LabMoE(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.moecfg = config.moe
        self.k = self.moecfg.top_k
        self.router = nn.Linear(config.hidden_size, self.moecfg.n_experts, bias=False)
        self.experts = LabExperts(config=config.moe)
'''
LAB_CONFIG = {"hidden_size": 64, "moe": {"n_experts": 4, "d_ff": 32, "d_model": 64, "top_k": 2, "jitter": 0.1}}
LAB_LAYER0 = _layer0({"moe.router.weight": [4, 64], **{f"moe.experts.{p}": [128, 64] for p in ("gate", "up", "down")}})


def test_a_lab_sub_config_kept_as_an_attribute_and_handed_by_keyword_is_read():
    reads = subconfigs.subconfig_reads({"modeling_lab.py": LAB_MOE}, LAB_CONFIG)
    assert set(reads.reads) == {"moe.top_k", "moe.n_experts", "moe.d_ff", "moe.d_model"}
    assert [(k, c) for k, c, _ in reads.handed] == [("moe", "LabExperts")]
    assert reads.describe(LAB_CONFIG) == ("moe.d_ff, moe.d_model, moe.n_experts, moe.top_k "
                                          f"(modeling_lab.py:{_line(LAB_MOE, 'n_exp, d_ff, d_model = config')})")


def test_dbrx_experts_stored_flattened_are_named():
    code = transformers_code("dbrx")["modeling_dbrx.py"]
    layer0 = _layer0({f"ffn.experts.mlp.{p}": [256, 128] for p in ("w1", "v1", "w2")})
    flat = subconfigs.flattened_experts(transformers_code("dbrx"), layer0)
    assert (flat.cls, flat.params) == ("DbrxExpertGLU", ("w1", "v1", "w2"))
    assert flat.declared == (f"modeling_dbrx.py:{_line(code, 'self.w1 = nn.Parameter(')}: nn.Parameter(torch.empty("
                             "self.moe_num_experts * self.ffn_hidden_size, self.hidden_size))")
    assert flat.viewed == (f"modeling_dbrx.py:{_line(code, 'v1 = self.mlp.v1.view(')}: v1 viewed as (-1, "
                           "self.ffn_hidden_size, self.hidden_size)")


def test_a_lab_flattened_experts_are_named_and_3d_or_unviewed_ones_are_not():
    flat = subconfigs.flattened_experts({"modeling_lab.py": LAB_MOE}, LAB_LAYER0)
    assert (flat.cls, flat.params) == ("LabExperts", ("gate", "up", "down"))
    assert flat.viewed == (f"modeling_lab.py:{_line(LAB_MOE, 'g = self.gate.reshape(')}: gate viewed as (self.n_exp, "
                           "self.d_ff, -1)")
    # Stored 3-D (transformers 5's fused experts): no product in the first size, the stacked detector's form.
    stacked = LAB_MOE.replace("torch.zeros((n_exp * d_ff, d_model))", "torch.zeros((n_exp, d_ff, d_model))")
    assert subconfigs.flattened_experts({"modeling_lab.py": stacked}, LAB_LAYER0) is None
    # A 2-D parameter the code never views per expert is no flattened expert store.
    unviewed = LAB_MOE.replace(".reshape(self.n_exp, self.d_ff, -1)[e]", "")
    assert subconfigs.flattened_experts({"modeling_lab.py": unviewed}, LAB_LAYER0) is None
    # Nor one the checkpoint does not hold as a 2-D tensor.
    assert subconfigs.flattened_experts({"modeling_lab.py": LAB_MOE}, _layer0({"moe.router.weight": [4, 64]})) is None


# The lab's MoE in a whole decoder, its sizes in the top-level config: the flattened experts alone block the port.
LAB_DECODER_MOE = LAB_MOE.replace("self.moecfg = config.moe", "self.moecfg = config").replace(
    "config=config.moe", "config=config") + '''
    def forward(self, x):
        w, e = torch.topk(torch.softmax(self.router(x), -1), self.k)
        return self.experts(x, e) * w


class LabAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, 64, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, 64, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        q, k = apply_rope(self.q_proj(x), self.k_proj(x), cos, sin)
        return self.o_proj(F.scaled_dot_product_attention(q, k, self.v_proj(x), attn_mask=mask))


class LabLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn = LabAttention(config)
        self.mlp = LabMoE(config)
        self.input_layernorm = LabRMSNorm(config.hidden_size)
        self.post_attention_layernorm = LabRMSNorm(config.hidden_size)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = LabRMSNorm(config.hidden_size)
'''


def test_a_lab_decoder_with_flattened_experts_is_read_as_that_layout(tmp_path):
    """The lab's flattened experts in a whole decoder: gate, up and down read from what LabExperts computes (down
    multiplied as the right-hand matrix), the count and width from the config keys its declaration multiplies
    (through a tuple of locals)."""
    from ckpt_factory import Shape, config_for, tensors_for
    from helpers import detect_until, read

    from scaffold.checkpoint import read_checkpoint
    from scaffold.detect import layout

    shape = Shape(architecture="LabForCausalLM", model_type="lab_flat", layers=2)
    tensors = {k: v for k, v in tensors_for(shape).items() if ".mlp." not in k}
    for i in range(shape.layers):
        tensors[f"model.layers.{i}.mlp.router.weight"] = [4, shape.hidden]
        tensors.update({f"model.layers.{i}.mlp.experts.{p}": [4 * 32, shape.hidden] for p in ("gate", "up", "down")})
    read(tmp_path, shape, tensors=tensors,
         config={**config_for(shape), "n_experts": 4, "d_ff": 32, "d_model": shape.hidden, "top_k": 2})
    (tmp_path / "modeling_lab.py").write_text(LAB_DECODER_MOE)
    spec = detect_until(read_checkpoint(tmp_path), layout)
    assert spec.experts_layout == "flattened" and spec.flat_in_out == ["flat_down"]
    assert {r: spec.names[r] for r in ("mlp", "experts", "flat_gate", "flat_up", "flat_down")} == {
        "mlp": "mlp", "experts": "experts", "flat_gate": "experts.gate", "flat_up": "experts.up",
        "flat_down": "experts.down"}
    assert (spec.num_experts, spec.moe_intermediate_size) == (4, 32)
    assert (spec.source("num_experts").expr, spec.source("moe_intermediate_size").expr) == ("config.n_experts",
                                                                                          "config.d_ff")
