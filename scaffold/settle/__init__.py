"""Settle by computing what reading the code left open.

Detection reads the checkpoint's code and never runs it. Where the code admits more than one reading
(which half of a fused gate/up projection is the gate, when the code cuts it in a way the analysis
does not follow), detection records the field as unknown with its candidates. When running the
reference is allowed (`--trust-remote-code`, or transformers' own code for a model type it ships),
a settler builds the module of layer 0 that decides the field from the reference's code, gives it
random weights and a random input in a process of its own (scaffold.settle.worker), computes each
candidate from the same weights, and keeps the one that matches. The field's source then records
the candidates, the evidence and the choice (REVIEW.md's spec table shows it).

SETTLERS says which fields can be settled this way; a new one is a function that turns the spec
into a worker request, and a case in the worker that computes its candidates.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from scaffold.checkpoint import Checkpoint
from scaffold.proc import run_python
from scaffold.spec import Source, Spec

MATCH = 1e-5  # relative error below which a candidate reproduces the reference module's output
TIMEOUT_S = 300


def _gate_up_order(spec: Spec) -> dict | None:
    """Layer 0's MLP with its fused gate/up projection: which half goes through the activation."""
    if spec.gate_up_layout != "fused" or spec.is_moe or spec.mlp_on_layer:
        return None
    names = spec.names
    return {"field": "gate_up_order", "module": f"{names['model']}.{names['layers']}.0.{names['mlp']}",
            "fused": names["gate_up_proj"], "down": names["down_proj"], "act": spec.hidden_act,
            "intermediate_size": spec.intermediate_size, "hidden_size": spec.hidden_size}


SETTLERS: dict[str, Callable[[Spec], dict | None]] = {"gate_up_order": _gate_up_order}


def settle(spec: Spec, ckpt: Checkpoint, allowed: bool) -> Spec:
    """Settle the unknown fields a settler knows, by running the reference's code when `allowed`; the fields
    it cannot settle stay unknown, their reasons saying why."""
    for name in [n for n in spec.unknowns if n in SETTLERS]:
        request = SETTLERS[name](spec)
        if request is None:
            continue
        if not allowed:
            continue  # the unknown's reason already says that --trust-remote-code would settle it
        outcome = _run(ckpt, request)
        unknown = spec.unknowns[name]
        if "error" in outcome:
            spec.unknown(name, f"{unknown.reason}; running {request['module']} failed: {outcome['error']}",
                         unknown.candidates)
            continue
        errors = outcome["errors"]
        evidence = ", ".join(f"{c} {e:.1e}" for c, e in errors.items())
        matching = [c for c, e in errors.items() if e <= MATCH]
        what = (f"ran {request['module']} ({outcome['class']}, the reference's code) with random weights on a random "
                f"input; relative error of each candidate computed from the same weights: {evidence}")
        if len(matching) == 1:
            spec.set(name, matching[0], Source("computed", f"{what}; {matching[0]} reproduces it"))
        else:
            spec.unknown(name, f"{unknown.reason}; {what}: {'none' if not matching else 'more than one'} "
                               "reproduces it", unknown.candidates)
    return spec


def _run(ckpt: Checkpoint, request: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="scaffold-settle-") as tmp:
        out = Path(tmp) / "out.json"
        request_file = Path(tmp) / "request.json"
        request_file.write_text(json.dumps({**request, "checkpoint": str(ckpt.path.resolve()),
                                            "trust_remote_code": bool(ckpt.sources), "out": str(out)}))
        try:
            proc = run_python("scaffold.settle.worker", request_file, capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"no answer within {TIMEOUT_S} s"}
        if proc.returncode != 0 or not out.exists():
            lines = [line for line in (proc.stderr or proc.stdout).strip().splitlines() if line.strip()]
            return {"error": lines[-1] if lines else f"exit {proc.returncode}"}
        return json.loads(out.read_text())
