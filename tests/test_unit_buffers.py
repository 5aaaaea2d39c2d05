"""Buffers the modeling code registers, told apart from parameters the checkpoint stores under the same name.

A buffer the checkpoint stores (chatglm's rotary inv_freq) is skipped: the port recomputes it. The name alone does
not say it is one: CodeShell's base model registers its causal mask as `bias`, and its final norm's `ln_f.bias` is an
nn.LayerNorm's parameter that must load (tests/mask_buffer_ckpt.py is a lab of that form). A stored tensor is a
buffer where the class that builds its module registers that name."""

from __future__ import annotations

import pytest
from helpers import detect_until

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import codekeys, layout

CODE = '''
import torch
from torch import nn


class LabRotary(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim)))


class LabScaledRotary(LabRotary):
    pass


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.rotary_emb = LabScaledRotary(16)
        self.ln_f = nn.LayerNorm(config.hidden_size)
        self.register_buffer("bias", torch.tril(torch.ones(8, 8, dtype=torch.bool)), persistent=False)


class LabForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.transformer = LabModel(config)
'''


def test_a_stored_tensor_is_a_buffer_where_the_class_that_builds_its_module_registers_it():
    tensors = ["transformer.rotary_emb.inv_freq", "transformer.bias", "transformer.ln_f.bias",
               "transformer.ln_f.weight", "transformer.other.bias"]
    # rotary_emb is a LabScaledRotary, a LabRotary (inherited); the mask `bias` is LabModel's, built as
    # `transformer`; ln_f is an nn.LayerNorm, whose bias is a parameter. `other` is built nowhere in the code:
    # its name decides.
    assert codekeys.stored_buffers({"modeling_lab.py": CODE}, tensors) == [
        "transformer.rotary_emb.inv_freq", "transformer.bias", "transformer.other.bias"]


@pytest.mark.slow  # builds and saves a checkpoint through transformers (~5 s)
def test_a_final_norm_bias_is_not_taken_for_a_causal_mask_buffer_named_bias(tmp_path):
    from mask_buffer_ckpt import build

    ckpt = read_checkpoint(build(tmp_path / "masklab"))
    assert "model.norm.bias" in ckpt.tensors
    spec = detect_until(ckpt, layout)  # refused before: "the final norm and the layer norms differ in having a bias"
    assert (spec.norm_kind, spec.norm_bias) == ("layer", True)
    assert spec.names["norm"] == "norm" and "model.norm.bias" not in spec.skipped_tensors


@pytest.mark.slow  # builds and saves a checkpoint through transformers (~5 s)
def test_a_boolean_causal_mask_buffer_stored_in_every_layer_is_read_and_skipped(tmp_path):
    from stored_mask_ckpt import build

    from scaffold.detect.forms import read_checkpoint as read_with_code
    from scaffold.mapping import weight_table

    path = build(tmp_path / "storedmasklab")
    with pytest.raises(Exception, match="BOOL"):  # the reader alone takes float weights only
        read_checkpoint(path)
    ckpt = read_with_code(path)  # refused before: "has dtype 'BOOL', a quantized or non-float dtype"
    masks = [n for n, info in ckpt.tensors.items() if info.dtype == "BOOL"]
    assert masks == [f"transformer.h.{i}.attn.causal_mask" for i in range(len(masks))] and masks
    spec = detect_until(ckpt, layout)  # refused before: "layer 0 holds tensor(s) that no part of the port ..."
    assert sorted(spec.skipped_tensors) == sorted(masks)
    rows, homeless = weight_table(spec, ckpt)
    assert homeless == []
    assert {r.checkpoint: (r.param, r.note) for r in rows if r.checkpoint in masks} == dict.fromkeys(masks, (None, "recomputed buffer"))
