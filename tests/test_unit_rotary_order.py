"""detect/rotaryfreq.py: the order of the rotary frequencies, read by running the rotary module's code over numbers.

Cohere Compass "pre-rotates" its inverse frequencies for its multimodal rotary sections; for text every row of
positions is the same, so its rotation is NeoX rotary whose columns turn at the standard frequencies in another
order. The tests read transformers' own file, and a lab's module written differently (its own names, a buffer
indexed by a permutation, the sections put back in another order), and the forms that must stay refused."""

from __future__ import annotations

import pytest
import torch
from ckpt_factory import Shape, tensors_for
from helpers import LAB_DECODER, LAB_PRELUDE, detect_until, read, transformers_code

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import rope, rotaryfreq
from scaffold.errors import CheckpointError, SpecError, UnsupportedArchitecture
from scaffold.spec import Source, validate_names


def _compass_config(sections, head_dim, layer_types=("full_attention",)):
    return {"hidden_size": 2 * head_dim, "num_attention_heads": 2, "head_dim": head_dim,
            "max_position_embeddings": 128, "layer_types": list(layer_types),
            "rope_parameters": {kind: {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections}
                                for kind in ("full_attention", "sliding_attention")}}


def _prerotated(sections, head_dim):
    """Cohere Compass's order, written from its docstring: the h and w sections' frequencies even ones first."""
    hw = sections[0] + sections[1]
    return tuple(list(range(0, hw, 2)) + list(range(1, hw, 2)) + list(range(hw, head_dim // 2)))


@pytest.mark.parametrize(("sections", "head_dim"), [([6, 6, 4], 32), ([22, 22, 20], 128), ([4, 4, 8], 32)])
def test_cohere_compass_frequencies_are_its_prerotated_order(sections, head_dim):
    found = rotaryfreq.read_order(transformers_code("cohere_compass"), _compass_config(sections, head_dim),
                                  "full_attention", head_dim, 10000.0)
    assert found.order == _prerotated(sections, head_dim) and found.permuted
    assert found.cls == "CohereCompassRotaryEmbedding"


def test_the_order_read_is_what_transformers_computes():
    """The reading against the module itself: transformers' CohereCompassRotaryEmbedding, run on the 4 rows its text
    model builds, equals NeoX cos/sin at the standard frequencies in the order read."""
    from transformers.models.cohere_compass.configuration_cohere_compass import CohereCompassTextConfig
    from transformers.models.cohere_compass.modeling_cohere_compass import CohereCompassRotaryEmbedding

    config = _compass_config([6, 6, 4], 32)
    found = rotaryfreq.read_order(transformers_code("cohere_compass"), config, "full_attention", 32, 10000.0)
    module = CohereCompassRotaryEmbedding(CohereCompassTextConfig(num_hidden_layers=1, **{
        k: v for k, v in config.items() if k != "head_dim"}))
    positions = torch.arange(300)
    cos, sin = module(torch.zeros(1, 300, 32), positions[None, None].expand(4, 1, -1)[1:], "full_attention")
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, 32, 2, dtype=torch.float) / 32)
    angles = positions[:, None].float() * inv_freq[list(found.order)]
    assert torch.equal(cos[0], torch.cat([angles, angles], -1).cos())
    assert torch.equal(sin[0], torch.cat([angles, angles], -1).sin())
    standard = torch.cat([positions[:, None].float() * inv_freq] * 2, -1)
    assert (cos[0] - standard.cos()).abs().max() > 0.5  # the order matters


@pytest.mark.parametrize("model", ["llama", "qwen2_vl", "gemma3"])
def test_standard_rotary_modules_read_in_the_standard_order(model):
    config = {"hidden_size": 64, "num_attention_heads": 2, "head_dim": 32, "max_position_embeddings": 128,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}}
    if model == "gemma3":
        config = {**config, "layer_types": ["sliding_attention", "full_attention"],
                  "rope_parameters": {k: {"rope_type": "default", "rope_theta": 10000.0}
                                      for k in ("full_attention", "sliding_attention")}}
    found = rotaryfreq.read_order(transformers_code(model), config,
                                  "full_attention" if model == "gemma3" else None, 32, 10000.0)
    assert found.order == tuple(range(16)) and not found.permuted


# A lab's rotary written unlike Cohere Compass's: its own names, the frequencies from an exponent, reordered by a
# permutation index into a buffer (the temporal section first), and its forward putting the sections back by
# splitting in that order and taking each from its own row; the stack names the module `rope`.
LAB_ROTARY = '''class SectionedRope(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        rp = cfg.rope_parameters
        self.sections = rp["mrope_section"]
        width = cfg.head_dim
        exponents = torch.arange(width // 2).float() * 2 / width
        freqs = rp["rope_theta"] ** -exponents
        h, w, t = self.sections
        perm = torch.cat([torch.arange(h + w, h + w + t), torch.arange(0, h + w)])
        self.register_buffer("freqs", freqs[perm], persistent=False)

    def forward(self, hidden, pos):
        if pos.dim() == 2:
            pos = pos[None].expand(3, -1, -1)
        angles = pos.unsqueeze(-1).float() * self.freqs
        parts = angles.split([self.sections[2], self.sections[0], self.sections[1]], dim=-1)
        picked = [part[row] for row, part in enumerate(parts)]
        angles = torch.cat(picked, dim=-1)
        full = torch.cat([angles, angles], dim=-1)
        return full.cos(), full.sin()


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
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(ctx.transpose(1, 2).reshape(b, t, -1))


'''
LAB_STACK = '''


class LabStack(LabModel):
    def __init__(self, config):
        super().__init__(config)
        self.rope = SectionedRope(config)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        pos = torch.arange(ids.shape[1], device=ids.device)[None]
        cos, sin = self.rope(x, pos)
        for layer in self.layers:
            x = layer(x, cos, sin, None)
        return self.norm(x)
'''
LAB_CODE = LAB_PRELUDE + LAB_ROTARY + LAB_DECODER + LAB_STACK
LAB_ORDER = list(range(12, 16)) + list(range(12))  # the t section's frequencies first, then h and w


def _lab(tmp_path, code=LAB_CODE, sections=(6, 6, 4)):
    extra = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                 **({"mrope_section": list(sections)} if sections else {})}}
    shape = Shape(architecture="LabForCausalLM", model_type="lab_sectioned", head_dim=32, hidden=128, extra=extra)
    read(tmp_path, shape)
    (tmp_path / "modeling_lab.py").write_text(code)
    return read_checkpoint(tmp_path)


def test_a_lab_module_written_otherwise_is_read_and_ported_in_its_order(tmp_path):
    spec = detect_until(_lab(tmp_path), rope)
    assert spec.rope_frequency_order == LAB_ORDER
    assert spec.rope_position_rows is True
    assert "mrope_section" not in spec.rope_parameters
    assert "SectionedRope run over numbers" in spec.source("rope_frequency_order").detail


def test_a_lab_order_without_sections_in_the_config_is_ported_too(tmp_path):
    """A permutation the code writes with its own numbers, no mrope_section in config.json: ported, with one
    row of positions."""
    code = LAB_CODE.replace('self.sections = rp["mrope_section"]', "self.sections = [6, 6, 4]")
    spec = detect_until(_lab(tmp_path, code, sections=None), rope)
    assert spec.rope_frequency_order == LAB_ORDER and spec.rope_position_rows is False


def test_frequencies_that_are_not_a_reordering_are_refused_by_name(tmp_path):
    scaled = LAB_CODE.replace('freqs[perm], persistent', 'freqs[perm] * 0.5, persistent')
    with pytest.raises(UnsupportedArchitecture, match=r"modeling_lab.py:\d+: SectionedRope rotates column 0 at a "
                                                      r"frequency .* that is none of 10000 \*\* \(-2k / 32\)"):
        detect_until(_lab(tmp_path / "scaled", scaled), rope)
    twice = LAB_CODE.replace("torch.arange(0, h + w)])", "torch.arange(0, h + w - 1), torch.arange(0, 1)])")
    with pytest.raises(UnsupportedArchitecture, match=r"not each once, so not a reordering"):
        detect_until(_lab(tmp_path / "twice", twice), rope)


def test_rows_of_positions_computed_apart_stay_refused(tmp_path):
    """A multimodal M-RoPE: the stack computes the sections' rows with a function of its own (a rope index from
    the tokens), so for the port they would differ; refused naming the line."""
    code = LAB_CODE.replace("pos = torch.arange(ids.shape[1], device=ids.device)[None]",
                            "pos = self.rope_index(ids)")
    with pytest.raises(UnsupportedArchitecture, match=r"rows of positions are computed apart \(modeling_lab.py:\d+: "
                                                      r"pos = self.rope_index\(ids\)\)"):
        detect_until(_lab(tmp_path, code), rope)


def test_code_the_reader_does_not_follow_is_refused_where_the_config_declares_sections(tmp_path):
    code = LAB_CODE.replace("full = torch.cat([angles, angles], dim=-1)",
                            "full = torch.cat([angles, angles], dim=-1).roll(1, -1)")
    with pytest.raises(UnsupportedArchitecture, match=r"multimodal rotary sections .*SectionedRope.forward computes "
                                                      r"what the reader does not follow .*method roll"):
        detect_until(_lab(tmp_path, code), rope)


def test_sections_the_code_ignores_rotate_in_the_standard_order(tmp_path):
    # Llama's code with M-RoPE sections in config.json: its rotary module reads none of them; vLLM still hands the
    # model a row of positions per section, which the port builds identical.
    shape = Shape(extra={"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                             "mrope_section": [2, 3, 3]}})
    spec = detect_until(read(tmp_path, shape), rope)
    assert spec.rope_frequency_order == [] and spec.rope_position_rows is True
    assert spec.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}


def test_a_frequency_order_that_is_no_permutation_is_a_spec_error(tmp_path):
    spec = detect_until(read(tmp_path, Shape()), rope)  # head_dim 16: 8 frequencies
    spec.set("rope_frequency_order", [0, 1, 2, 3, 4, 5, 6, 6], Source("override", "spec.toml"))
    with pytest.raises(SpecError, match=r"rope_frequency_order .* not a reordering of 0..7"):
        validate_names(spec, "spec.toml")
    spec.set("rope_frequency_order", [1, 0, 2, 3, 4, 5, 6, 7], Source("override", "spec.toml"))
    validate_names(spec, "spec.toml")


def _compass_checkpoint(tmp_path, full_attention):
    """A tiny checkpoint read with transformers' Cohere Compass code: one LayerNorm per layer (its parallel block)."""
    extra = {"layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "sliding_window": 8,
             "rope_parameters": {"full_attention": full_attention,
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                                       "mrope_section": [2, 3, 3]}}}
    shape = Shape(model_type="cohere_compass_text", layers=3, extra=extra)
    tensors = {n: s for n, s in tensors_for(shape).items() if "post_attention_layernorm" not in n}
    return read(tmp_path, shape, tensors=tensors)


def test_a_layer_type_without_rotary_parameters_takes_no_rotary(tmp_path):
    """Cohere Compass's text model rotates a layer only where `config.rope_parameters[layer_type] is not None`: a
    null set makes that type's layers no_rope_layers, read by the port from the layer types at run time."""
    spec = detect_until(_compass_checkpoint(tmp_path, None), rope)
    assert spec.no_rope_layers == [1]
    assert spec.source("no_rope_layers").expr == "config.layer_types[layer_idx] != 'full_attention'"
    assert "modeling_cohere_compass.py:" in spec.source("no_rope_layers").detail
    assert spec.rope_frequency_order == [0, 2, 4, 1, 3, 5, 6, 7] and spec.rope_position_rows is True
    rotating = detect_until(_compass_checkpoint(tmp_path / "all", {"rope_type": "default", "rope_theta": 10000.0,
                                                                    "mrope_section": [2, 3, 3]}), rope)
    assert rotating.no_rope_layers == []


def test_a_null_rotary_set_the_code_does_not_test_is_refused(tmp_path):
    """The lab's stack rotates every layer: a null set in config.json is not something its code reads as 'no
    rotary', so the config is refused, not ported as NoPE."""
    assert rope._null_rope_check({"modeling_lab.py": LAB_CODE}) is None
    extra = {"layer_types": ["full_attention", "sliding_attention"],
             "rope_parameters": {"full_attention": None,
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
    shape = Shape(architecture="LabForCausalLM", model_type="lab_sectioned", head_dim=32, hidden=128, extra=extra)
    read(tmp_path, shape)
    (tmp_path / "modeling_lab.py").write_text(LAB_CODE)
    with pytest.raises(CheckpointError, match="does not give rope_theta for each of"):
        detect_until(read_checkpoint(tmp_path), rope)
