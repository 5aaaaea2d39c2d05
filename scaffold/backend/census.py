"""Fusion census: which `Fused:` lines vLLM's transformers backend logged, against what was expected.

The backend logs one `Fused: ...` line per module class and attribute (not per layer)
when a fuser rewrites a module, and a warning when a class named *RMSNorm does not
match the RMSNorm pattern. A fuser that stops matching is silent otherwise: the model
still serves correct tokens, only slower. So the expectation is written down
(`compliance.expected_fusions`, from the modeling source; cross-checked against the
spec when the generator understands the architecture) and the engine log is held to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from scaffold.backend.compliance import ExpectedFusion

ANSI = re.compile(r"\x1b\[[0-9;]*m")
FUSED = re.compile(r"Fused: (.+?)\s*$")
RMS_MISS = re.compile(r"(\w+) looks like an RMSNorm but its computation did not match")


def parse_log(text: str) -> tuple[list[str], list[str]]:
    """(the text after `Fused: ` of every fusion line, classes named in RMSNorm-miss warnings).

    `Fused:` is matched anywhere on a line: vLLM prefixes process names and timestamps.
    """
    fired, misses = [], []
    for raw in text.splitlines():
        line = ANSI.sub("", raw)
        m = FUSED.search(line)
        if m and m.group(1) not in fired:
            fired.append(m.group(1))
        m = RMS_MISS.search(line)
        if m and m.group(1) not in misses:
            misses.append(m.group(1))
    return fired, misses


@dataclass
class Row:
    expected: ExpectedFusion
    fired: str | None  # the matching log line, or None


@dataclass
class Census:
    rows: list[Row] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)  # fired lines nothing predicted
    rms_misses: list[str] = field(default_factory=list)
    spec_notes: list[str] = field(default_factory=list)

    @property
    def missing(self) -> list[ExpectedFusion]:
        """Required expectations that did not fire, plus one per conditional group where none fired."""
        out = [r.expected for r in self.rows if not r.expected.group and r.fired is None]
        groups: dict[str, list[Row]] = {}
        for r in self.rows:
            if r.expected.group:
                groups.setdefault(r.expected.group, []).append(r)
        for rows in groups.values():
            if not any(r.fired for r in rows):
                out.append(rows[0].expected)
        return out

    @property
    def ok(self) -> bool:
        return not self.missing and not self.rms_misses

    def per_class(self) -> list[tuple[str, int, int, list[str]]]:
        """(module class, lines expected, lines fired, what is missing) per class, in order."""
        out: dict[str, list] = {}
        missing = {id(e) for e in self.missing}
        for r in self.rows:
            cls = r.expected.module_class
            entry = out.setdefault(cls, [0, 0, []])
            if not r.expected.group:
                entry[0] += 1
            entry[1] += r.fired is not None
            if id(r.expected) in missing:
                entry[2].append(f"{r.expected.kind} {r.expected.attr or 'experts'}")
        return [(cls, e[0], e[1], e[2]) for cls, e in out.items()]

    def summary(self) -> str:
        required = sum(1 for r in self.rows if not r.expected.group)
        fired = sum(1 for r in self.rows if r.fired)
        text = f"{fired} Fused: line(s) matched, {required} required"
        if self.missing:
            text += "; missing: " + ", ".join(f"{e.kind} {e.attr or 'experts'} ({e.module_class})"
                                              for e in self.missing)
        if self.rms_misses:
            text += "; RMSNorm left unfused: " + ", ".join(self.rms_misses)
        if self.unexpected:
            text += f"; {len(self.unexpected)} unpredicted line(s)"
        return text

    def table(self) -> str:
        lines = ["  module class                         expected  fired  missing",
                 "  -----------------------------------  --------  -----  -------"]
        for cls, want, got, missing in self.per_class():
            lines.append(f"  {cls:<35}  {want:>8}  {got:>5}  {', '.join(missing) or '-'}")
        for line in self.unexpected:
            lines.append(f"  (unpredicted) {line}")
        for note in self.spec_notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "rows": [{**r.expected.to_json(), "fired": r.fired} for r in self.rows],
            "per_class": [{"module_class": c, "expected": w, "fired": g, "missing": m}
                          for c, w, g, m in self.per_class()],
            "unexpected": self.unexpected,
            "rms_misses": self.rms_misses,
            "spec_notes": self.spec_notes,
        }


def take(expected: list[ExpectedFusion], log: str) -> Census:
    """Hold the engine log to the expectation."""
    fired, misses = parse_log(log)
    census = Census(rms_misses=misses)
    used: set[str] = set()
    for e in expected:
        pattern = re.compile(e.signature)
        hit = next((line for line in fired if pattern.search(line)), None)
        if hit:
            used.add(hit)
        census.rows.append(Row(e, hit))
    census.unexpected = [line for line in fired if line not in used]
    return census


def spec_kinds(spec, rows) -> dict[str, int]:
    """What the spec predicts, per fusion kind (lines, i.e. distinct attributes), for a cross-check.

    q/k/v fuse when the checkpoint stores them separately; gate/up when the MLP is gated
    with separate gate and up tensors; each distinct RMSNorm attribute gives one line.
    """
    kinds = {"qkv": 0, "gate_up": 0, "rms_norm": 0}
    if spec.qkv_layout == "separate":
        kinds["qkv"] = 1
    if spec.mlp_kind == "gated" and any(r.checkpoint.endswith(".mlp.gate_proj.weight") for r in rows):
        kinds["gate_up"] = 1
    if spec.norm_kind == "rms":
        attrs = set()
        for r in rows:
            parts = r.checkpoint.split(".")
            if parts[-1] == "weight" and "norm" in parts[-2] and len(parts) >= 2:
                attrs.add(parts[-2])
        kinds["rms_norm"] = len(attrs)
    return kinds


def cross_check(census_or_expected, spec, rows) -> list[str]:
    """Disagreements between the source-based expectation and the spec's prediction."""
    expected = census_or_expected if isinstance(census_or_expected, list) else [r.expected for r in
                                                                                 census_or_expected.rows]
    predicted = spec_kinds(spec, rows)
    notes = []
    for kind, n in predicted.items():
        got = sum(1 for e in expected if e.kind == kind and not e.group)
        if got != n:
            notes.append(f"the spec predicts {n} {kind} line(s), the modeling source {got}")
    return notes
