"""detect/configexpr.py: arithmetic over config values, read from code as text and evaluated on config.json."""

from __future__ import annotations

import ast

import pytest

from scaffold.detect import configexpr


def expr(text: str, kept: dict | None = None, props: dict | None = None) -> str | None:
    return configexpr.expression(ast.parse(text, mode="eval").body, kept, props)


@pytest.mark.parametrize("code, want", [
    ("config.scale_emb", "config.scale_emb"),
    ("self.config.scale_depth / math.sqrt(config.num_hidden_layers)",
     "config.scale_depth / (config.num_hidden_layers ** 0.5)"),
    ("(self.config.hidden_size / self.config.dim_model_base)", "config.hidden_size / config.dim_model_base"),
    ("2 * config.x - 1", "(2 * config.x) - 1"),
])
def test_config_arithmetic_is_one_expression_over_config(code, want):
    assert expr(code) == want


@pytest.mark.parametrize("code", ["2.0", "self.scale", "torch.exp(config.x)", "config.x * hidden_states", "x"])
def test_anything_but_config_arithmetic_is_not_an_expression(code):
    assert expr(code) is None


def test_values_kept_on_the_module_and_config_properties_are_substituted():
    kept = {"residual_scale": ast.parse("config.scale_depth / math.sqrt(config.num_hidden_layers)", mode="eval").body}
    assert expr("self.residual_scale", kept) == "config.scale_depth / (config.num_hidden_layers ** 0.5)"
    props = configexpr.properties({"configuration_minicpm3.py": _minicpm3_configuration()})
    assert expr("self.config.logits_scaling", props=props) == "config.hidden_size / config.dim_model_base"


def _minicpm3_configuration() -> str:
    import importlib.util
    from pathlib import Path

    root = Path(next(iter(importlib.util.find_spec("transformers").submodule_search_locations)))
    return (root / "models" / "minicpm3" / "configuration_minicpm3.py").read_text(encoding="utf-8")


def test_evaluated_on_config_json_values():
    config = {"scale_depth": 1.4, "num_hidden_layers": 4, "hidden_size": 128, "dim_model_base": 64, "flag": True}
    assert configexpr.evaluate("config.scale_depth / (config.num_hidden_layers ** 0.5)", config) == pytest.approx(0.7)
    assert configexpr.evaluate("config.hidden_size / config.dim_model_base", config) == 2.0
    assert configexpr.evaluate("config.missing * 2", config) is None
    assert configexpr.evaluate("config.flag * 2", config) is None  # a boolean is not a number
    assert configexpr.evaluate("config.hidden_size / (config.dim_model_base - 64)", config) is None
