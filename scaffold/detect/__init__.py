"""Fill a Spec from a Checkpoint, one concern per module.

Each detector reads the checkpoint (config.json, tensor headers, modeling source)
and sets spec fields with their Source. Nothing here executes checkpoint code.
"""

from __future__ import annotations

from scaffold.checkpoint import Checkpoint
from scaffold.detect import attention, head, identity, layout, mlp, moe, norms, rope, scaling, sizes
from scaffold.spec import Spec, validate_identifiers, validate_names

DETECTORS = (identity, sizes, layout, attention, rope, mlp, moe, norms, scaling, head)


def detect(ckpt: Checkpoint) -> Spec:
    spec = Spec()
    for detector in DETECTORS:
        detector.detect(ckpt, spec)
    # Syntax only: whether the package name is free is checked once overrides may have renamed it.
    validate_identifiers(spec, str(ckpt.config_file), free=False)
    validate_names(spec, str(ckpt.config_file))
    return spec
