"""A decoder layer of several attention/MLP sublayers and a shortcut beside them (scaffold.detect.sublayers): read as
the form the port runs (`read`: pre-norm sublayers, a shortcut MoE reading one sublayer's normed states, added to the
layer's output), or named in forms.several_attentions' refusal where it computes otherwise; identity experts and the
latent attention's LoRA scales read for the port. On transformers' LongCat-Flash and on lab modules that compute the
same form under other names, unrolled or in a loop, with identity experts written otherwise."""

from __future__ import annotations

import ast

from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import forms, sublayers
from scaffold.detect.sourcecode import _classes

LAB_PARTS = '''class LabAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.wo = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        q, k, v = self.wqkv(x).chunk(3, dim=-1)
        q, k = apply_rope(q, k, cos, sin)
        return self.wo(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


class LabFFN(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w_in = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.w_out = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        a, b = self.w_in(x).chunk(2, dim=-1)
        return self.w_out(F.silu(a) * b)


class LabBank(nn.Module):
    """Experts past the real ones pass the token on as it is."""

    def __init__(self, config):
        super().__init__()
        self.n_real = config.real_experts
        self.n_null = config.null_experts
        self.n_all = self.n_real + self.n_null
        self.score = nn.Linear(config.hidden_size, self.n_all, bias=False)
        self.ffns = nn.ModuleList([LabFFN(config) for _ in range(self.n_real)])

    def forward(self, x):
        probs = self.score(x).softmax(-1)
        w, which = probs.topk(2, dim=-1)
        out = torch.zeros_like(x)
        for slot in range(2):
            for e in range(self.n_all):
                sel = which[..., slot] == e
                if e > self.n_real - 1:
                    y = x[sel]
                else:
                    y = self.ffns[e](x[sel])
                out[sel] += w[..., slot][sel, None] * y
        return out


'''

LAB_UNROLLED = LAB_PARTS + '''class LabBlock(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attns = nn.ModuleList([LabAttention(config), LabAttention(config)])
        self.ffns = nn.ModuleList([LabFFN(config), LabFFN(config)])
        self.pre_norms = nn.ModuleList([LabRMSNorm(config.hidden_size) for _ in range(2)])
        self.mid_norms = nn.ModuleList([LabRMSNorm(config.hidden_size) for _ in range(2)])
        self.bank = LabBank(config)

    def forward(self, x, cos, sin, mask):
        h = self.pre_norms[0](x)
        x = x + self.attns[0](h, cos, sin, mask)
        h = self.mid_norms[0](x)
        side = self.bank(h)
        x = x + self.ffns[0](h)
        x = x + self.attns[1](self.pre_norms[1](x), cos, sin, mask)
        x = x + self.ffns[1](self.mid_norms[1](x))
        return x + side


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList([LabBlock(config, i) for i in range(config.num_hidden_layers)])
'''

LAB_LOOPED = LAB_PARTS + '''class LabBlock(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attns = nn.ModuleList([LabAttention(config) for _ in range(2)])
        self.ffns = nn.ModuleList([LabFFN(config) for _ in range(2)])
        self.n1 = nn.ModuleList([LabRMSNorm(config.hidden_size) for _ in range(2)])
        self.n2 = nn.ModuleList([LabRMSNorm(config.hidden_size) for _ in range(2)])

    def forward(self, x, cos, sin, mask):
        for attn, ffn, pre, mid in zip(self.attns, self.ffns, self.n1, self.n2):
            x = x + attn(pre(x), cos, sin, mask)
            x = x + ffn(mid(x))
        return x


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList([LabBlock(config, i) for i in range(config.num_hidden_layers)])
'''


def lab(code: str) -> dict[str, str]:
    return {"modeling_lab.py": LAB_PRELUDE + code}


def _layer(sources: dict, name: str):
    _file, cls = _classes(sources)[name]
    forward = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    built = forms._built(cls)
    attention = {a for a, (c, _) in built.items() if c in forms._attention_classes(sources)}
    return cls, forward, attention, built


def test_longcat_flash_runs_two_sublayers_and_a_shortcut_moe():
    code = transformers_code("longcat_flash")
    found = sublayers.sublayers(*_layer(code, "LongcatFlashDecoderLayer"))
    assert found.count == "2"
    assert found.parts == ("input_layernorm", "self_attn", "post_attention_layernorm", "mlps")
    assert found.shortcut_class == "LongcatFlashMoE"
    assert found.shortcut.startswith("self.mlp (LongcatFlashMoE) reads post_attention_layernorm[0]'s output")
    assert "is added to the states after sublayer 1" in found.shortcut
    assert "residual + hidden_states + shortcut_mlp_output" in found.shortcut


def _read(sources: dict, name: str, config: dict | None = None):
    cls, _forward, attention, _built = _layer(sources, name)
    return sublayers.read(cls, "modeling.py", attention, config or {})


def test_longcat_flash_is_the_form_the_port_runs():
    code = transformers_code("longcat_flash")
    found = _read(code, "LongcatFlashDecoderLayer")
    assert isinstance(found, sublayers.Portable)
    assert (found.count, found.attention, found.attn_norm, found.mlp_norm, found.mlp, found.shortcut, found.reads) == (
        2, "self_attn", "input_layernorm", "post_attention_layernorm", "mlps", "mlp", 0)
    assert forms.several_attentions(code, {"zero_expert_num": 256}) is None


def test_longcat_flash_identity_experts_are_read_for_the_port():
    classes = _classes(transformers_code("longcat_flash"))
    found = sublayers.identity_experts_read(classes, "LongcatFlashMoE", {"zero_expert_num": 256})
    assert (found.block, found.test, found.key) == ("LongcatFlashExperts", "expert_idx >= self.num_routed_experts",
                                                     "zero_expert_num")
    assert found.where.startswith("modeling_longcat_flash.py:")
    assert sublayers.identity_experts_read(classes, "LongcatFlashMoE", {"zero_expert_num": 0}) is None


def test_a_lab_block_written_otherwise_is_read_the_same():
    code = lab(LAB_UNROLLED)
    found = sublayers.sublayers(*_layer(code, "LabBlock"))
    assert found.count == "2" and found.parts == ("pre_norms", "attns", "mid_norms", "ffns")
    assert found.shortcut.startswith("self.bank (LabBank) reads mid_norms[0]'s output")
    assert "after sublayer 1" in found.shortcut and "return x + side" in found.shortcut
    read = _read(code, "LabBlock")
    assert isinstance(read, sublayers.Portable)
    assert (read.attention, read.attn_norm, read.mlp_norm, read.mlp, read.shortcut, read.reads) == (
        "attns", "pre_norms", "mid_norms", "ffns", "bank", 0)
    assert forms.several_attentions(code, {"real_experts": 4, "null_experts": 2}) is None
    identity = sublayers.identity_experts_read(_classes(code), "LabBank", {"real_experts": 4, "null_experts": 2})
    assert (identity.test, identity.key) == ("e > self.n_real - 1", "null_experts")


def test_a_lab_shortcut_reading_the_last_sublayer_is_read_so():
    code = lab(LAB_UNROLLED.replace("        side = self.bank(h)\n", "").replace(
        "        x = x + self.ffns[1](self.mid_norms[1](x))\n",
        "        h = self.mid_norms[1](x)\n        side = self.bank(h)\n        x = x + self.ffns[1](h)\n"))
    found = _read(code, "LabBlock")
    assert isinstance(found, sublayers.Portable) and found.reads == 1


def test_a_lab_block_in_another_form_is_named():
    # Post-norm sublayers: x = norm(x + attn(x)).
    post = lab(LAB_UNROLLED.replace("        x = x + self.attns[1](self.pre_norms[1](x), cos, sin, mask)\n",
                                    "        x = self.pre_norms[1](x + self.attns[1](x, cos, sin, mask))\n"))
    found = _read(post, "LabBlock")
    assert isinstance(found, str), found
    message = forms.several_attentions(post, {})
    assert "LabBlock.forward calls LabAttention 2 times" in message
    assert "; the port runs pre-norm sublayers, and LabBlock.forward (modeling_lab.py:" in message
    # The shortcut scaled before it is added: a step the reader does not follow, named with its line.
    scaled = lab(LAB_UNROLLED.replace("        return x + side\n", "        return x + 0.5 * side\n"))
    found = _read(scaled, "LabBlock")
    assert "a step the sublayer reader does not follow: 0.5 * side (line" in found, found


def test_a_shortcut_that_is_not_added_back_is_no_shortcut():
    code = lab(LAB_UNROLLED.replace("        return x + side\n", "        return x * side.sigmoid()\n"))
    found = sublayers.sublayers(*_layer(code, "LabBlock"))
    assert found.count == "2" and found.shortcut is None


def test_a_lab_block_looping_over_its_sublayers_is_named():
    found = forms.several_attentions(lab(LAB_LOOPED), {})
    assert found.startswith("several attention computations in one decoder layer: LabBlock.forward calls "
                            "LabAttention 2 times, in a loop over self.attns (modeling_lab.py:")
    assert "2 sublayers in sequence, sublayer i calling n1[i], attns[i], n2[i], ffns[i]" in found
    assert "with no mixture of experts beside them" in found  # read through the loop, named for what it lacks
    one = LAB_LOOPED.replace("for _ in range(2)", "for _ in range(1)")
    assert forms.several_attentions(lab(one), {}) is None


def test_a_plain_layer_has_no_sublayers():
    code = transformers_code("llama")
    assert sublayers.sublayers(*_layer(code, "LlamaDecoderLayer")) is None
    assert sublayers.identity_experts_read(_classes(transformers_code("mixtral")), "MixtralSparseMoeBlock",
                                               {}) is None


def test_longcat_flash_mla_lora_scales_are_named():
    found = sublayers.scaled_inputs(_classes(transformers_code("longcat_flash")), "LongcatFlashMLA")
    assert found.startswith("values scaled by numbers of the attention's own: LongcatFlashMLA.forward computes "
                            "q_pass * self.mla_scale_q_lora, q_rot * self.mla_scale_q_lora, "
                            "k_pass * self.mla_scale_kv_lora (modeling_longcat_flash.py:")
    assert "self.mla_scale_kv_lora = (config.hidden_size / self.kv_lora_rank) ** 0.5" in found
    # DeepSeek's MLA hands its only number to the attention function.
    assert sublayers.scaled_inputs(_classes(transformers_code("deepseek_v3")), "DeepseekV3Attention") is None


LAB_GAINED = LAB_PRELUDE + '''import math


class LabLatentAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.down = nn.Linear(config.hidden_size, config.latent, bias=False)
        self.up = nn.Linear(config.latent, 3 * config.hidden_size, bias=False)
        self.out = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.gain = math.sqrt(config.hidden_size / config.latent)
        self.temperature = config.head_dim ** -0.5

    def forward(self, x, mask):
        q, k, v = self.up(self.down(x)).chunk(3, dim=-1)
        q = self.gain * q
        return self.out(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.temperature))
'''


def test_a_lab_attention_scaling_its_queries_by_its_own_number_is_named():
    found = sublayers.scaled_inputs(_classes({"modeling_lab.py": LAB_GAINED}), "LabLatentAttention")
    assert "LabLatentAttention.forward computes self.gain * q (modeling_lab.py:" in found
    assert "self.gain = math.sqrt(config.hidden_size / config.latent)" in found
    handed = LAB_GAINED.replace("q = self.gain * q", "q = q").replace("scale=self.temperature",
                                                                       "scale=self.temperature * self.gain")
    assert sublayers.scaled_inputs(_classes({"modeling_lab.py": handed}), "LabLatentAttention") is None


def test_longcat_flash_checkpoint_reads_as_sublayers_and_maps_every_tensor(tmp_path):
    """transformers' LongCat-Flash at the catalogue's tiny sizes, two layers: the spec the port is generated from,
    every tensor with a home (each sublayer's modules in the port's lists at their index; the identity experts'
    gate/up tensors skipped), and the static checks of every shard and shape."""
    from catalogue import overrides_for  # the catalogue's tiny sizes

    from scaffold.checkpoint import read_checkpoint
    from scaffold.detect import detect
    from scaffold.mapping import weight_table
    from scaffold.tiny import build_tiny
    from scaffold.verify import static
    from scaffold.verify.report import Report

    ckpt_dir = tmp_path / "longcat"
    build_tiny("longcat_flash", str(ckpt_dir), architecture="CatalogueLongcatFlashForCausalLM",
               overrides={**overrides_for("longcat_flash"), "num_hidden_layers": 4})
    ckpt = read_checkpoint(ckpt_dir)
    spec = detect(ckpt)
    assert (spec.num_layers, spec.sublayer_count, spec.sublayer_mlp, spec.shortcut_reads) == (2, 2, "mlps", 0)
    assert (spec.zero_expert_count, spec.source("zero_expert_count").expr) == (4, "config.zero_expert_num")
    assert spec.sublayer_latent_scales == ["kv", "q"] and spec.moe_renormalize is False
    assert spec.moe_intermediate_size == 64 and spec.source("moe_intermediate_size").expr == \
        "config.expert_ffn_hidden_size"
    rows, homeless = weight_table(spec, ckpt)
    assert not homeless
    params = {r.checkpoint: (r.param, r.shard) for r in rows}
    assert params["model.layers.1.self_attn.1.q_a_proj.weight"] == ("model.layers.1.self_attn.1.fused_qkv_a_proj.weight", 0)
    assert params["model.layers.1.mlps.1.up_proj.weight"] == ("model.layers.1.mlps.1.gate_up_proj.weight", 1)
    assert params["model.layers.0.post_attention_layernorm.1.weight"][0] == \
        "model.layers.0.post_attention_layernorm.1.weight"
    assert params["model.layers.0.mlp.experts.5.gate_proj.weight"] == (None, None)  # an identity expert's
    assert params["model.layers.0.mlp.experts.3.gate_proj.weight"][1] == (3, "w1")
    report = Report("port", str(ckpt_dir))
    static.check_mapping(report, spec, ckpt, (rows, homeless))
    static.check_shapes(report, spec, ckpt)
    assert all(c.status == "pass" for c in report.checks), report.checks


LAB_MLA = LAB_PRELUDE + '''import math


class LabMLA(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.q_down = nn.Linear(config.hidden_size, config.q_lora_rank, bias=False)
        self.q_norm = LabRMSNorm(config.q_lora_rank)
        self.q_up = nn.Linear(config.q_lora_rank, config.num_attention_heads * 96, bias=False)
        self.kv_down = nn.Linear(config.hidden_size, config.kv_lora_rank + 64, bias=False)
        self.latent_norm = LabRMSNorm(config.kv_lora_rank)
        self.q_gain = math.sqrt(config.hidden_size / config.q_lora_rank)
        self.kv_gain = (config.hidden_size / config.kv_lora_rank) ** 0.5

    def forward(self, x, cos, sin):
        q = self.q_up(self.q_norm(self.q_down(x))) * self.q_gain
        latent, k_rot = torch.split(self.kv_down(x), [512, 64], dim=-1)
        latent = self.kv_gain * self.latent_norm(latent)
        return attend(q, latent, k_rot, cos, sin)
'''
LAB_MLA_NAMES = {"q_b_proj": "q_up", "kv_a_norm": "latent_norm"}


def test_a_lab_latent_attention_written_otherwise_has_its_scales_read():
    classes = _classes({"modeling_lab.py": LAB_MLA})
    scales, evidence = sublayers.latent_scales(classes, "LabMLA", LAB_MLA_NAMES, {})
    assert scales == ["kv", "q"]
    assert "LabMLA.forward multiplies self.q_up(self.q_norm(self.q_down(x))) by (hidden_size / q_lora_rank)" in evidence
    # The rotated key scaled too: not what the port folds into the latent norm, named.
    rotated = LAB_MLA.replace("        return attend(", "        k_rot = k_rot * self.kv_gain\n        return attend(")
    found = sublayers.latent_scales(_classes({"modeling_lab.py": rotated}), "LabMLA", LAB_MLA_NAMES, {})
    assert isinstance(found, str) and "scaled by the kv_lora_rank factor hold" in found and "kv_down" in found
    # Only the query's rotated half scaled: named.
    half = LAB_MLA.replace("        q = self.q_up(self.q_norm(self.q_down(x))) * self.q_gain\n",
                           "        q_pass, q_rot = self.q_up(self.q_norm(self.q_down(x))).split([32, 64], dim=-1)\n"
                           "        q_rot = q_rot * self.q_gain\n        q = torch.cat([q_pass, q_rot], dim=-1)\n")
    found = sublayers.latent_scales(_classes({"modeling_lab.py": half}), "LabMLA", LAB_MLA_NAMES, {})
    assert isinstance(found, str) and "only part of the query (q_rot of q_pass, q_rot) is scaled" in found
    # A factor of another form (by the head width): the port folds none of it, named.
    other = LAB_MLA.replace("(config.hidden_size / config.kv_lora_rank) ** 0.5", "config.head_dim ** 0.5")
    found = sublayers.latent_scales(_classes({"modeling_lab.py": other}), "LabMLA", LAB_MLA_NAMES, {})
    assert isinstance(found, str) and found.startswith("values scaled by numbers of the attention's own")


def test_longcat_flash_mla_lora_scales_are_read_for_the_port():
    names = {"q_b_proj": "q_b_proj", "kv_a_norm": "kv_a_layernorm"}
    scales, evidence = sublayers.latent_scales(_classes(transformers_code("longcat_flash")), "LongcatFlashMLA", names,
                                               {})
    assert scales == ["kv", "q"]
    assert "LongcatFlashMLA.forward multiplies q_pass, q_rot by (hidden_size / q_lora_rank) ** 0.5" in evidence
    assert sublayers.latent_scales(_classes(transformers_code("deepseek_v3")), "DeepseekV3Attention", names, {}) == \
        ([], "")
