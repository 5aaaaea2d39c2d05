"""detect/routingmath.py: a routing without a top-k (PhiMoE's sparsemixer) read by what it computes.

The routing path's statements after the router logits are interpreted over sample logits and compared with vLLM's
sparsemixer at the jitter the code reads: transformers' PhiMoE, a lab's router that inlines the same computation
under other names, and variants that compute otherwise (refused with the difference or the line)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import transformers
from helpers import LAB_PRELUDE

from scaffold.detect.routingmath import SparseMixer, read_sparsemixer, reference, samples

MODELS = Path(transformers.__file__).parent / "models"
PHIMOE = MODELS / "phimoe" / "modeling_phimoe.py"
CONFIG = {"num_local_experts": 6, "router_jitter_noise": 0.2, "input_jitter_noise": 0.0, "num_experts_per_tok": 2}


def test_transformers_phimoe_is_vllms_sparsemixer_at_the_configs_jitter():
    sources = {"transformers/models/phimoe/modeling_phimoe.py": PHIMOE.read_text(encoding="utf-8")}
    found = read_sparsemixer(sources, "PhimoeSparseMoeBlock", "experts", CONFIG, 2)
    assert isinstance(found, SparseMixer), found
    assert found.jitter == 0.2 and found.jitter_key == "router_jitter_noise"
    assert found.evidence.startswith("transformers/models/phimoe/modeling_phimoe.py:")


def test_transformers_phimoe_routes_two_experts_whatever_the_config_says():
    sources = {"modeling_phimoe.py": PHIMOE.read_text(encoding="utf-8")}
    found = read_sparsemixer(sources, "PhimoeSparseMoeBlock", "experts", CONFIG, 3)
    assert isinstance(found, str) and "routes each token to 2 experts, but config.json says 3" in found


def test_the_samples_put_scores_inside_and_outside_the_gap():
    """The comparison means something only where the masks matter: some rows weight an expert below 1 (another
    score inside the gap) and some at 1 (every other score masked)."""
    weights, _ = reference(samples(0.2, 6), 0.2)
    firsts = [w[0] for w in weights]
    assert any(w < 0.999 for w in firsts) and any(w == 1.0 for w in firsts)


# A lab's router: the same computation inlined into its forward, other names, torch.max / torch.cat / F.softmax,
# the logits from F.linear over a weight of its own, the jitter under another key. {gap} and {second_mask} vary it.
LAB = LAB_PRELUDE + '''
class ExpertPicker(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w = nn.Parameter(torch.empty(config.num_local_experts, config.hidden_size))
        self.tolerance = config.routing_tolerance

    def forward(self, x):
        logits = F.linear(x, self.w)
        best, first = torch.max(logits, dim=-1, keepdim=True)
        scale = torch.clamp(logits.abs(), min=best)
        keep_out = (best - logits) / scale > {gap}
        p1 = F.softmax(logits.masked_fill(keep_out, float("-inf")), dim=-1).gather(-1, first)
        rest = logits.scatter(-1, first, float("-inf"))
        best2, second = rest.max(dim=-1, keepdim=True)
        scale2 = {second_mask}.abs().clamp(min={clamp2})
        keep_out2 = (best2 - {second_mask}) / scale2 > {gap}
        p2 = F.softmax(rest.masked_fill(keep_out2, float("-inf")), dim=-1).gather(-1, second)
        return torch.cat([p1, p2], dim=-1), torch.cat([first, second], dim=-1)


class LabMoe(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.picker = ExpertPicker(config)
        self.bank = nn.ModuleList()

    def forward(self, x):
        weights, chosen = self.picker(x)
        return self.bank(x, weights, chosen)
'''
LAB_CONFIG = {"num_local_experts": 6, "routing_tolerance": 0.15}


def lab(gap: str = "2 * self.tolerance", second_mask: str = "logits", clamp2: str = "best2") -> dict[str, str]:
    text = LAB.replace("{gap}", gap).replace("{second_mask}", second_mask).replace("{clamp2}", clamp2)
    return {"lab/modeling_lab.py": text}


# The second mask over the scores with the first expert's set to -inf computes the same: |-inf| makes its gap
# nan, never masked, and that score is -inf whatever the mask says.
@pytest.mark.parametrize("second_mask", ["logits", "rest"])
def test_a_labs_inlined_sparsemixer_is_read_by_what_it_computes(second_mask):
    found = read_sparsemixer(lab(second_mask=second_mask), "LabMoe", "bank", LAB_CONFIG, 2)
    assert isinstance(found, SparseMixer), found
    assert math.isclose(found.jitter, 0.15) and found.jitter_key == "routing_tolerance"


@pytest.mark.parametrize("gap, clamp2", [
    # The gap at the jitter itself, not twice it: no jitter the code reads makes it sparsemixer.
    ("self.tolerance", "best2"),
    # The second gap relative to the best score's magnitude, not the runner-up's.
    ("2 * self.tolerance", "best"),
    # A gap no number of the code gives.
    ("0.05 + self.tolerance", "best2"),
])
def test_a_routing_that_computes_otherwise_is_refused(gap, clamp2):
    why = "is not vLLM's sparsemixer at any jitter"
    found = read_sparsemixer(lab(gap, clamp2=clamp2), "LabMoe", "bank", LAB_CONFIG, 2)
    assert isinstance(found, str) and why in found, found
    assert found.startswith("lab/modeling_lab.py:")


def test_what_the_reader_does_not_follow_is_named_with_its_line():
    sources = lab()
    sources["lab/modeling_lab.py"] = sources["lab/modeling_lab.py"].replace(
        "rest = logits.scatter(-1, first, float(\"-inf\"))",
        "rest = torch.where(logits == best, float(\"-inf\"), logits)")
    found = read_sparsemixer(sources, "LabMoe", "bank", LAB_CONFIG, 2)
    assert isinstance(found, str) and "which the routing reader does not follow" in found, found
    assert "torch.where" in found
