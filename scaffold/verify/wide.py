"""Float64 kept float64: the float64 reference without the float32 casts the modeling code asks for.

Modeling code "upcasts" for precision where it runs in half precision: `softmax(x, dtype=torch.float32)` in eager
attention (transformers' own, GPT-BigCode's, CodeShell's), `hidden_states.to(torch.float32)` in RMSNorm. Run in
float64 those are downcasts: the float64 reference then carries float32 rounding in every attention and norm, the
very error it is meant to measure. Inside `kept_float64()` a float64 tensor asked to become float32 stays float64;
every other cast (integers, booleans, float32 tensors such as the rotary tables built at load) is left as written.
"""

from __future__ import annotations

import contextlib

CASTS = ("to", "type", "float", "softmax", "log_softmax")  # the function names whose float32 requests are kept wide


def kept_float64():
    """A context in which float64 tensors are never cast down to float32."""
    import torch  # deferred on purpose: the parent process imports scaffold.verify without torch
    from torch.overrides import TorchFunctionMode

    class _KeepFloat64(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            name = getattr(func, "__name__", "")
            first = args[0] if args else None
            if name in CASTS and isinstance(first, torch.Tensor) and first.dtype == torch.float64:
                if name == "float":
                    return first
                args = tuple(torch.float64 if a is torch.float32 else a for a in args)
                if kwargs.get("dtype") is torch.float32:
                    kwargs["dtype"] = torch.float64
            return func(*args, **kwargs)

    return _KeepFloat64()


def wide_or_not(dtype):
    """kept_float64() for a float64 run, a context that does nothing otherwise."""
    import torch  # deferred on purpose, as above

    return kept_float64() if dtype == torch.float64 else contextlib.nullcontext()
