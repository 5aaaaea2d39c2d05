"""The tests a generated package ships pass against its own checkpoint, in the real engine."""

from __future__ import annotations

import pytest
from helpers import EXAMPLES, own_weight_tests_pass, scaffold


@pytest.mark.engine
def test_generated_weight_mapping_tests_pass(workdir):
    out = workdir / "port-demolm-own-tests"
    scaffold("new", EXAMPLES / "demolm", "-o", out, "--force")
    own_weight_tests_pass(out, at_least=6)
