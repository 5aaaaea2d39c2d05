"""ALiBi and the normalized output head, read from the modeling code (detect/positions.py, detect/head.py),
and the port's ALiBi slopes against Baichuan 2's own.

Baichuan 2's modeling source is read from ../shared/realmodels (helpers.REALMODELS), never copied into
the project; transformers' Llama modeling file is the counter-example, so each check can fail.
"""

from __future__ import annotations

import ast
import math

import pytest
from ckpt_factory import Shape
from helpers import REALMODELS, detect_until, read, scaffold

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import head, rope
from scaffold.detect.head import normalized_head
from scaffold.detect.positions import alibi_code, rotary_code
from scaffold.detect.sourcecode import modeling_sources
from scaffold.errors import UnsupportedArchitecture

BAICHUAN2 = REALMODELS / "src" / "baichuan2" / "modeling_baichuan.py"


@pytest.fixture(scope="module")
def baichuan2_source() -> dict[str, str]:
    if not BAICHUAN2.is_file():
        pytest.fail(f"{BAICHUAN2} is missing: ../shared/realmodels must sit beside the clone")
    return {BAICHUAN2.name: BAICHUAN2.read_text(encoding="utf-8")}


def with_modeling_source(root, source: str, shape: Shape | None = None):
    """A tiny Llama-layout checkpoint that ships `source` as its modeling code (written at test time)."""
    read(root, shape)
    (root / "modeling_x.py").write_text(source, encoding="utf-8")
    return read_checkpoint(root)


def test_alibi_is_read_from_baichuan2s_code(baichuan2_source):
    found = alibi_code(baichuan2_source)
    assert found is not None and found.file == BAICHUAN2.name
    line = baichuan2_source[BAICHUAN2.name].splitlines()[found.line - 1]
    assert "log2" in line, f"expected the slopes formula, found line {found.line}: {line!r}"
    assert rotary_code(baichuan2_source) is None


def test_llama_computes_rotary_not_alibi(tmp_path):
    spec = detect_until(read(tmp_path), rope)  # no own code: transformers' modeling_llama.py is read
    assert spec.position_scheme == "rotary"
    assert spec.source("position_scheme").kind == "code"
    assert "modeling_llama.py" in spec.source("position_scheme").detail


def test_a_checkpoint_with_baichuan2s_code_is_alibi_with_a_normalized_head(tmp_path, baichuan2_source):
    ckpt = with_modeling_source(tmp_path, baichuan2_source[BAICHUAN2.name])
    spec = detect_until(ckpt, head)
    assert spec.position_scheme == "alibi"
    assert spec.source("position_scheme").kind == "code"
    assert spec.normalized_head is True
    assert "NormHead" in spec.source("normalized_head").detail


def test_llamas_head_is_not_normalized(tmp_path):
    spec = detect_until(read(tmp_path), head)
    assert spec.normalized_head is False
    assert normalized_head(modeling_sources(read_checkpoint(tmp_path)), "lm_head") is None


def test_code_with_both_schemes_follows_the_config_flag_or_is_refused(tmp_path, baichuan2_source):
    both = baichuan2_source[BAICHUAN2.name] + "\n\ndef rotate_half(x):\n    return x\n"
    with pytest.raises(UnsupportedArchitecture, match="both ALiBi"):
        detect_until(with_modeling_source(tmp_path / "a", both), rope)
    spec = detect_until(with_modeling_source(tmp_path / "b", both, Shape(extra={"alibi": False})), rope)
    assert spec.position_scheme == "rotary" and spec.source("position_scheme").kind == "config"


def test_a_tied_normalized_head_is_refused(tmp_path, baichuan2_source):
    ckpt = with_modeling_source(tmp_path, baichuan2_source[BAICHUAN2.name], Shape(tie=True))
    with pytest.raises(UnsupportedArchitecture, match="tied to the embedding"):
        detect_until(ckpt, head)


def test_a_head_normalized_over_its_columns_is_refused(tmp_path, baichuan2_source):
    columns = baichuan2_source[BAICHUAN2.name].replace(
        "nn.functional.normalize(self.weight)", "nn.functional.normalize(self.weight, dim=0)")
    assert columns != baichuan2_source[BAICHUAN2.name]
    with pytest.raises(UnsupportedArchitecture, match="over dim 0"):
        normalized_head({"m.py": columns}, "lm_head")


def _function(source: str, name: str, namespace: dict):
    """One top-level function of `source`, compiled alone into `namespace` (nothing else of the file runs)."""
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module(body=[node], type_ignores=[]), name, "exec"), namespace)  # noqa: S102 (the reference)
    return namespace[name]


@pytest.mark.parametrize("heads", [12, 8, 40])
def test_the_ports_alibi_slopes_are_baichuan2s(tmp_path, baichuan2_source, heads):
    """The generated port's alibi_slopes against the reference: Baichuan 2's own `_get_interleave`, taken
    from its modeling source and run alone (a pure function of math; this test owns that consent)."""
    import torch  # here, not at the top: a module-level import costs every quick-tier worker ~4 s at collection

    shape = Shape(hidden=heads * 32, heads=heads, kv_heads=heads, head_dim=32)
    ckpt = tmp_path / "ckpt"
    read(ckpt, shape)
    (tmp_path / "spec.toml").write_text('position_scheme = "alibi"\n')
    scaffold("new", ckpt, "-o", tmp_path / "port", "--spec", tmp_path / "spec.toml")
    model = next((tmp_path / "port").glob("*/model.py")).read_text()
    port_slopes = _function(model, "alibi_slopes", {"math": math, "torch": torch})(heads)
    reference = _function(baichuan2_source[BAICHUAN2.name], "_get_interleave", {"math": math})(heads)
    assert len(reference) == heads
    torch.testing.assert_close(port_slopes, torch.tensor(reference, dtype=torch.float32), rtol=1e-6, atol=0)
    assert "get_rope" not in model and "alibi_slopes=slopes" in model


def test_review_and_model_say_alibi_and_the_normalized_head_only_when_the_spec_has_them(tmp_path):
    ckpt = tmp_path / "ckpt"
    read(ckpt)
    (tmp_path / "spec.toml").write_text('position_scheme = "alibi"\nnormalized_head = true\n')
    scaffold("new", ckpt, "-o", tmp_path / "alibi", "--spec", tmp_path / "spec.toml")
    scaffold("new", ckpt, "-o", tmp_path / "rotary")
    for port, expected in (("alibi", True), ("rotary", False)):
        review = (tmp_path / port / "REVIEW.md").read_text()
        model = next((tmp_path / port).glob("*/model.py")).read_text()
        assert ("- positions: ALiBi, no rotary embedding" in review) is expected, port
        assert ("- rotary embedding: NeoX style." in review) is not expected, port
        assert ("- normalized head: the rows of `lm_head` are L2-normalized" in review) is expected, port
        assert ("torch.nn.functional.normalize(loaded_weight" in model) is expected, port
        assert ("self.rotary_emb = get_rope(" in model) is not expected, port
