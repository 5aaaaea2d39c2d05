"""detect/conditions.py: the branch of `A(...) if COND else B(...)` that config.json selects."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from scaffold.detect.conditions import evaluate, selected
from scaffold.detect.sourcecode import norm_code

# The installed transformers' folder, found without importing it (that costs each test worker ~4 s).
TRANSFORMERS = Path(importlib.util.find_spec("transformers").submodule_search_locations[0])


def expr(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


@pytest.mark.parametrize("test, config, truth", [
    ("config.rms_norm_eps is not None", {"rms_norm_eps": None}, False),
    ("config.rms_norm_eps is not None", {"rms_norm_eps": 1e-6}, True),
    ("self.config.use_qk_norm", {"use_qk_norm": True}, True),
    ("not config.use_qk_norm", {"use_qk_norm": True}, False),
    ("config.norm_type == 'layer'", {"norm_type": "rms"}, False),
    ("config.norm_type in ('rms', 'rmsnorm')", {"norm_type": "rms"}, True),
    ("getattr(config, 'parallel', False)", {}, False),
    ("config.a and config.b", {"a": False}, False),  # decided without b
    ("config.a or config.b", {"a": True}, True),
])
def test_conditions_over_config_values(test, config, truth):
    assert evaluate(expr(test), config) is truth


@pytest.mark.parametrize("test, config", [
    ("config.missing_key", {}),  # the config class's default decides: unknown here
    ("layer_idx % 2 == 0", {}),  # not a config value
    ("config.a < config.b", {"a": None, "b": 3}),  # a comparison the values do not support
    ("config.a and config.b", {"a": True}),
])
def test_conditions_it_cannot_decide_stay_undecided(test, config):
    assert evaluate(expr(test), config) is None


def test_nested_branches_and_no_config():
    value = expr("A() if config.x else (B() if config.y else C())")
    assert ast.unparse(selected(value, {"x": False, "y": False})) == "C()"
    assert selected(value, {"x": False}) is None
    assert selected(value, None) is None
    assert ast.unparse(selected(expr("A()"), None)) == "A()"


def test_cohere2_moe_norm_follows_its_config():
    """Cohere2-MoE builds an RMS norm when rms_norm_eps is set, else a mean-subtracting LayerNorm."""
    path = TRANSFORMERS / "models" / "cohere2_moe" / "modeling_cohere2_moe.py"
    sources = {"modeling_cohere2_moe.py": path.read_text(encoding="utf-8")}
    layer = norm_code(sources, "input_layernorm", {"rms_norm_eps": None, "layer_norm_eps": 1e-5})
    rms = norm_code(sources, "input_layernorm", {"rms_norm_eps": 1e-6})
    assert (layer.cls, layer.centered) == ("Cohere2MoeLayerNorm", True)
    assert (rms.cls, rms.centered) == ("Cohere2MoeRMSNorm", False)
    assert norm_code(sources, "input_layernorm", {}) is None  # undecided, not guessed


@pytest.mark.parametrize("layer, truth", [(0, True), (1, False)])
def test_hasattr_and_a_layer_indexed_config_list(layer, truth):
    # EXAONE-4's rotary condition once its __init__ local is put in: hasattr is true where config.json holds the key.
    test = expr("config.sliding_window is None or (config.layer_types[layer_idx] if hasattr(config, 'layer_types') "
                "else None) == 'sliding_attention'")
    config = {"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]}
    assert evaluate(test, config, {"layer_idx": layer}) is truth
    # A key config.json does not hold: the config class may still define it, so nothing is decided.
    assert evaluate(expr("hasattr(config, 'layer_types')"), {"sliding_window": 8}) is None


def test_a_branch_after_an_early_return_and_one_test_decided_against_it():
    """`if not self.on: return x` leaves the rest of the block under `self.on` (read through __init__'s
    `self.on = config.on`); a test config.json decides against a branch is enough, whatever undecided test
    (an input's) sits beside it; `self.training` is never the branch serving runs."""
    from scaffold.detect import conditions as c

    func = ast.parse(
        "def f(self, x, image):\n"
        "    if x is None:\n"
        "        raise ValueError('x')\n"
        "    if not self.on:\n"
        "        return x\n"
        "    if self.training and x.any():\n"
        "        return image\n"
        "    return x + image\n").body[0]
    assigned = {"on": ast.parse("config.on", mode="eval").body}
    reads = [tests for node, tests in c.guarded(func.body) if isinstance(node, ast.Name) and node.id == "image"]
    training, after = reads
    assert c.branch_taken(after, assigned, {"on": False}) is False
    assert c.branch_taken(after, assigned, {"on": True}) is None  # `x is None` stays undecided
    assert c.branch_taken(training, assigned, {"on": True}) is False
