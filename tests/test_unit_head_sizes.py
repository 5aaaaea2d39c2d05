"""KV heads sized per layer, value heads of their own width, a scale on the values and sinks on some layers only,
read from what the attention's code computes (scaffold.detect.headsizes): MiMo-V2-Flash's file, and a lab's
attention written otherwise (other names, the factors in another order, the scale applied in a statement of its
own, the sinks built under an `if`)."""

from __future__ import annotations

import pytest
from ckpt_factory import Shape, tensors_for
from helpers import LAB_DECODER, LAB_PRELUDE, detect_until, read, transformers_code

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import attention, headsizes, layout, policy
from scaffold.errors import CheckpointError, UnsupportedArchitecture

MIMO_CONFIG = {"num_hidden_layers": 3, "num_key_value_heads": 2, "num_attention_heads": 4, "head_dim": 32,
               "hidden_size": 128, "v_head_dim": 16, "attention_value_scale": 0.5,
               "layer_types": ["full_attention", "sliding_attention", "sliding_attention"]}


def test_mimo_v2_sizes_are_read_from_its_attention():
    sources = transformers_code("mimo_v2_flash")
    sizes = headsizes.read(sources, MIMO_CONFIG, "layers", 3)
    assert sizes.problems == []
    assert sizes.kv_heads == [2, 4, 4]
    assert sizes.kv_expr == ("config.num_key_value_heads * 2 if config.layer_types[layer_idx] == "
                             "'sliding_attention' else config.num_key_value_heads")
    assert (sizes.v_width, sizes.v_expr) == (16, "config.v_head_dim")
    assert (sizes.value_scale, sizes.value_scale_expr) == (0.5, "config.attention_value_scale")
    expr, layers, line = headsizes.sinks_condition(sources, MIMO_CONFIG, "layers", "sinks", 3)
    assert (expr, layers) == ("config.layer_types[layer_idx] == 'sliding_attention'", [1, 2])
    assert line.startswith("modeling_mimo_v2_flash.py:")


def test_mimo_v2_without_sliding_layers_has_one_kv_count_and_no_value_scale_at_one():
    config = {**MIMO_CONFIG, "layer_types": ["full_attention"] * 3, "attention_value_scale": 1.0}
    sizes = headsizes.read(transformers_code("mimo_v2_flash"), config, "layers", 3)
    assert sizes.kv_heads == [2, 2, 2] and sizes.kv_expr is None  # the same count everywhere: no per-layer field
    assert sizes.value_scale is None
    assert sizes.v_width == 16


# A lab's attention written unlike MiMo-V2's: the projections wq/wk/wv/wo, the KV count a product with a
# conditional factor, the value width kept as self.vw and written first in each product, the values scaled in a
# statement of their own by a factor kept on the module, the sinks built under an `if` (None otherwise) and handed
# over as `sinks=`.
LAB_CODE = "\n" + LAB_PRELUDE + '''def attend(q, k, v, mask, sinks=None):
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + mask
    if sinks is not None:
        scores = torch.cat([scores, sinks.reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)], dim=-1)
    probs = scores.softmax(-1)
    if sinks is not None:
        probs = probs[..., :-1]
    return probs @ v


class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        local = config.attn_kinds[layer_idx] == "local"
        n_kv = config.num_key_value_heads * (2 if local else 1)
        self.nh = config.num_attention_heads
        self.hd = config.head_dim
        self.vw = config.value_width
        self.wq = nn.Linear(config.hidden_size, self.nh * self.hd, bias=False)
        self.wk = nn.Linear(config.hidden_size, n_kv * self.hd, bias=False)
        self.wv = nn.Linear(config.hidden_size, self.vw * n_kv, bias=False)
        self.wo = nn.Linear(self.vw * self.nh, config.hidden_size, bias=False)
        self.value_mult = config.value_multiplier
        self.sink_logits = None
        if local:
            self.sink_logits = nn.Parameter(torch.zeros(self.nh))

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, -1, self.hd).transpose(1, 2)
        k = self.wk(x).view(b, t, -1, self.hd).transpose(1, 2)
        v = self.wv(x).view(b, t, -1, self.vw).transpose(1, 2)
        v = v * self.value_mult
        q, k = apply_rope(q, k, cos, sin)
        ctx = attend(q, k, v, mask, sinks=self.sink_logits)
        return self.wo(ctx.transpose(1, 2).reshape(b, t, -1))


''' + LAB_DECODER

LAB_CONFIG = {"attn_kinds": ["global", "local"], "value_width": 8, "value_multiplier": 0.25}


def test_a_lab_attention_written_otherwise_gives_the_same_reading():
    sizes = headsizes.read({"modeling_lab.py": LAB_CODE}, {**LAB_CONFIG, "num_key_value_heads": 2}, None, 2)
    assert sizes.problems == []
    assert sizes.kv_heads == [2, 4]
    assert sizes.kv_expr == "config.num_key_value_heads * (2 if config.attn_kinds[layer_idx] == 'local' else 1)"
    assert (sizes.v_width, sizes.v_expr) == (8, "config.value_width")
    assert (sizes.value_scale, sizes.value_scale_expr) == (0.25, "config.value_multiplier")
    line = next(i for i, text in enumerate(LAB_CODE.splitlines(), 1) if "v = v * self.value_mult" in text)
    assert sizes.value_scale_line == line
    expr, layers, _ = headsizes.sinks_condition({"modeling_lab.py": LAB_CODE}, LAB_CONFIG, None, "sink_logits", 2)
    assert (expr, layers) == ("config.attn_kinds[layer_idx] == 'local'", [1])


def _lab_checkpoint(tmp_path, *, value_width=8, sinks_layers=(1,), code=LAB_CODE, kv=(2, 4)):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_sizes", layers=2, extra=dict(LAB_CONFIG))
    shape.extra["value_width"] = value_width
    tensors = tensors_for(shape)
    h, d = shape.hidden, shape.head_dim
    for i in range(shape.layers):
        attn = f"model.layers.{i}.self_attn"
        for ours, theirs in (("q_proj", "wq"), ("k_proj", "wk"), ("v_proj", "wv"), ("o_proj", "wo")):
            tensors[f"{attn}.{theirs}.weight"] = tensors.pop(f"{attn}.{ours}.weight")
        tensors[f"{attn}.wk.weight"] = [kv[i] * d, h]
        tensors[f"{attn}.wv.weight"] = [kv[i] * value_width, h]
        tensors[f"{attn}.wo.weight"] = [h, shape.heads * value_width]
        if i in sinks_layers:
            tensors[f"{attn}.sink_logits"] = [shape.heads]
    read(tmp_path, shape, tensors=tensors)
    (tmp_path / "modeling_lab.py").write_text(code)
    return read_checkpoint(tmp_path)


def test_the_lab_checkpoint_passes_the_policy_and_sets_the_fields(tmp_path):
    ckpt = _lab_checkpoint(tmp_path)
    policy.check(ckpt)  # the shapes are what the code builds: k, v per layer, o over 4 heads x 8
    spec = detect_until(ckpt, attention)
    assert spec.layer_num_kv_heads == [2, 4] and spec.num_kv_heads == 2
    assert spec.source("layer_num_kv_heads").expr == \
        "config.num_key_value_heads * (2 if config.attn_kinds[layer_idx] == 'local' else 1)"
    assert (spec.v_head_dim, spec.source("v_head_dim").expr) == (8, "config.value_width")
    assert (spec.attn_value_scale, spec.source("attn_value_scale").expr) == (0.25, "config.value_multiplier")
    assert (spec.attention_sinks, spec.attention_sinks_layers) == ("sink_logits", [1])
    assert spec.source("attention_sinks_layers").expr == "config.attn_kinds[layer_idx] == 'local'"
    assert spec.kv_heads_of(1) == 4 and spec.value_dim == 8


def test_kv_tensors_other_than_the_code_builds_are_refused_with_their_shapes(tmp_path):
    # Layer 1's key and value projections hold 2 heads where the code builds 4: no reading explains them.
    ckpt = _lab_checkpoint(tmp_path, kv=(2, 2))
    with pytest.raises(CheckpointError, match=r"tensor model\.layers\.1\.self_attn\.wk\.weight has shape \[32, 64\], "
                                              r"but 4 query heads and 4 KV heads of size 16 \(values 8 wide\)"):
        detect_until(ckpt, attention)


def test_sinks_held_by_other_layers_than_the_code_builds_them_in_are_refused(tmp_path):
    ckpt = _lab_checkpoint(tmp_path, sinks_layers=(0,))
    with pytest.raises(UnsupportedArchitecture, match=r"attention sinks \(self_attn\.sink_logits\) in layers \[0\] "
                                                      r"only, where the code builds them where config\.attn_kinds"
                                                      r"\[layer_idx\] == 'local' \(modeling_lab\.py:\d+\): layers "
                                                      r"\[1\]"):
        detect_until(ckpt, layout)


def test_a_value_scale_the_reader_does_not_follow_is_refused_by_name(tmp_path):
    code = LAB_CODE.replace("v = v * self.value_mult", "v = v * torch.rsqrt(torch.tensor(float(self.hd)))")
    ckpt = _lab_checkpoint(tmp_path, code=code)
    with pytest.raises(UnsupportedArchitecture, match=r"attention sizes the port does not build: LabAttention "
                                                      r"\(modeling_lab\.py:\d+\) has the values scaled by "
                                                      r"torch\.rsqrt\(torch\.tensor\(float\(self\.hd\)\)\)"):
        detect_until(ckpt, attention)
