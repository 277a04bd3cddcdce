"""``docs/configuration.md``, generated from the schema (``cbr2.config.schema``): every key of
``evaluate.py`` and ``train.py`` with its type, default, accepted values and meaning.

The page is written from the dataclasses and their attribute docstrings, never by hand, so it
cannot drift from what the code reads; ``tests/test_config_defaults.py`` checks that the
committed page is the one this module writes. Regenerate with::

    python -m cbr2.config.reference > docs/configuration.md
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from typing import Any

from cbr2.config import schema as config_schema
from cbr2.config.schema import Config, TrainConfig

SCHEMAS = (("evaluate.py", Config), ("train.py", TrainConfig))
"""The entry points and the schema each reads."""


def _docstrings() -> dict[str, dict[str, str]]:
    """Class name → field → the docstring written under the field in the schema's source."""
    tree = ast.parse(inspect.getsource(config_schema))
    out: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs = out.setdefault(node.name, {})
        for stmt, after in zip(node.body, node.body[1:], strict=False):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return out


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def _code(value: Any) -> str:
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)
    return "`" + text.replace("|", "\\|") + "`"


def _type(hint: Any) -> str:
    text = str(hint).replace("typing.", "").replace("NoneType", "None")
    if typing.get_origin(hint) is typing.Literal:
        text = " \\| ".join(f"`{a}`" for a in typing.get_args(hint))
    elif isinstance(hint, type):
        text = hint.__name__
    return text.replace("|", "\\|") if "`" not in text else text


def _rows(schema: type, docs: dict[str, dict[str, str]], prefix: str = "") -> list[str]:
    rows = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            rows += _rows(hint, docs, f"{prefix}{f.name}.")
            continue
        accepts = str(f.metadata["range"]) if "range" in f.metadata else ""
        doc = " ".join(docs.get(schema.__name__, {}).get(f.name, "").split()).replace("|", "\\|")
        rows.append(f"| `{prefix}{f.name}` | {_type(hint)} | {_code(_default(f))} | {accepts} | {doc} |")
    return rows


def reference() -> str:
    """The Markdown of ``docs/configuration.md``."""
    docs = _docstrings()
    lines = ["# Configuration", "",
             "Generated from `cbr2/config/schema.py` by `python -m cbr2.config.reference` (do not edit by hand).",
             "Every key is an OmegaConf override (`key=value`); `configs/*.yaml` hold only what differs from",
             "these defaults, and an unknown key or a value outside its range fails before anything runs."]
    for entry, schema in SCHEMAS:
        lines += ["", f"## `{entry}`", "", (inspect.getdoc(schema) or "").split("\n")[0], "",
                  "| key | type | default | accepts | meaning |", "|---|---|---|---|---|", *_rows(schema, docs)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
