"""Render a Spec into a plugin package: Jinja2, safe literals, ruff, atomic write.

Everything taken from a checkpoint reaches generated code either as a validated
identifier (spec.validate_identifiers) or through the `py` / `toml` filters,
which only emit literals of plain data. The package is rendered into a
temporary folder beside the destination, formatted, parsed, linted, and only
then moved into place, so an error never leaves a half-written port behind.
"""

from __future__ import annotations

import ast
import builtins
import fnmatch
import json
import keyword
import math
import os
import re
import shutil
import signal
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from scaffold import __version__
from scaffold.checkpoint import Checkpoint
from scaffold.conventions import config_derived, convention_defaults
from scaffold.detect.activations import gated_forms
from scaffold.detect.codekeys import attribute_map
from scaffold.errors import CheckpointError, OutputError, ScaffoldError, SpecError
from scaffold.mapping import split_modules, stacked_modules
from scaffold.model_context import model_context, rotated_dims
from scaffold.proc import python_command, run_tool
from scaffold.quantized import quantization_method
from scaffold.spec import (
    FIELDS,
    IDENTIFIER,
    Spec,
    field_problem,
    init_problem,
    port_names,
    renamed_prefixes,
    renamed_substrings,
    renamed_suffixes,
    validate_identifiers,
)
from scaffold.text import markdown_text
from scaffold.tomlio import spec_toml
from scaffold.tomlio import string as toml_string

# The one import up the layers, listed by name in pyproject.toml's import contract: the generator refuses a port
# that `scaffold verify` would fail on coverage, with verify's own check (check_coverage). Neither module imports
# render or anything above it, so this makes no cycle.
from scaffold.verify.report import Report
from scaffold.verify.static import check_mapping

PACKAGE_PLACEHOLDER = "__package__"

# config.json keys that are not architecture settings, or that PretrainedConfig handles itself.
CONFIG_KEYS_NOT_REDECLARED = {
    "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
    "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "is_encoder_decoder", "output_hidden_states", "output_attentions", "return_dict",
    "chunk_size_feed_forward", "problem_type", "id2label", "label2id", "num_labels", "torchscript",
    "tokenizer_class", "prefix", "task_specific_params", "add_cross_attention", "tie_encoder_decoder",
    "finetuning_task", "is_decoder", "cross_attention_hidden_size", "quantization_config",
}


def templates_dir() -> Path:
    """The templates/ folder: beside the package in a checkout, inside it when installed."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "templates", here / "templates"):
        if (candidate / "package").is_dir():
            return candidate
    raise ScaffoldError(f"the templates folder is missing from the installation ({here.parent / 'templates'}).")


# ------------------------------------------------------------------ filters
# Deepest nesting a literal may have; Python's parser refuses about 200 levels.
MAX_LITERAL_DEPTH = 32
# Names a generated config class's __init__ uses itself; a config key cannot be one.
RESERVED_ARGUMENTS = {"self", "kwargs", "super"}


def py_literal(value: Any, _depth: int = 0) -> str:
    """A Python literal for plain data; anything else is refused, never stringified.

    Strings go through repr(), so quotes, newlines and control characters stay inside
    the literal. Non-finite floats are written without any name, since a config key may
    shadow a builtin inside the generated __init__ (a parameter named `float` makes
    float("nan") a call of the key's value): 1e999 is infinity, 1e999 - 1e999 is NaN.
    """
    if _depth > MAX_LITERAL_DEPTH:
        raise ScaffoldError(f"refusing to render a value nested more than {MAX_LITERAL_DEPTH} levels deep.")
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        if math.isnan(value):
            return "(1e999 - 1e999)"
        if math.isinf(value):
            return "1e999" if value > 0 else "-1e999"
        return repr(float(value))
    if isinstance(value, str):
        return repr(str(value))
    if isinstance(value, (list, tuple)):
        inner = ", ".join(py_literal(v, _depth + 1) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, (set, frozenset)):
        items = sorted(value, key=repr)
        return "{" + ", ".join(py_literal(v, _depth + 1) for v in items) + "}" if value else "set()"
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise ScaffoldError(f"refusing to render a dict key of type {type(key).__name__} into generated code.")
        return "{" + ", ".join(f"{py_literal(k, _depth + 1)}: {py_literal(v, _depth + 1)}" for k, v in value.items()) + "}"
    raise ScaffoldError(f"refusing to render a value of type {type(value).__name__} into generated code.")


def config_defaults(config: dict, where: str | Path = "config.json") -> list[tuple[str, Any]]:
    """config.json keys to declare as arguments of a generated config class.

    A key that cannot be an argument name (not an identifier, a keyword, a name the
    __init__ itself uses) is not declared: transformers' PretrainedConfig still sets
    it from config.json through **kwargs, so nothing is lost and nothing of it
    reaches the generated code.
    """
    out = []
    for key, value in config.items():
        if key in CONFIG_KEYS_NOT_REDECLARED or key.startswith("_"):
            continue
        if not IDENTIFIER.match(key) or keyword.iskeyword(key) or key in RESERVED_ARGUMENTS:
            continue
        try:
            py_literal(value)  # refuse what cannot be a literal
        except ScaffoldError as exc:
            raise ScaffoldError(f"config key {key!r}: {exc.problem}", where) from None
        out.append((key, value))
    return out


# Expressions a detector may write for a value the port reads from its config at
# run time (Source.expr): arithmetic over attributes of `config` and a few builtins.
_EXPR_CALLS = {"getattr", "int", "float", "min", "max", "len", "bool", "round"}
_EXPR_NODES = (ast.Expression, ast.Name, ast.Attribute, ast.Constant, ast.BinOp, ast.UnaryOp, ast.BoolOp,
               ast.Compare, ast.IfExp, ast.Call, ast.Subscript, ast.Load, ast.operator, ast.unaryop, ast.boolop,
               ast.cmpop, ast.Tuple, ast.List)


def _plain_read(node: ast.AST) -> bool:
    if not isinstance(node, _EXPR_NODES):
        return False
    if isinstance(node, ast.Name):
        return node.id == "config" or node.id in _EXPR_CALLS
    if isinstance(node, ast.Attribute):
        return not node.attr.startswith("_") and bool(IDENTIFIER.match(node.attr))
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id in _EXPR_CALLS
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return not node.value.startswith("_")
    return True


def checked_expr(expr: str, field_name: str) -> str:
    """`expr` if it only reads the config; a generator bug otherwise (it would become code)."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        tree = None
    if tree is None or "\n" in expr or len(expr) > 500 or not all(_plain_read(n) for n in ast.walk(tree)):
        raise ScaffoldError(f"spec field {field_name!r} has the run-time expression {expr!r}, which is not a plain "
                            "read of the config; refusing to put it into generated code (please report this).")
    return expr


def check_spec(spec: Spec, where: str | Path | None = None) -> None:
    """Every spec field is plain data of its declared type before any of it becomes code."""
    for name in FIELDS:
        problem = field_problem(name, getattr(spec, name))  # the check a spec file's values get
        if problem:
            raise ScaffoldError(f"spec {problem}; refusing to render it.", where)
    validate_identifiers(spec, str(where or "spec"))
    # Differential attention's offset and vectors become code: the same checks a spec file's values get.
    problem = init_problem(spec.diff_lambda_init) if spec.diff_lambdas else None
    bad = [n for n in spec.diff_lambdas if not IDENTIFIER.fullmatch(n) or keyword.iskeyword(n)]
    if problem or bad:
        raise ScaffoldError(f"spec diff_lambda_init / diff_lambdas: {problem or bad}; refusing to render it.", where)


@jinja2.pass_context
def _finalize(context: jinja2.runtime.Context, value: Any) -> Any:
    """Every value a Markdown template prints is made inert Markdown (idempotent on `| md` output)."""
    return markdown_text(value) if context.name and context.name.endswith(".md.j2") else value


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates kept between runs (jinja2 keys them by the template's source, and keeps them in a
    folder of the user's own that it checks): parsing and compiling the templates is half a `scaffold new`."""
    try:
        return jinja2.FileSystemBytecodeCache()
    except (OSError, RuntimeError):  # no private temporary folder to be had: compile every run
        return None


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        finalize=_finalize,
        bytecode_cache=_bytecode_cache(),
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        # Control tags sit on lines of their own, indented with the code they control: such a line
        # leaves nothing in the output, so a template reads as the Python it generates.
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["py"] = py_literal
    env.filters["toml"] = toml_string
    env.filters["md"] = markdown_text
    return env


@dataclass
class Rendered:
    files: dict[str, str]  # relative path -> text
    # Folders the output must never replace or contain (the checkpoint it came from).
    protect: list[Path] = field(default_factory=list)


def display_name(name: str) -> str:
    """A folder name for README.md: characters outside a plain file name become _, so it is inert markdown."""
    return re.sub(r"[^A-Za-z0-9_.@%+=:,-]", "_", name) or "checkpoint"


def check_coverage(spec: Spec, ckpt: Checkpoint, table=None) -> None:
    """Refuse a port that some checkpoint tensor would not fill (a layer lacking a bias, say).

    The same check `scaffold verify` runs; a port that failed it would serve
    uninitialized parameters.
    """
    report = Report("", str(ckpt.path))
    check_mapping(report, spec, ckpt, table)
    failure = report.first_failure
    if failure is not None:
        raise CheckpointError(f"the tensors do not fill the port's parameters exactly once: {failure.detail}.",
                              ckpt.path)


# The config keys vLLM reads a model's query or KV head count from (its ModelArchConfigConvertorBase).
VLLM_HEAD_COUNT_KEYS = ("num_attention_heads", "n_head_kv", "num_kv_heads", "num_key_value_heads",
                        "multi_query_group_num", "num_attention_groups")


def render(spec: Spec, ckpt: Checkpoint, *, trust_remote_code: bool = False, review: str = "",
           table=None) -> Rendered:
    """The package's files. `table`: the weight table of spec and ckpt, when the caller already made it."""
    env = environment()
    check_spec(spec, ckpt.config_file)
    check_coverage(spec, ckpt, table)

    def cfg(field: str) -> str:
        source = spec.source(field)
        if source.expr and source.kind != "override":
            return checked_expr(source.expr, field)
        return py_literal(getattr(spec, field))

    # A gated MLP uses vLLM's fused act-and-mul kernel where the registry has one for the activation,
    # else act(gate) * up with get_act_fn (unknown without vLLM installed: the fused form).
    # An activation with tensors of its own is built per layer from its class (model_context.activation_call).
    act_and_mul = not spec.act_tensors and (gated_forms(spec.hidden_act) or ("and_mul",))[0] == "and_mul"
    overridden = {name for name in FIELDS if spec.source(name).kind == "override"}
    context = {
        "spec": spec,
        "cfg": cfg,
        "version": __version__,
        "stacked": stacked_modules(spec),
        "split_modules": split_modules(spec),
        "checkpoint_path": str(ckpt.path),
        "checkpoint_name": display_name(ckpt.path.name),
        "config_derived": config_derived(spec, ckpt.config) if spec.register_config else [],
        # The code's arithmetic helpers the port's expressions call (OpenELM's make_divisible), as ruff prefers them.
        "code_helpers": carried_helpers(spec),
        "config_defaults": (config_defaults(ckpt.config, ckpt.config_file) + convention_defaults(spec, ckpt.config)
                            if spec.register_config else []),
        "trust_remote_code": trust_remote_code,
        # config.json holds a head count vLLM reads as one number as one per layer (OpenELM's num_kv_heads): the
        # plugin tells vLLM the largest (__init__.py's _register_layer_heads).
        "layer_head_lists": bool(spec.layer_num_heads or spec.layer_num_kv_heads) and any(
            isinstance(ckpt.config.get(k), list) for k in VLLM_HEAD_COUNT_KEYS),
        # The checkpoint's config class's attribute_map (standard name -> stored key), kept by the port's own.
        "attribute_map": ({k: v for k, v in attribute_map(ckpt).items() if IDENTIFIER.match(k) and IDENTIFIER.match(v)}
                          if spec.register_config else {}),
        "act_and_mul": act_and_mul,
        "quantization": quantization_method(ckpt.config),
        # Fields a spec file overrode: written as literals, never read from the config.
        "overridden": overridden,
        # The port's attribute for each module role, and the checkpoint prefixes it renames on load.
        "port_names": port_names(spec.names),
        "renamed_prefixes": renamed_prefixes(spec),
        "renamed_suffixes": renamed_suffixes(spec),
        "renamed_substrings": renamed_substrings(spec),
        # The port maps checkpoint names (hf_to_vllm_mapper) where any of these renames something.
        "weights_mapper": bool(renamed_prefixes(spec) or renamed_suffixes(spec) or renamed_substrings(spec)),
        # The rotary parameters as vLLM's get_rope takes them, partial rotary included.
        "rope_parameters_literal": {**spec.rope_parameters, **({"partial_rotary_factor": spec.partial_rotary_factor}
                                                               if spec.partial_rotary_factor != 1.0
                                                               and not rotated_dims(spec) else {})},
        # The model template's flags, imports and norm(size) (scaffold.model_context).
        **model_context(spec, overridden, cfg, act_and_mul),
    }
    skip = () if spec.register_config else ("configuration.py.j2",)
    files = render_tree(context, spec.package, env=env, skip=skip)
    _helpers_stand_alone(spec, files.get(f"{spec.package}/model.py", ""))
    files["scaffold_spec.toml"] = spec_toml(spec, port={"checkpoint": str(ckpt.path), "scaffold_version": __version__,
                                                       "trust_remote_code": trust_remote_code})
    if review:
        files["REVIEW.md"] = review
    return Rendered(files, protect=[ckpt.path])


def render_tree(context: dict, package: str, *, template_root: str = "package",
                env: jinja2.Environment | None = None, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Render every template under templates/<template_root>/ (relative path -> text).

    `__package__` in a template's path becomes `package`; templates whose path ends with
    one of `skip` are left out, and so are partials (see is_partial), which other templates include. `package` is the native port tree; `backend` is the package
    that serves a checkpoint through vLLM's transformers backend (scaffold.backend).
    """
    env = env or environment()
    files: dict[str, str] = {}
    root = templates_dir() / template_root
    for template in sorted(root.rglob("*.j2")):
        rel = template.relative_to(root).as_posix()
        if any(rel.endswith(s) for s in skip) or is_partial(template.relative_to(root)):
            continue
        out_rel = rel[: -len(".j2")].replace(PACKAGE_PLACEHOLDER, package)
        files[out_rel] = env.get_template(f"{template_root}/{rel}").render(**context)
    return files


def is_partial(rel: Path) -> bool:
    """A template inside a folder named `_...` (such as __package__/_parts/) is a piece another template
    includes, never a file of the package."""
    return any(part.startswith("_") and part != PACKAGE_PLACEHOLDER for part in rel.parent.parts)


# --------------------------------------------------------- format and check
def _ruff() -> list[str]:
    """The ruff executable itself (`python -m ruff` starts an interpreter only to find and run it)."""
    try:
        from ruff.__main__ import find_ruff_bin  # optional: ruff may be installed as a bare executable only

        return [os.fsdecode(find_ruff_bin())]
    except (ImportError, FileNotFoundError):
        return python_command("ruff")


def carried_helpers(spec: Spec) -> list[str]:
    """The code's arithmetic helpers (spec code_helpers) as the port carries them: with ruff's own fixes of what its
    rules prefer (`if a < b: a = b` as `a = max(a, b)`), so that the port lints clean whatever the lab wrote; a helper
    ruff still objects to is refused naming the finding."""
    if not spec.code_helpers:
        return []
    with tempfile.TemporaryDirectory(prefix="scaffold-helpers-") as tmp:
        path = Path(tmp) / "helpers.py"
        path.write_text("\n\n\n".join(spec.code_helpers) + "\n", encoding="utf-8")
        ruff = _ruff()
        run_tool([*ruff, "check", "--quiet", "--no-cache", "--isolated", "--fix", str(path)], check=False,
                 capture_output=True, text=True)
        lint = run_tool([*ruff, "check", "--quiet", "--no-cache", "--isolated", "--output-format", "concise",
                         str(path)], check=False, capture_output=True, text=True)
        if lint.returncode != 0:
            finding = (lint.stdout.strip().splitlines() or ["?"])[0].replace(str(path), "helper")
            raise SpecError(f"spec field code_helpers: a helper the port would carry fails ruff ({finding}).",
                            str(spec.source("code_helpers").detail or "spec"))
        tree = ast.parse(path.read_text(encoding="utf-8"))
    return [ast.unparse(node) for node in tree.body]


def _helpers_stand_alone(spec: Spec, model: str) -> None:
    """Refuse a carried helper (spec code_helpers) whose name the model file also binds anywhere (an import, a class
    or function, a parameter or a local: `layer_idx`, `config`, where the port calls it) or a Python builtin: it
    would shadow that name, or be shadowed."""
    if not spec.code_helpers:
        return
    names = []
    for node in ast.walk(ast.parse(model)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [(a.asname or a.name).split(".")[0] for a in node.names]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.arg):
            names.append(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.append(node.id)
    for text in spec.code_helpers:
        name = ast.parse(text).body[0].name
        if names.count(name) != 1 or name in dir(builtins):
            raise SpecError(f"spec field code_helpers defines {name!r}, a name the port's model file already uses "
                            "(an import, a class, a parameter or local, or a builtin).",
                            str(spec.source("code_helpers").detail or "spec"))


def format_and_check(folder: Path) -> None:
    """ruff-format the generated Python, then require that it parses and lints clean."""
    py_files = sorted(str(p) for p in folder.rglob("*.py"))
    if not py_files:
        return
    for path in py_files:  # before ruff, whose --quiet hides why it cannot format a file
        try:
            ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # a generator bug, never the user's
            rel = Path(path).relative_to(folder)
            raise ScaffoldError(f"generated file {rel} does not parse ({exc}); please report this.") from None
    ruff = _ruff()
    run_tool([*ruff, "check", "--quiet", "--no-cache", "--isolated", "--select", "I", "--fix", *py_files],
             check=False, capture_output=True, text=True)
    fmt = run_tool([*ruff, "format", "--no-cache", "--isolated", *py_files], check=False, capture_output=True, text=True)
    if fmt.returncode != 0:
        raise ScaffoldError(f"ruff could not format the generated code: {fmt.stderr.strip() or fmt.stdout.strip()}")
    lint = run_tool(
        [*ruff, "check", "--quiet", "--no-cache", "--isolated", *py_files],
        check=False, capture_output=True, text=True,
    )
    if lint.returncode != 0:
        raise ScaffoldError(f"generated code fails ruff check; please report this:\n{lint.stdout.strip()}")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _contains(folder: Path, other: Path) -> bool:
    return other == folder or folder in other.parents


# The file that marks a folder as a package scaffold wrote, listing what it wrote. --force
# replaces such a folder (or an empty one) and nothing else.
MANIFEST = ".scaffold-manifest.json"
# What installing or testing a port adds beside the generated files; --force may remove it.
BUILD_LEFTOVERS = ("build", "dist", "__pycache__", ".pytest_cache", ".ruff_cache", "*.egg-info")


def manifest(files: dict[str, str]) -> str:
    return json.dumps({"generator": "vllm-scaffold", "version": __version__, "files": sorted(files)}, indent=1) + "\n"


def _foreign_entries(folder: Path) -> list[str] | None:
    """What in `folder` scaffold did not write (None: the folder is no port of scaffold's at all)."""
    entries = list(folder.iterdir())
    if not entries:
        return []
    try:
        listed = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
        written = {Path(rel).parts for rel in listed if isinstance(rel, str)}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    prefixes = {parts[:i] for parts in written for i in range(1, len(parts))}
    foreign = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if rel.name == MANIFEST and len(rel.parts) == 1:
            continue
        if any(fnmatch.fnmatch(part, pattern) for part in rel.parts for pattern in BUILD_LEFTOVERS):
            continue
        if rel.parts in written and (path.is_file() and not path.is_symlink()):
            continue
        if rel.parts in prefixes and path.is_dir() and not path.is_symlink():
            continue
        foreign.append(rel.as_posix())
    return foreign


def _check_replaceable(out: Path) -> None:
    """--force replaces a port scaffold wrote, or an empty folder; nothing else (a home folder, a project)."""
    foreign = _foreign_entries(out)
    if foreign is None:
        raise OutputError(f"--force replaces only an empty folder or a port scaffold wrote (marked by its {MANIFEST}); "
                          "this folder is neither. Choose another output folder, or empty this one yourself.", out)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise OutputError(f"--force would delete files scaffold did not write: {shown}. Move them out of the port, or "
                          "choose another output folder.", out)


@contextmanager
def _terminations_raise():
    """SIGTERM and SIGHUP end the write through the cleanup that an error takes (exit 128 + signal)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def write_package(rendered: Rendered, out: Path, *, force: bool) -> Path:
    """Write atomically: build beside `out`, check, then swap into place.

    An existing `out` is replaced only with --force, only when it is empty or a port scaffold
    wrote (nothing in it that scaffold did not write, build leftovers aside), and only once the
    new package is complete, formatted and lint-clean. If anything fails, or the process is
    told to terminate, `out` keeps its old content, and no staging folder and no parent folder
    made for it is left. A folder that holds the checkpoint or the current directory is never
    replaced.
    """
    out = Path(out).absolute()
    exists = out.exists() or out.is_symlink()
    if exists and not force:
        raise OutputError("the output folder already exists; pass --force to replace it.", out)
    if exists and (out.is_symlink() or not out.is_dir()):
        raise OutputError("the output path exists and is not a folder (or is a symlink); refusing to replace it.", out)
    real = out.resolve()
    for protected in rendered.protect:
        if _contains(real, Path(protected).resolve()):
            raise OutputError(f"the output folder would replace or contain the checkpoint ({protected}); "
                              "choose another output folder.", out)
    if exists and (_contains(real, Path.cwd().resolve()) or real == Path.home().resolve()):
        raise OutputError("refusing to replace a folder that holds the current directory or is the home folder.",
                          out)
    if exists:
        _check_replaceable(out)
    for rel in rendered.files:
        if Path(rel).is_absolute() or ".." in Path(rel).parts or rel == MANIFEST:
            raise ScaffoldError(f"generated file name {rel!r} leaves the package; please report this.")
    files = {**rendered.files, MANIFEST: manifest(rendered.files)}
    with _terminations_raise():
        return _swap_in(files, out, exists)


def _swap_in(files: dict[str, str], out: Path, exists: bool) -> Path:
    parent = out.parent
    made = [p for p in (parent, *parent.parents) if not p.exists()]  # parent folders this write creates
    staging = old = None
    try:
        try:
            parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=parent))
            os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes it private; the port is an ordinary folder
        except OSError as exc:
            raise OutputError(f"cannot create the output folder ({exc.strerror}).", out) from None
        for rel, text in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        format_and_check(staging)
        if exists:
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
            os.rename(out, old / "previous")
            try:
                os.rename(staging, out)
            except BaseException:
                os.rename(old / "previous", out)  # put the old content back
                raise
        else:
            os.rename(staging, out)
        made = []
    except UnicodeEncodeError as exc:
        raise ScaffoldError(f"generated text cannot be written as UTF-8 ({exc.reason}); please report this.",
                            out) from None
    except OSError as exc:
        raise OutputError(f"cannot write the output folder ({exc.strerror or exc}).", out) from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)  # gone already when the swap succeeded
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        for folder in made:  # innermost first; only folders still empty
            try:
                folder.rmdir()
            except OSError:
                break
    return out
