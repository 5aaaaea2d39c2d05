#!/usr/bin/env python
"""How far transformers is from itself: float32 against float64 on an engine row's tiny checkpoint.

Usage: python scripts/reference_drift.py ROW [ROW ...] [--set JSON]

Builds the checkpoint of each row of tests/test_architectures.py's ARCHITECTURES (as the suite builds it), runs
transformers on it in float32 and in float64 (the verifier's reference, its prompts and greedy continuations) and
prints the largest |log-probability difference| over the top-20 tokens at every position: parity's measure, the
float32 noise floor `scaffold verify` reports where parity fails. A row whose figure nears parity's tolerance (1e-4)
measures its depth, not the port. --set merges a JSON object over the row's overrides (another depth, with the
per-layer lists of that length).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def drift(model_type: str, overrides: dict, workdir: Path) -> float:
    from scaffold.checkpoint import read_checkpoint
    from scaffold.tiny import build_tiny
    from scaffold.verify import parity

    ckpt = build_tiny(model_type, workdir / "checkpoint", architecture="DriftForCausalLM", overrides=overrides)
    vocab = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    prompts = parity.prompts_for(read_checkpoint(ckpt), vocab)
    narrow = parity.hf_reference(ckpt, prompts, False, workdir)
    wide = parity.hf_reference(ckpt, prompts, False, workdir, dtype="float64")
    return parity.compare(wide, parity.as_candidate(narrow, prompts), prompts).max_delta


def main(argv: list[str]) -> int:
    from test_architectures import ARCHITECTURES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="+")
    parser.add_argument("--set", dest="changes", type=json.loads, default={},
                        help="a JSON object merged over each row's overrides")
    args = parser.parse_args(argv)
    for row in args.rows:
        model_type, overrides = ARCHITECTURES[row][:2]
        with tempfile.TemporaryDirectory(prefix="drift-") as tmp:
            figure = drift(model_type, {**overrides, **args.changes}, Path(tmp))
        changed = f" with {json.dumps(args.changes)}" if args.changes else ""
        print(f"{row}{changed}: transformers float32 vs float64 max |dlogp| {figure:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
