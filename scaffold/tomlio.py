"""TOML out: every TOML file the tool writes, through tomlkit (quoting and escaping are the library's).

scaffold_spec.toml of a native port (spec_toml) and of a backend package (document), the spec template of
`inspect --spec-template` (spec_template), and the TOML strings the templates write (`string`, their `toml`
filter). TOML in is tomllib's (scaffold.spec.load_overrides, scaffold.verify).

Checkpoint text reaches these files as TOML values, which tomlkit escapes, or inside comments, which `comment`
keeps on one line: a line break in a comment would end it, and what followed would be read as TOML.
"""

from __future__ import annotations

import re
from typing import Any

import tomlkit
from tomlkit.items import AoT, Comment, Item, Table

from scaffold.errors import SpecError
from scaffold.spec import CONFIG_KEY_FIELDS, FIELDS, Spec, Unknown, group_heading, omitted

SPEC_TABLE = "spec"


# ------------------------------------------------------------------ values
def value(v: Any) -> Item:
    """The TOML value holding `v` exactly: booleans, numbers, strings, and lists and tables of them. TOML has no
    null: a table entry set to None is left out (as a spec field set to None is), a list holding one refused."""
    if isinstance(v, bool | int | float):
        return tomlkit.item(v)  # nan, inf and -inf are TOML floats too
    if isinstance(v, str):
        if re.search("[\ud800-\udfff]", v):
            raise SpecError(f"the string {v!r} holds an unpaired surrogate and cannot be written as TOML.")
        return tomlkit.string(v)
    if isinstance(v, list | tuple):
        if any(x is None for x in v):
            raise SpecError(f"the list {v!r} holds null, which TOML cannot write.")
        items = tomlkit.array()
        items.extend(value(x) for x in v)
        return items
    if isinstance(v, dict):
        inline = tomlkit.inline_table()
        for k, x in v.items():
            if x is not None:
                inline.append(str(k), value(x))
        return inline
    raise SpecError(f"a value of type {type(v).__name__} cannot be written as TOML.")


def string(v: Any) -> str:
    """A TOML basic string holding `v` exactly, whatever characters it has (the templates' `toml` filter)."""
    return value(str(v)).as_string()


def text(v: Any) -> str:
    """`v` as a TOML value written out, for a commented-out line of the spec template."""
    return value(v).as_string()


def comment_text(v: Any) -> str:
    """One comment line's text: line breaks and control characters escaped, so nothing after # becomes TOML."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(v))


def comment(v: Any) -> Comment:
    return tomlkit.comment(comment_text(v))


def table(values: dict[str, Any], note: str | None = None) -> Table:
    """A table of `values`, after the comment line `note` when given; an entry set to None is left out."""
    out = tomlkit.table()
    if note is not None:
        out.add(comment(note))
    for k, v in values.items():
        if v is not None:
            out.add(str(k), value(v))
    return out


def array_of_tables(rows: list[dict[str, Any]]) -> AoT:
    """[[name]] tables, one per row."""
    return AoT([table(r) for r in rows])


def document(header: list[str], tables: dict[str, Table]) -> str:
    """A file: comment lines, then each table by name."""
    doc = tomlkit.document()
    for line in header:
        doc.add(comment(line))
    for name, body in tables.items():
        doc.add(name, body)
    return tomlkit.dumps(doc)


# ------------------------------------------------------- scaffold_spec.toml
SPEC_HEADER = [
    "The architecture spec this port was generated from.",
    "Regenerate with: scaffold new CHECKPOINT --spec scaffold_spec.toml --force",
    "A field left out (None) keeps its detected value.",
]


def spec_toml(spec: Spec, port: dict[str, Any] | None = None) -> str:
    """A port's scaffold_spec.toml: the spec, each value after a comment saying where it came from, and the
    [port] table (where the port came from) when given."""
    body = tomlkit.table()
    for name in FIELDS:
        v = getattr(spec, name)
        if omitted(name, v):
            continue
        body.add(comment(spec.source(name)))
        if v is None:
            body.add(comment(f"{name} = (none)"))
        else:
            body.add(name, value(v))
    # Sizes a spec file said which config key holds: regenerating must read the same keys at run time.
    named = {n: spec.source(n).expr[len("config."):] for n in CONFIG_KEY_FIELDS
             if " (named in " in spec.source(n).detail and spec.source(n).expr}
    if named:
        body.add("config_keys", table(named))
    tables = {SPEC_TABLE: body}
    if port is not None:
        tables["port"] = table(port, note="Where this port came from; scaffold verify reads it.")
    return document(SPEC_HEADER, tables)


# ------------------------------------------------------------ spec template
def spec_template(spec: Spec, checkpoint: str, config: dict[str, Any], tensors: list[str]) -> str:
    """A spec file with every field: the detected values, each after its source, and the fields detection could
    not determine marked UNKNOWN (commented out, holding a placeholder) with the candidates it considered.
    Uncommented and filled in, it is a complete --spec file; left as it is, the detected values are pinned."""
    body, previous = tomlkit.table(), None
    for name in FIELDS:
        if name == "names":
            continue  # its own table, below
        if heading := group_heading(name, previous):
            if previous is not None:
                body.add(tomlkit.nl())
            body.add(comment(f"--- {heading}"))
        previous = name
        v = getattr(spec, name)
        if name in spec.unknowns:
            _add_unknown(body, spec.unknowns[name])
            body.add(comment(f"{name} = {text(v) if v is not None else '...'}"))
        else:
            body.add(comment(spec.source(name)))
            if v is None:
                body.add(comment(f"{name} = (none)"))
            else:
                body.add(name, value(v))
    body.add("names", _names_table(spec, tensors))
    body.add("config_keys", _config_keys_table(spec, config))
    header = [f"Spec template for {checkpoint}, written by `scaffold inspect --spec-template`.",
              "Every field is here: detected values after a comment naming their source; a field marked UNKNOWN is",
              "commented out: replace its placeholder and remove the leading '# '. Then:",
              f"  scaffold new {checkpoint} --spec THIS_FILE",
              "A field set to (none) has no TOML value: leave it out to keep what detection finds."]
    return document(header, {SPEC_TABLE: body})


def _names_table(spec: Spec, tensors: list[str]) -> Table:
    out = tomlkit.table()
    for line in ("Module names by role: tensors are MODEL.LAYERS.N.<role names>; roles a model lacks",
                 "(q_norm, attn_post_norm, experts, ...) are left out.",
                 f"The checkpoint's tensors include: {', '.join(_sample_modules(tensors))}"):
        out.add(comment(line))
    if "names" in spec.provenance:  # layout detection named every role (or the spec file did)
        out.add(comment(spec.source("names")))
        for role, name in spec.names.items():
            out.add(role, value(name))
        return out
    seen = set()  # no role is known: Llama's names as placeholders
    for u in spec.unknowns.values():
        if (u.field == "names" or u.field.startswith("names.")) and u.reason not in seen:
            seen.add(u.reason)
            _add_unknown(out, u)
    for role, name in spec.names.items():
        out.add(comment(f"UNKNOWN {role} = {text(name)}"))
    return out


def _config_keys_table(spec: Spec, config: dict[str, Any]) -> Table:
    out = tomlkit.table()
    for line in ("The config.json key holding each size, so that the port reads config.<key> at run time and",
                 "serves every size of the model. A size given only as a value above is written into the port.",
                 f"config.json's numbers: {_config_numbers(config)}"):
        out.add(comment(line))
    for name in CONFIG_KEY_FIELDS:
        expr = spec.source(name).expr or ""
        if name in spec.unknowns:
            out.add(comment(f'UNKNOWN {name} = "..."'))
        elif re.fullmatch(r"config\.\w+", expr):
            out.add(name, value(expr[len("config."):]))
        else:
            out.add(comment(f"{name}: {spec.source(name)}"))
    return out


def _add_unknown(body: Table, u: Unknown) -> None:
    body.add(comment(f"UNKNOWN: {u.reason}"))
    if u.candidates:
        body.add(comment("  considered: " + "; ".join(f"{c} ({why})" for c, why in u.candidates)))


def _sample_modules(tensors: list[str], limit: int = 24) -> list[str]:
    """The checkpoint's module paths outside the layers and in its first layer, as a user fills in names from."""
    out = []
    for name in sorted(tensors):
        module = name.rsplit(".", 1)[0]
        if re.search(r"\.([1-9]\d*)\.", module) or module in out:
            continue
        out.append(module)
    return out[:limit] + (["..."] if len(out) > limit else [])


def _config_numbers(config: dict[str, Any], limit: int = 30) -> str:
    items = [f"{k} = {v!r}" for k, v in config.items() if isinstance(v, int | float) and not isinstance(v, bool)]
    return ", ".join(items[:limit]) + (", ..." if len(items) > limit else "")
