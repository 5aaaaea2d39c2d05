"""Numerical parity of the port inside vLLM with the original model in transformers.

Runs the same checks as `scaffold verify`; needs vllm-scaffold installed.
"""

import pytest
from conftest import CHECKPOINT, PORT_DIR

verify = pytest.importorskip("scaffold.verify")


def test_parity_with_transformers(checkpoint):
    report = verify.run(PORT_DIR, checkpoint=CHECKPOINT, trust_remote_code=False)
    assert report.passed, report.render()
