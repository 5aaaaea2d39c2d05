"""An output head normalized by the class that builds it, not by the head's own class (detect/head.py).

Ming's Bailing MoE (Ling) computes its logits in `BailingMoeForCausalLM.compute_logit`: under `if self.norm_head:`
(config.norm_head) it divides `self.lm_head.weight` by its L2 norm over dim 0 (each column, over the vocabulary) plus
1e-7, on the eval branch in place. Before this reading the generator took the head as a plain linear map and the port's
logits were off by up to 90 nats (verify: first divergence at the logits). The form is written here in words of its own
(an early return where the switch is off) into transformers' own Llama file.
"""

from __future__ import annotations

import re

import pytest
import torch
from ckpt_factory import Shape
from helpers import detect_until, read, scaffold, transformers_code

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import head
from scaffold.detect.head import normalized_by_owner
from scaffold.errors import UnsupportedArchitecture

COMPUTE_LOGIT = '''
    def project_logits(self, h):
        if not self.unit_columns:
            return self.lm_head(h)
        if self.training:
            scale = torch.norm(self.lm_head.weight, p=2, dim=0, keepdim=True) + 1e-7
            return F.linear(h, self.lm_head.weight / scale.detach())
        # once, in place, at the first eval call
        unit = self.lm_head.weight.data.float() / (torch.norm(self.lm_head.weight.data.float(), p=2, dim=0,
                                                              keepdim=True) + 1e-7)
        self.lm_head.weight.data = unit.to(h.dtype)
        self.unit_columns = False
        return F.linear(h, self.lm_head.weight.data)

'''


def lab_source(method: str = COMPUTE_LOGIT) -> str:
    source = next(iter(transformers_code("llama").values()))
    init = "        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)\n"
    assert source.count(init) == 1
    source = source.replace(init, init + "        self.unit_columns = config.head_unit_columns\n")
    forward = "    @can_return_tuple\n    @auto_docstring\n    def forward(\n"
    at = source.index(forward, source.index("class LlamaForCausalLM"))
    source = source[:at] + method + source[at:]
    return source.replace("logits = self.lm_head(hidden_states[:, slice_indices, :])",
                          "logits = self.project_logits(hidden_states[:, slice_indices, :])")


def ckpt(root, norm_head, tie=False):
    extra = {} if norm_head is None else {"head_unit_columns": norm_head}
    read(root, Shape(tie=tie, extra=extra))
    (root / "modeling_x.py").write_text(lab_source(), encoding="utf-8")
    return read_checkpoint(root)


def test_a_head_normalized_over_its_columns_by_the_causal_lm_is_read_with_its_epsilon(tmp_path):
    spec = detect_until(ckpt(tmp_path, True), head)
    assert spec.normalized_head is True and spec.normalized_head_columns is True
    assert spec.normalized_head_eps == pytest.approx(1e-7)
    assert "LlamaForCausalLM.project_logits L2-normalizes the weight's columns (dim 0), norm + 1e-07 (where " \
           "config.head_unit_columns)" in spec.source("normalized_head").detail


def test_config_json_turning_it_off_leaves_a_plain_head_and_an_undecided_switch_is_refused(tmp_path):
    spec = detect_until(ckpt(tmp_path / "off", False), head)
    assert spec.normalized_head is False and spec.normalized_head_columns is False
    assert "only where config.head_unit_columns holds" in spec.source("normalized_head").detail  # the key accounted for
    with pytest.raises(UnsupportedArchitecture, match=r"modeling_x\.py:\d+: LlamaForCausalLM\.project_logits "
                                                      r"normalizes the output head's weight under a condition"):
        detect_until(ckpt(tmp_path / "unsaid", None), head)


def test_a_tied_head_normalized_by_its_owner_is_refused(tmp_path):
    with pytest.raises(UnsupportedArchitecture, match="tied to the embedding"):
        detect_until(ckpt(tmp_path, True, tie=True), head)


def test_rows_by_f_normalize_and_another_p_are_told_apart():
    rows = COMPUTE_LOGIT.replace(
        "(torch.norm(self.lm_head.weight.data.float(), p=2, dim=0,\n                                                              keepdim=True) + 1e-7)",
        "torch.linalg.norm(self.lm_head.weight.data.float(), dim=-1, keepdim=True)")
    assert rows != COMPUTE_LOGIT
    found = normalized_by_owner({"m.py": lab_source(rows)}, "lm_head", {"head_unit_columns": True})
    assert found is not None and found.columns is False and found.eps is None
    p1 = COMPUTE_LOGIT.replace("float(), p=2, dim=0,", "float(), p=1, dim=0,")
    assert p1 != COMPUTE_LOGIT
    with pytest.raises(UnsupportedArchitecture, match="p=1 over dim 0"):
        normalized_by_owner({"m.py": lab_source(p1)}, "lm_head", {"head_unit_columns": True})


@pytest.mark.slow  # ~5 s: generates a port
def test_the_port_normalizes_the_columns_at_load_as_the_reference_does(tmp_path):
    root = tmp_path / "ckpt"
    ckpt(root, True)
    scaffold("new", root, "-o", tmp_path / "port")
    model = next((tmp_path / "port").glob("*/model.py")).read_text()
    review = (tmp_path / "port" / "REVIEW.md").read_text()
    assert "- normalized head: the columns (over the vocabulary) of `lm_head` are L2-normalized" in review
    norm = re.search(r"norm = (loaded_weight\.float\(\)\.norm\(dim=0, keepdim=True\))", model)
    scaled = re.search(r"loaded_weight = (\(loaded_weight\.float\(\) / \(norm \+ [0-9.e-]+\)\))\.to\(", model)
    assert norm and scaled, model
    loaded_weight = torch.randn(50, 8, generator=torch.Generator().manual_seed(0))
    norm = eval(norm.group(1))  # noqa: S307 (the port's own expression)
    ported = eval(scaled.group(1))  # noqa: S307
    reference = loaded_weight.float() / (torch.norm(loaded_weight.float(), p=2, dim=0, keepdim=True) + 1e-7)
    assert torch.equal(ported, reference)
