"""Quantized checkpoints: the float view of their tensors that detection and mapping read.

A quantized checkpoint stores each linear of the decoder as the tensors of its quantization
method (AWQ: `qweight`, `qzeros`, `scales`) instead of one `weight`. The port is the same
as for the float checkpoint: vLLM's linear layers create the method's parameters from
`quantization_config`, and the generated load_weights sends every tensor of a module to the
parameter of that module's role, whatever its suffix. So the reader presents each quantized
module as the `weight` it stands for ([out, in], the dtype of its scales), and everything
downstream (detection, the weight table, the static checks) works on that view.

Methods read here are the ones vLLM's CPU build serves and whose layout is checked:
AWQ, 4-bit, GEMM layout.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from scaffold.errors import CheckpointError, UnsupportedArchitecture

SUPPORTED_METHODS = ("awq",)
# Integer tensors a quantization method stores (packed 4-bit values, group indices), and
# their bytes per element for the header's size check.
PACKED_DTYPES = {"I32": 4}
PACKED_SUFFIXES = (".qweight", ".qzeros", ".g_idx")
AWQ_PACK = 8  # 4-bit values per int32


def is_packed(name: str, dtype: str) -> bool:
    """Whether a header entry is a quantization method's integer tensor (allowed besides float dtypes)."""
    return dtype in PACKED_DTYPES and name.endswith(PACKED_SUFFIXES)


def quantization_method(config: dict) -> str | None:
    quant = config.get("quantization_config")
    if not quant:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    return method if isinstance(method, str) else "unknown method"


def check_supported(config: dict, where: Path) -> None:
    """Refuse a quantization_config whose method or layout a port is not generated for."""
    method = quantization_method(config)
    if method is None:
        return
    if method not in SUPPORTED_METHODS:
        raise UnsupportedArchitecture(
            f"the checkpoint is quantized (quantization_config, {method!r}); scaffold ports F32, F16 and BF16 "
            f"weights, and quantized checkpoints of {', '.join(SUPPORTED_METHODS)}.", where)
    quant = config["quantization_config"]
    bits = quant.get("bits", quant.get("w_bit"))
    version = str(quant.get("version", "gemm")).lower()
    group = quant.get("group_size", quant.get("q_group_size"))
    if bits != 4 or version != "gemm" or not isinstance(group, int) or isinstance(group, bool) or group <= 0:
        raise UnsupportedArchitecture(
            f"the AWQ checkpoint has bits {bits!r}, version {version!r}, group_size {group!r}; scaffold reads "
            "4-bit GEMM-layout AWQ with a positive group size.", where)


def float_view(config: dict, tensors: dict, where: Path) -> dict:
    """The tensors with each quantized module presented as its `weight` ([out, in]); others unchanged."""
    packed = [name for name, info in tensors.items() if is_packed(name, info.dtype)]
    method = quantization_method(config)
    if method is None:
        if packed:
            raise CheckpointError(f"tensor {packed[0]!r} is a quantized tensor ({tensors[packed[0]].dtype}) but "
                                  "config.json has no quantization_config saying how to read it.", where)
        return tensors
    group = config["quantization_config"].get("group_size", config["quantization_config"].get("q_group_size"))
    out = {}
    for name, info in tensors.items():
        module, _, kind = name.rpartition(".")
        if kind in ("qzeros", "scales"):
            if f"{module}.qweight" not in tensors:
                raise CheckpointError(f"tensor {name!r} has no {module}.qweight beside it.", where)
            continue
        if kind == "g_idx":
            raise UnsupportedArchitecture(f"tensor {name!r}: AWQ checkpoints have no g_idx.", where)
        if kind != "qweight":
            out[name] = info
            continue
        scales, zeros = tensors.get(f"{module}.scales"), tensors.get(f"{module}.qzeros")
        if scales is None or zeros is None:
            raise CheckpointError(f"AWQ tensor {name!r} needs {module}.scales and {module}.qzeros beside it.", where)
        if len(info.shape) != 2 or info.shape[0] % group:
            raise CheckpointError(f"AWQ tensor {name!r} has shape {list(info.shape)}; it must be [in, out / "
                                  f"{AWQ_PACK}] with in a multiple of group_size {group}.", where)
        fan_in, fan_out = info.shape[0], info.shape[1] * AWQ_PACK
        want = {"scales": (fan_in // group, fan_out), "qzeros": (fan_in // group, fan_out // AWQ_PACK)}
        for part, shape in want.items():
            got = tensors[f"{module}.{part}"].shape
            if tuple(got) != shape:
                raise CheckpointError(f"AWQ tensor {module}.{part} has shape {list(got)}, but {name} "
                                      f"({list(info.shape)}) with group_size {group} needs {list(shape)}.", where)
        if f"{module}.weight" in tensors:
            raise CheckpointError(f"module {module!r} holds both a weight and AWQ tensors.", where)
        out[f"{module}.weight"] = replace(info, name=f"{module}.weight", dtype=scales.dtype, shape=(fan_out, fan_in))
    return out
