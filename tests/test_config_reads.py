"""verify's "config keys the code reads": a key the modeling code reads that no spec field accounts for is
named with its line (a rotated fraction under the model's own key would otherwise pass unnoticed)."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import EXAMPLES, scaffold

from scaffold.detect.configreads import config_reads

SOURCE = '''
class MyConfig:
    def __init__(self, config):
        self.ignored = config.defined_here


class MyAttention:
    def __init__(self, config):
        self.scale = config.attn_scale
        self.frac = getattr(config, "rot_frac", 1.0)
        if hasattr(self.config, "flag"):
            pass


class MyForSequenceClassification:
    def __init__(self, config):
        self.labels = config.num_labels_here
'''


def test_reads_are_found_with_their_lines():
    reads = config_reads({"modeling_my.py": SOURCE, "configuration_my.py": "x = config.only_in_config_file\n"})
    assert reads == {"defined_here": "modeling_my.py:4", "attn_scale": "modeling_my.py:9",
                     "rot_frac": "modeling_my.py:10", "flag": "modeling_my.py:11"}


def _check(report: dict, name: str) -> dict:
    return next(c for c in report["checks"] if c["name"] == name)


@pytest.mark.slow  # 9-20 s on 2 cores: CLI runs in subprocesses that import torch and vLLM
def test_verify_names_a_key_the_spec_does_not_account_for(tmp_path):
    port = tmp_path / "port"
    scaffold("new", EXAMPLES / "demolm", "-o", port)
    clean = json.loads(scaffold("verify", port, "--static-only", "--json").stdout)
    assert _check(clean, "config keys the code reads")["status"] == "pass"

    ckpt = tmp_path / "demolm-fraction"
    shutil.copytree(EXAMPLES / "demolm", ckpt)
    modeling = ckpt / "modeling_demolm.py"
    text = modeling.read_text()
    anchor = '    head_dim = config.head_dim\n'
    assert anchor in text
    modeling.write_text(text.replace(anchor, anchor + '    head_dim = int(head_dim * config.rotated_share)\n', 1))
    line = text[:text.index(anchor)].count("\n") + 2
    proc = scaffold("verify", port, "--checkpoint", ckpt, "--static-only", "--json", check=False)
    report = json.loads(proc.stdout)
    check = _check(report, "config keys the code reads")
    assert check["status"] == "note", check
    assert f"rotated_share (modeling_demolm.py:{line})" in check["detail"], check
