"""The transformers backend must still fuse what it fused when this package was generated.

A fuser that stops matching leaves the module unfused and the model still correct, only
slower: nothing else would notice. vLLM logs one `Fused:` line per module class and
attribute (matched anywhere on a line: the logger prefixes it).
"""

import re

from tiny_mo_e_vllm import EXPECTED_FUSIONS

RMS_MISS = "looks like an RMSNorm but its computation did not match"


def fused_lines(log: str) -> list[str]:
    return [
        line.split("Fused: ", 1)[1].strip()
        for line in log.splitlines()
        if "Fused: " in line
    ]


def test_every_expected_fusion_fired(engine_log):
    fired = fused_lines(engine_log)
    missing = [
        f"{e['kind']} {e['attr'] or 'experts'} ({e['module_class']})"
        for e in EXPECTED_FUSIONS
        if not e["group"] and not any(re.search(e["signature"], line) for line in fired)
    ]
    assert not missing, f"not fused any more: {missing}; Fused: lines seen: {fired}"


def test_each_conditional_group_fused_once(engine_log):
    fired = fused_lines(engine_log)
    groups = {}
    for e in EXPECTED_FUSIONS:
        if e["group"]:
            groups.setdefault(e["group"], []).append(e)
    for group, options in groups.items():
        assert any(
            re.search(e["signature"], line) for e in options for line in fired
        ), f"no module of {group} was fused; Fused: lines seen: {fired}"


def test_fused_line_count(engine_log):
    required = sum(1 for e in EXPECTED_FUSIONS if not e["group"])
    groups = len({e["group"] for e in EXPECTED_FUSIONS if e["group"]})
    assert len(fused_lines(engine_log)) >= required + groups


def test_no_rmsnorm_left_unfused(engine_log):
    misses = [line for line in engine_log.splitlines() if RMS_MISS in line]
    assert not misses, misses
