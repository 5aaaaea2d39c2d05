"""ModernBERT-decoder's forms, read from what the code computes: a norm inside the module that embeds the tokens,
a layer norm built as nn.Identity() on some layers (the attention's, in layer 0), and a transform of the final
hidden states before the head (a linear map, an activation, a norm), in transformers' own file and in a lab's
written otherwise (other names, other statements)."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape
from helpers import LAB_PRELUDE, detect_until, read, transformers_code

from scaffold.detect import head, headtransform, identitynorm, layout
from scaffold.errors import UnsupportedArchitecture

MODERNBERT = transformers_code("modernbert_decoder")
MODERNBERT_FILE = next(iter(MODERNBERT))


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(code.splitlines(), 1) if text in line)


def test_transformers_modernbert_decoder_forms_are_read_from_its_code():
    code = MODERNBERT[MODERNBERT_FILE]
    found = headtransform.find(MODERNBERT, None, {"classifier_activation": "gelu"})
    assert (found.module, found.head, found.dense, found.act, found.norm) == ("lm_head", "decoder", "dense", "act",
                                                                             "norm")
    assert (found.act_key, found.act_name, found.dense_bias) == ("classifier_activation", "gelu",
                                                                 "config.classifier_bias")
    assert found.where == f"{MODERNBERT_FILE}:{_line(code, 'logits = self.decoder(self.lm_head(')}"
    # The norm is built as the layers' norms are.
    assert found.norm_built == ("LayerNorm", ("bias=config.norm_bias", "eps=config.norm_eps"))
    # Layer 0's attention reads the embeddings' norm as it is.
    skipped = identitynorm.identity_layers(MODERNBERT, {"num_hidden_layers": 4}, "layers", "attn_norm", 4, None, None)
    assert skipped.layers == [0] and skipped.expr == "not layer_idx != 0"
    assert identitynorm.identity_layers(MODERNBERT, {}, "layers", "mlp_norm", 4, None, None) is None
    # The token embedding's module applies its own norm: embeddings.norm, not a second final norm.
    assert layout._embedding_module_norms(MODERNBERT) == [
        ("embeddings.norm", MODERNBERT_FILE, _line(code, "hidden_states = self.drop(self.norm(self.tok_embeddings(")),
    ]


# A lab's decoder written unlike ModernBERT-decoder: the embedding's norm applied in a second statement, the
# identity norm built by an if/else over a config key, the transform's statements one per line reusing one name,
# torch's GELU module built in place, and other names throughout.
LAB_CODE = "\n" + LAB_PRELUDE + '''class LabEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.ln = nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, ids):
        x = self.wte(ids)
        return self.ln(x)


class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.d_head = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.d_head, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.d_head, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * self.d_head, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(ctx.transpose(1, 2).reshape(b, t, -1))


class LabMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LabBlock(nn.Module):
    def __init__(self, config, idx):
        super().__init__()
        if idx < config.plain_first_layers:
            self.pre_attn = nn.Identity()
        else:
            self.pre_attn = nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.attention = LabAttention(config, idx)
        self.pre_mlp = nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.ffn = LabMLP(config)

    def forward(self, x, cos, sin, mask):
        h = self.pre_attn(x)
        x = x + self.attention(h, cos, sin, mask)
        return x + self.ffn(self.pre_mlp(x))


class LabBackbone(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed = LabEmbedding(config)
        self.blocks = nn.ModuleList([LabBlock(config, i) for i in range(config.num_hidden_layers)])
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, ids, cos, sin, mask):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, cos, sin, mask)
        return self.ln_f(x)


class LabPredictor(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.fn = nn.GELU()
        self.ln = nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, h):
        h = self.proj(h)
        h = self.fn(h)
        return self.ln(h)


class LabForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.backbone = LabBackbone(config)
        self.predictor = LabPredictor(config)
        self.out = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, ids, cos, sin, mask):
        h = self.backbone(ids, cos, sin, mask)
        h = self.predictor(h)
        return self.out(h)
'''


def _lab_checkpoint(tmp_path, code=LAB_CODE, plain=1, layers=3):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_bert", layers=layers, kv_heads=4,
                  extra={"plain_first_layers": plain})
    h, width, inter, vocab = shape.hidden, shape.heads * shape.head_dim, shape.intermediate, shape.vocab
    tensors = {"backbone.embed.wte.weight": [vocab, h], "backbone.embed.ln.weight": [h], "backbone.embed.ln.bias": [h],
               "backbone.ln_f.weight": [h], "backbone.ln_f.bias": [h], "predictor.proj.weight": [h, h],
               "predictor.proj.bias": [h], "predictor.ln.weight": [h], "predictor.ln.bias": [h],
               "out.weight": [vocab, h]}
    for i in range(layers):
        p = f"backbone.blocks.{i}."
        norms = ("pre_mlp",) if i < plain else ("pre_attn", "pre_mlp")
        tensors.update({f"{p}{n}.{k}": [h] for n in norms for k in ("weight", "bias")})
        tensors.update({f"{p}attention.{x}_proj.weight": [width, h] for x in "qkv"})
        tensors[f"{p}attention.o_proj.weight"] = [h, width]
        tensors.update({f"{p}ffn.{x}_proj.weight": [inter, h] for x in ("gate", "up")})
        tensors[f"{p}ffn.down_proj.weight"] = [h, inter]
    read(tmp_path, shape, tensors=tensors)
    (tmp_path / "modeling_lab.py").write_text(code)
    from scaffold.checkpoint import read_checkpoint

    return read_checkpoint(tmp_path)


def test_a_lab_prediction_head_embedding_norm_and_identity_norm_under_other_names(tmp_path):
    spec = detect_until(_lab_checkpoint(tmp_path), head)
    n = spec.names
    assert (n["model"], n["layers"], n["embed_tokens"], n["embed_norm"], n["norm"], n["lm_head"]) == (
        "backbone", "blocks", "embed.wte", "embed.ln", "ln_f", "out")
    assert (n["head_transform"], n["head_dense"], n["head_norm"]) == ("predictor", "proj", "ln")
    assert (n["attn_norm"], n["mlp_norm"], n["self_attn"], n["mlp"]) == ("pre_attn", "pre_mlp", "attention", "ffn")
    assert spec.embedding_norm and spec.unnormed_attn_layers == [0]
    assert spec.source("unnormed_attn_layers").detail.startswith(
        f"modeling_lab.py:{_line(LAB_CODE, 'if idx < config.plain_first_layers:')}: self.pre_attn is nn.Identity()")
    assert (spec.head_act, spec.head_dense_bias) == ("gelu", True)
    assert spec.source("head_act").kind == "code"
    assert (spec.norm_kind, spec.norm_bias, spec.block, spec.tie_word_embeddings) == ("layer", True, "pre_norm",
                                                                                      False)


def test_a_config_key_picks_the_identity_layers(tmp_path):
    spec = detect_until(_lab_checkpoint(tmp_path, plain=2, layers=4), head)
    assert spec.unnormed_attn_layers == [0, 1]


def test_identity_layers_the_tensors_contradict_are_refused(tmp_path):
    # The code makes layers 0 and 1 identities; the checkpoint holds layer 1's norm.
    ckpt = _lab_checkpoint(tmp_path, plain=1)
    (tmp_path / "config.json").write_text((tmp_path / "config.json").read_text().replace(
        '"plain_first_layers": 1', '"plain_first_layers": 2'))
    from scaffold.checkpoint import read_checkpoint

    with pytest.raises(UnsupportedArchitecture, match=r"identity on layers \[0, 1\].*holds blocks.N.pre_attn.weight "
                                                      r"in layers \[1, 2\]"):
        detect_until(read_checkpoint(tmp_path), head)
    del ckpt


def test_an_identity_norm_before_the_mlp_is_refused_by_name(tmp_path):
    code = LAB_CODE.replace('''        if idx < config.plain_first_layers:
            self.pre_attn = nn.Identity()
        else:
            self.pre_attn = nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps)''', '''        self.pre_attn = nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps)''').replace(
        '''        self.pre_mlp = nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps)''',
        '''        self.pre_mlp = nn.Identity() if idx == 0 else nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps)''')
    ckpt = _lab_checkpoint(tmp_path, code=code, plain=0)
    # The checkpoint as the code builds it: layer 0 has pre_attn and no pre_mlp.
    del ckpt
    shape_tensors = dict(__import__("scaffold.checkpoint", fromlist=["read_checkpoint"]).read_checkpoint(
        tmp_path).tensors)
    tensors = {k: list(v.shape) for k, v in shape_tensors.items() if not k.startswith("backbone.blocks.0.pre_mlp.")}
    tensors.update({f"backbone.blocks.0.pre_attn.{k}": [64] for k in ("weight", "bias")})
    shape = Shape(architecture="LabForCausalLM", model_type="lab_bert", layers=3, kv_heads=4,
                  extra={"plain_first_layers": 0})
    read(tmp_path, shape, tensors=tensors)
    (tmp_path / "modeling_lab.py").write_text(code)
    from scaffold.checkpoint import read_checkpoint

    with pytest.raises(UnsupportedArchitecture, match=r"the mlp norm built as an identity on layers \[0\] "
                                                      rf"\(modeling_lab.py:{_line(code, 'self.pre_mlp = nn.Identity()')}"):
        detect_until(read_checkpoint(tmp_path), head)


def test_a_head_transform_in_another_order_is_refused_naming_its_forward(tmp_path):
    code = LAB_CODE.replace('''        h = self.proj(h)
        h = self.fn(h)
        return self.ln(h)''', '''        h = self.ln(h)
        h = self.proj(h)
        return self.fn(h)''')
    with pytest.raises(UnsupportedArchitecture, match=r"a transform of the final hidden states before the head: "
                                                      rf"modeling_lab.py:{_line(code, 'def forward(self, h):')}: "
                                                      r"LabPredictor.forward.*applies self.ln \(norm\), self.proj "
                                                      r"\(linear\), self.fn \(act\)"):
        detect_until(_lab_checkpoint(tmp_path, code=code), head)


def test_a_head_transform_statement_the_reader_does_not_follow_is_refused(tmp_path):
    code = LAB_CODE.replace('''        h = self.fn(h)
        return self.ln(h)''', '''        h = self.fn(h) * 2.0
        return self.ln(h)''')
    with pytest.raises(UnsupportedArchitecture, match=rf"modeling_lab.py:{_line(code, 'h = self.fn(h) * 2.0')}: "
                                                      r"LabPredictor.forward computes self.fn\(h\) \* 2.0"):
        detect_until(_lab_checkpoint(tmp_path, code=code), head)


def test_a_head_transform_norm_built_unlike_the_layers_norms_is_refused(tmp_path):
    code = LAB_CODE.replace('''        self.ln = nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, h):''', '''        self.ln = LabRMSNorm(config.hidden_size)

    def forward(self, h):''')
    with pytest.raises(UnsupportedArchitecture, match=r"the norm predictor.ln of the transform before the head is "
                                                      r"built as LabRMSNorm\(\.\.\.\), the layers' norms as "
                                                      r"LayerNorm\(\.\.\., eps=config.rms_norm_eps\)"):
        detect_until(_lab_checkpoint(tmp_path, code=code), head)


def test_a_final_norm_the_causal_lm_applies_is_no_head_transform():
    # `self.lm_head(self.norm(h))` in the causal-LM class: a module without a linear map of its own.
    code = {"m.py": LAB_PRELUDE + '''class M(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.norm = LabRMSNorm(config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, h):
        return self.lm_head(self.norm(h))
'''}
    assert headtransform.find(code, None, {}) is None


def test_a_norm_the_config_selects_in_every_layer_is_no_identity_norm():
    # HyperCLOVA X: `self.post_norm1 = RMSNorm(...) if config.use_post_norm else nn.Identity()`: config.json decides
    # for every layer alike (conditions.selected reads it), whatever its value.
    code = transformers_code("hyperclovax")
    for use in (True, False):
        assert identitynorm.identity_layers(code, {"use_post_norm": use}, "layers", "post_norm1", 3, None, None) is None
