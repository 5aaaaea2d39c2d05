#!/usr/bin/env python
"""How far transformers is from itself: float32 against float64 on an engine row's tiny checkpoint.

Usage: python scripts/reference_drift.py ROW [ROW ...] [--set JSON]

Builds the checkpoint of each row of tests/test_architectures.py's ARCHITECTURES (as the suite builds it), runs
transformers on it in float32 and in float64 (eager attention, as the verifier's reference) over the verifier's
prompts and 16 greedy tokens of float64's, and prints the largest |log-probability difference| over float64's
top-20 tokens at every position: the same measure as parity's. A row whose figure nears parity's tolerance (1e-4)
measures its depth, not the port. --set merges a JSON object over the row's overrides (another depth, with the
per-layer lists of that length).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from scaffold.verify.parity import NEW_TOKENS, PROMPT_LENGTHS, TOP_K


def drift(model_type: str, overrides: dict, workdir: Path) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    from scaffold.tiny import build_tiny

    ckpt = build_tiny(model_type, workdir / "checkpoint", architecture="DriftForCausalLM", overrides=overrides)
    vocab = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    rng = random.Random(1234)
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in PROMPT_LENGTHS]
    wide, narrow = (AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype, attn_implementation="eager").eval()
                    for dtype in (torch.float64, torch.float32))
    worst = 0.0
    with torch.no_grad():
        for prompt in prompts:
            ids = wide.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
            a = torch.log_softmax(wide(ids).logits[0].double(), -1)
            b = torch.log_softmax(narrow(ids).logits[0].double(), -1)
            top = a.topk(TOP_K, -1).indices
            worst = max(worst, (a.gather(-1, top) - b.gather(-1, top)).abs().max().item())
    return worst


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
