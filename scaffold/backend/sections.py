"""The transformers-backend compliance section of `scaffold inspect` and REVIEW.md (scaffold.review calls these)."""

from __future__ import annotations

from scaffold.analysis import Analysis
from scaffold.backend.census import cross_check
from scaffold.backend.compliance import Compliance, Rule, check, render_markdown, render_text


def _compliance(analysis: Analysis) -> tuple[Compliance, list[str]]:
    try:
        comp = check(analysis.ckpt)
    except (RecursionError, ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
        # The section must never take `scaffold inspect` down with it.
        comp = Compliance("unknown", [])
        comp.rules.append(Rule("modeling source", None, f"not analysed ({type(exc).__name__}: {exc})"))
        return comp, []
    notes = cross_check(comp.expected, analysis.spec, analysis.rows) if comp.compliant else []
    return comp, notes


def compliance_text(analysis: Analysis) -> list[str]:
    comp, notes = _compliance(analysis)
    return render_text(comp) + [f"  note: {n}" for n in notes]


def compliance_json(analysis: Analysis) -> dict:
    comp, notes = _compliance(analysis)
    return {**comp.to_json(), "spec_cross_check": notes}


def compliance_markdown(analysis: Analysis) -> list[str]:
    comp, notes = _compliance(analysis)
    out = render_markdown(comp)
    if notes:
        out += [f"- note: {n}" for n in notes] + [""]
    return out
