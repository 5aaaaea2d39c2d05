"""The second half of tests/test_architectures.py's engine rows, in a file of its own so that the suite's two
xdist workers (--dist loadfile) share the rows. The table, the check and the coverage document are
test_architectures.py's."""

from __future__ import annotations

import pytest
import test_architectures as architectures
from helpers import engine_sample
from test_architectures import coverage_results  # noqa: F401  (autouse: this module's rows go to the script too)


@pytest.mark.engine
@pytest.mark.parametrize("name", engine_sample(architectures.SECOND_HALF,
                                               keep=[n for n in architectures.SUITE_ROWS if n in architectures.SECOND_HALF]))
def test_port_matches_transformers(name, workdir):
    architectures.check_port(name, workdir)
