"""Quantized checkpoints: the float view of their tensors that detection and mapping read.

A quantized checkpoint stores each linear of the decoder as the tensors of its quantization
method (AWQ: `qweight`, `qzeros`, `scales`; FP8: an F8_E4M3 `weight` and its `weight_scale`;
...) instead of one float `weight`. The port is the same as for the float checkpoint: vLLM's
linear layers create the method's parameters from `quantization_config`, and the generated
load_weights sends every tensor of a module to the parameter of that module's role, whatever
its suffix. So the reader presents each quantized module as the `weight` it stands for
([out, in], the checkpoint's float dtype), and everything downstream (detection, the weight
table, the static checks) works on that view. KV-cache scales (`k_proj.k_scale`, ...) are left
out of the view: the port loads them through vLLM's maybe_remap_kv_scale_name.

Methods and layouts read here are the ones vLLM's CPU build 0.32 was seen serving with its
own Llama (tests/test_quantized.py), plus FP8 (served on GPUs; studies/gpu-h200-fp8.md):
AWQ 4-bit GEMM; GPTQ 4-bit without act-order (desc_act false); compressed-tensors W8A8 int8
(`int-quantized`) and W4A16 (`pack-quantized`); FP8 with per-tensor or block-wise scales.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from scaffold.errors import CheckpointError, UnsupportedArchitecture

SUPPORTED_METHODS = ("awq", "gptq", "compressed-tensors", "fp8")
# Non-float tensors a quantization method stores, by dtype: bytes per element (for the header's
# size check) and the tensor names that may hold that dtype.
PACKED_DTYPES = {"I32": 4, "I8": 1, "F8_E4M3": 1, "I64": 8}
PACKED_SUFFIXES = {
    "I32": (".qweight", ".qzeros", ".g_idx", ".weight_packed", ".weight_zero_point", ".weight_g_idx",
            ".weight_shape"),
    "I8": (".weight", ".weight_zero_point"),
    "F8_E4M3": (".weight",),
    "I64": (".weight_shape",),
}
FLOAT_DTYPES = ("F32", "F16", "BF16")
AWQ_PACK = 8  # 4-bit values per int32
# KV-cache scales that FP8 and compressed-tensors checkpoints keep beside k_proj / v_proj (or the
# attention module); the port maps them with vLLM's maybe_remap_kv_scale_name.
KV_CACHE_SCALES = (".k_scale", ".v_scale", ".q_scale", ".kv_scale", ".prob_scale")


@dataclass(frozen=True)
class Layout:
    """How one quantized linear is stored: the tensor that gives its shape, the tensors that must be
    beside it, those that may be, and how [out, in] follows from the main tensor's shape."""

    main: str
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    # [out, in] from the main tensor's 2-D shape: its dimension and the values packed per element
    out_dim: int = 0
    out_mult: int = 1
    in_dim: int = 1
    in_mult: int = 1

    def fan(self, shape: tuple[int, ...]) -> tuple[int, int]:
        return shape[self.out_dim] * self.out_mult, shape[self.in_dim] * self.in_mult


AWQ = Layout("qweight", ("qzeros", "scales"), out_dim=1, out_mult=AWQ_PACK, in_dim=0)
GPTQ = Layout("qweight", ("qzeros", "scales"), ("g_idx",), out_dim=1, in_dim=0, in_mult=AWQ_PACK)
INT8 = Layout("weight", ("weight_scale",), ("input_scale", "weight_zero_point", "input_zero_point"))
PACKED = Layout("weight_packed", ("weight_scale", "weight_shape"), ("weight_zero_point", "weight_g_idx"),
                in_mult=AWQ_PACK)
FP8 = Layout("weight", ("weight_scale",), ("input_scale",))
FP8_BLOCK = Layout("weight", ("weight_scale_inv",), ("input_scale",))


def is_packed(name: str, dtype: str) -> bool:
    """Whether a header entry may be a quantization method's non-float tensor (allowed besides float dtypes in
    checkpoints whose config.json has a quantization_config)."""
    return name.endswith(PACKED_SUFFIXES.get(dtype, ()))


def quantization_method(config: dict) -> str | None:
    quant = config.get("quantization_config")
    if not quant:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    return method if isinstance(method, str) else "unknown method"


def _refuse(field: str, value, wanted: str, where: Path) -> UnsupportedArchitecture:
    return UnsupportedArchitecture(
        f"the checkpoint is quantized, and quantization_config.{field} is {value!r}; scaffold ports {wanted}.", where)


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_supported(config: dict, where: Path) -> None:
    """Refuse a quantization_config whose method or layout a port is not generated for, naming the field."""
    method = quantization_method(config)
    if method is None:
        return
    if method not in SUPPORTED_METHODS:
        raise UnsupportedArchitecture(
            f"the checkpoint is quantized (quantization_config.quant_method {method!r}); scaffold ports F32, F16 "
            f"and BF16 weights, and quantized checkpoints of {', '.join(SUPPORTED_METHODS)}.", where)
    layout(config, where)


def layout(config: dict, where: Path) -> tuple[Layout, ...]:
    """The layouts a checkpoint's quantization_config allows for its linears (checked, or refused)."""
    quant = config["quantization_config"]
    method = quantization_method(config)
    if method == "awq":
        bits, group = quant.get("bits", quant.get("w_bit")), quant.get("group_size", quant.get("q_group_size"))
        version = str(quant.get("version", "gemm")).lower()
        if bits != 4:
            raise _refuse("bits", bits, "4-bit AWQ", where)
        if version != "gemm":
            raise _refuse("version", version, "GEMM-layout AWQ", where)
        if not _positive_int(group):
            raise _refuse("group_size", group, "AWQ with a positive group size", where)
        return (AWQ,)
    if method == "gptq":
        bits, group = quant.get("bits"), quant.get("group_size")
        if bits != 4:
            raise _refuse("bits", bits, "4-bit GPTQ", where)
        if quant.get("desc_act"):
            # vLLM 0.32 refuses it too: "GPTQ group activation ordering (desc_act=True) is no longer supported".
            raise _refuse("desc_act", quant["desc_act"], "GPTQ without activation ordering (desc_act false), "
                          "as vLLM serves it", where)
        if not _positive_int(group):
            raise _refuse("group_size", group, "GPTQ with a positive group size (-1, one group, is not read)", where)
        if str(quant.get("checkpoint_format", "gptq")) != "gptq":
            raise _refuse("checkpoint_format", quant["checkpoint_format"], "GPTQ's own format ('gptq')", where)
        return (GPTQ,)
    if method == "fp8":
        block = quant.get("weight_block_size")
        if block is not None and not (isinstance(block, list) and len(block) == 2
                                      and all(_positive_int(b) for b in block)):
            raise _refuse("weight_block_size", block, "FP8 with per-tensor scales or [rows, cols] blocks", where)
        return (FP8_BLOCK,) if block else (FP8,)
    return _compressed_tensors(quant, where)


def _compressed_tensors(quant: dict, where: Path) -> tuple[Layout, ...]:
    """compressed-tensors: int8 weights (`int-quantized`) or 4/8-bit values packed in int32 (`pack-quantized`)."""
    fmt = quant.get("format")
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise _refuse("config_groups", groups, "compressed-tensors checkpoints with at least one config group", where)
    for name, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            raise _refuse(f"config_groups.{name}.weights", weights, "groups that quantize weights", where)
        kind, bits = weights.get("type", "int"), weights.get("num_bits")
        if kind != "int":
            raise _refuse(f"config_groups.{name}.weights.type", kind, "integer compressed-tensors schemes", where)
        if fmt == "int-quantized" and bits != 8:
            raise _refuse(f"config_groups.{name}.weights.num_bits", bits, "int-quantized weights of 8 bits", where)
        if fmt == "pack-quantized" and bits != 4:
            raise _refuse(f"config_groups.{name}.weights.num_bits", bits, "pack-quantized weights of 4 bits", where)
    if fmt == "int-quantized":
        return (INT8,)
    if fmt == "pack-quantized":
        return (PACKED,)
    raise _refuse("format", fmt, "compressed-tensors formats 'int-quantized' (W8A8) and 'pack-quantized' (W4A16)",
                  where)


def _float_dtype(tensors: dict, parts: set[str]) -> str:
    """The checkpoint's float dtype: the most common among its float tensors that no method wrote."""
    counts = Counter(info.dtype for name, info in tensors.items() if info.dtype in FLOAT_DTYPES and name not in parts)
    return counts.most_common(1)[0][0] if counts else "BF16"


def float_view(config: dict, tensors: dict, where: Path) -> dict:
    """The tensors with each quantized module presented as its `weight` ([out, in]); others unchanged."""
    method = quantization_method(config)
    if method is None:  # the header reader let no quantized dtype through
        return tensors
    layouts = layout(config, where)
    modules = {}  # module -> its layout, for every module stored in a quantized layout
    for name, info in tensors.items():
        module, _, kind = name.rpartition(".")
        for lay in layouts:
            if kind == lay.main and (lay.main != "weight" or info.dtype in PACKED_DTYPES):
                modules[module] = lay
    parts = {f"{module}.{part}" for module, lay in modules.items()
             for part in (lay.main, *lay.required, *lay.optional)}
    dtype = _float_dtype(tensors, parts)
    out = {}
    for name, info in tensors.items():
        module, _, kind = name.rpartition(".")
        if name.endswith(KV_CACHE_SCALES):
            continue  # loaded by the port through maybe_remap_kv_scale_name, not a role of its own
        if module in modules and name in parts:
            if kind == modules[module].main:
                out[f"{module}.weight"] = _module_weight(module, info, modules[module], tensors, config, dtype, where)
            continue
        if info.dtype in PACKED_DTYPES:
            lay = layouts[0]
            raise CheckpointError(f"tensor {name!r} ({info.dtype}) is not one of the {method} tensors scaffold reads "
                                  f"for a module ({', '.join((lay.main, *lay.required, *lay.optional))}).", where)
        if kind in {part for lay in layouts for part in (*lay.required, *lay.optional)} :
            raise CheckpointError(f"tensor {name!r} has no {module}.{layouts[0].main} beside it.", where)
        out[name] = info
    return out


def _module_weight(module: str, info, lay: Layout, tensors: dict, config: dict, dtype: str, where: Path):
    """The float `weight` a quantized module stands for, after checking the tensors beside it."""
    method = quantization_method(config)
    name = f"{module}.{lay.main}"
    missing = [f"{module}.{part}" for part in lay.required if f"{module}.{part}" not in tensors]
    if missing:
        raise CheckpointError(f"{method} tensor {name!r} needs {', '.join(missing)} beside it.", where)
    if len(info.shape) != 2:
        raise CheckpointError(f"{method} tensor {name!r} has shape {list(info.shape)}; it must be 2-D.", where)
    if lay.main != "weight" and f"{module}.weight" in tensors:
        raise CheckpointError(f"module {module!r} holds both a weight and {method} tensors.", where)
    fan_out, fan_in = lay.fan(info.shape)
    _check_parts(module, lay, (fan_out, fan_in), tensors, config, where)
    return replace(info, name=f"{module}.weight", dtype=dtype, shape=(fan_out, fan_in))


def _check_parts(module: str, lay: Layout, fan: tuple[int, int], tensors: dict, config: dict, where: Path) -> None:
    """The shapes of the scales, zeros and group indices beside a quantized weight, where the method fixes them."""
    quant = config["quantization_config"]
    fan_out, fan_in = fan
    want: dict[str, list[tuple[int, ...]]] = {}
    if lay in (AWQ, GPTQ):
        group = quant.get("group_size", quant.get("q_group_size"))
        if fan_in % group:
            raise CheckpointError(f"{module}.qweight stands for {fan_in} inputs, not a multiple of "
                                  f"quantization_config.group_size {group}.", where)
        want = {"scales": [(fan_in // group, fan_out)], "qzeros": [(fan_in // group, fan_out // AWQ_PACK)]}
        if lay is GPTQ:
            want["g_idx"] = [(fan_in,)]
    elif lay is FP8:
        want = {"weight_scale": [(), (1,)]}
    elif lay is FP8_BLOCK:
        rows, cols = quant["weight_block_size"]
        want = {"weight_scale_inv": [(math.ceil(fan_out / rows), math.ceil(fan_in / cols))]}
    elif lay is PACKED:
        want = {"weight_shape": [(2,)]}
    for part, shapes in want.items():
        tensor = tensors.get(f"{module}.{part}")
        if tensor is not None and tuple(tensor.shape) not in shapes:
            raise CheckpointError(
                f"{quantization_method(config)} tensor {module}.{part} has shape {list(tensor.shape)}, but "
                f"{module}.{lay.main} ({fan_out} outputs, {fan_in} inputs) needs "
                f"{' or '.join(str(list(s)) for s in shapes)}.", where)
