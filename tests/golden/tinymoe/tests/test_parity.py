"""Numerical parity of the transformers backend inside vLLM with the model in transformers.

Runs the same checks as `scaffold verify`; needs vllm-scaffold installed.
"""

import pytest
from conftest import CHECKPOINT, PACKAGE_DIR

verify = pytest.importorskip("scaffold.verify")


def test_parity_with_transformers(checkpoint):
    report = verify.run(PACKAGE_DIR, checkpoint=CHECKPOINT, trust_remote_code=True)
    assert report.passed, report.render()
