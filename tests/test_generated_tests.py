"""The tests a generated package ships pass against its own checkpoint, in the real engine."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import EXAMPLES, scaffold


@pytest.mark.engine
def test_generated_weight_mapping_tests_pass(workdir):
    from scaffold.verify.port import load_port, stage_install

    out = workdir / "port-demolm-own-tests"
    scaffold("new", EXAMPLES / "demolm", "-o", out, "--force")
    stage = stage_install(load_port(out))
    env = dict(os.environ, PYTHONPATH=str(stage), VLLM_PLUGINS="demo_lm_vllm")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(out / "tests" / "test_weight_mapping.py")],
                          capture_output=True, text=True, env=env, cwd=out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 6 and "failed" not in summary and "error" not in summary, summary
