"""How ``cbr2.config`` reads and merges configuration layers, checks what the schema's types
cannot, and words what fails.

Private: import from ``cbr2.config`` (the public module re-exports ``ConfigError`` and
``validate``; ``load_config`` calls ``merge_layers``). Every key's valid values are declared
once, on its field in the schema (``cbr2.config_schema``):

* a closed vocabulary (``prompt.format``, ``retrieval.cases``, ``llm.dtype`` ...) is the
  ``Literal`` type of its field: OmegaConf rejects any other value as it merges, and
  ``choice_problem`` words it;
* a number's range is its field's ``bounded(default, low, high)``, read by ``ranges``;
* a name of a registry the code extends (``data.name``, ``llm.backend``) is checked here against
  that registry (``REGISTERED``), imported when checked; ``data.split`` depends on ``data.name``.
"""

from __future__ import annotations

import functools
import importlib
import re
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from cbr2.common.console import did_you_mean
from cbr2.common.errors import ConfigError

# ------------------------------------------------------------------------------------ choices

REGISTERED: dict[str, str] = {
    "data.name": "cbr2.data.benchmarks:BENCHMARKS",
    "llm.backend": "cbr2.llm:BACKENDS",
}
"""Keys whose value is a name of a registry of the code (``module:NAME``, imported when checked:
those modules import ``cbr2.config``'s neighbours)."""


def registered(key: str) -> Any:
    """The registry of a ``REGISTERED`` key: its names are the valid values."""
    module, name = REGISTERED[key].split(":")
    return getattr(importlib.import_module(module), name)


def literal_values(schema: Any, name: str) -> tuple[Any, ...] | None:
    """The values of a field whose type is a ``Literal`` (None for any other field)."""
    try:
        hint = typing.get_type_hints(schema).get(name)
    except (NameError, TypeError):
        return None
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else None


def unknown_choice(key: str, value: Any, allowed: typing.Iterable[Any]) -> str:
    """``unknown KEY 'VALUE' (did you mean ...?); expected one of ...``."""
    allowed = [str(a) for a in allowed]
    return f"unknown {key} {value!r}{did_you_mean(value, allowed)}; expected one of {', '.join(allowed)}"


def choice_problem(err: OmegaConfBaseException) -> str | None:
    """The message of a merge that failed on a value outside a ``Literal`` field's set, else None."""
    schema, name = getattr(err, "object_type", None), getattr(err, "key", None)
    allowed = literal_values(schema, name) if schema is not None and name is not None else None
    if allowed is None:
        return None
    return unknown_choice(getattr(err, "full_key", None) or name, getattr(err, "value", None), allowed)


# ----------------------------------------------------------------------------- ranges

@dataclass(frozen=True)
class Range:
    """Numbers a key accepts (null is for the schema's type to allow: it then means the default)."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    """The bound ``low`` itself is excluded."""
    open_high: bool = False
    why: str = ""
    """Added to the message (what the rejected values would do, or what null means)."""

    def accepts(self, value: float) -> bool:
        if self.low is not None and (value < self.low or (self.open_low and value == self.low)):
            return False
        return self.high is None or not (value > self.high or (self.open_high and value == self.high))

    def __str__(self) -> str:
        if self.high is None:
            text = f"{'greater than' if self.open_low else 'at least'} {self.low}"
        else:
            text = f"in {'(' if self.open_low else '['}{self.low}, {self.high}{')' if self.open_high else ']'}"
        return text + (f" ({self.why})" if self.why else "")


def bounded(default: Any, low: float | None = None, high: float | None = None, *, open_low: bool = False,
            open_high: bool = False, why: str = "") -> Any:
    """A schema field with its default and the numbers it accepts (``Range``; null, where the
    field's type allows it, is not checked: it means the documented fallback).

    Args:
        default: The field's default.
        low: The least value (None: no lower bound).
        high: The largest value (None: no upper bound).
        open_low: ``low`` itself is excluded.
        open_high: ``high`` itself is excluded.
        why: Added to the message of a rejected value.
    """
    return field(default=default, metadata={"range": Range(low, high, open_low, open_high, why)})


@functools.cache
def ranges(schema: type, prefix: str = "") -> dict[str, Range]:
    """Every key of ``schema`` declared with ``bounded``, and the numbers it accepts."""
    out: dict[str, Range] = {}
    hints = typing.get_type_hints(schema)
    for f in fields(schema):
        if is_dataclass(hints[f.name]):
            out.update(ranges(hints[f.name], f"{prefix}{f.name}."))
        elif "range" in f.metadata:
            out[f"{prefix}{f.name}"] = f.metadata["range"]
    return out


# ----------------------------------------------------------------------------------- validate

def problems(cfg: DictConfig) -> list[str]:
    """What ``validate`` rejects, one line each (empty when the configuration is fine).

    Raises:
        ConfigError: On a value that cannot be read at all (an interpolation that does not resolve).
    """
    missing = object()

    def value(key: str) -> Any:
        try:
            return OmegaConf.select(cfg, key, default=missing)
        except OmegaConfBaseException as err:  # e.g. an interpolation that does not resolve
            raise ConfigError(f"{key}: {err}") from None

    found = []
    for key in REGISTERED:
        v = value(key)
        if v is not missing and v not in registered(key):
            found.append(unknown_choice(key, v, registered(key)))
    name = value("data.name")
    split = value("data.split")
    benchmarks = registered("data.name")
    if split not in (missing, None) and name in benchmarks:
        family = benchmarks[name][0]  # BENCHMARKS: name -> (family, embedded folder)
        if split not in family.splits:
            found.append(f"data.split={split!r} is not a {family.name} split; expected one of "
                         f"{', '.join(family.splits)} (null: {family.eval_split})")
    schema = OmegaConf.get_type(cfg)
    for key, allowed in (ranges(schema) if is_dataclass(schema) else {}).items():
        v = value(key)
        if v is not missing and v is not None and not allowed.accepts(v):
            found.append(f"{key}={v!r}: must be {allowed}")
    return found


def validate(cfg: DictConfig) -> None:
    """Check the values that the schema's types cannot: registry names, ``data.split``, ranges.

    ``load_config`` calls this on every configuration it builds (``evaluate.py``, ``train.py``,
    the sweep), so a bad value fails before any data, model or W&B run is loaded, not after
    minutes of work. (A closed vocabulary is the ``Literal`` type of its field: the merge itself
    rejects another value, and ``load_config`` names it with these problems.)

    Raises:
        ConfigError: Naming each bad key, its value and what is allowed (one line).
    """
    found = problems(cfg)
    if found:
        raise ConfigError("; ".join(found))


# ------------------------------------------------------------------------------ files, merging

def merge_layers(cfg: DictConfig, files: typing.Iterable[str | Path], overrides: typing.Iterable[str]) -> DictConfig:
    """``cfg`` (the schema's defaults) with each file, then each ``key=value`` override, merged on top.

    Raises:
        ConfigError: On the first unknown key or value of the wrong type (naming the file or the
            override); else on every value outside its ``Literal`` set and every ``validate``
            problem, all at once.
    """
    bad_choices = []  # named with validate's problems, so every bad value is named at once

    def merge(layer: DictConfig, where: str) -> DictConfig:
        try:
            return OmegaConf.merge(cfg, layer)
        except OmegaConfBaseException as err:
            choice = choice_problem(err)
            if choice is None:
                raise ConfigError(f"{where}: {describe(err, cfg)}") from err
            bad_choices.append(choice)  # this layer is left out; the defaults stay valid
            return cfg

    for path in files:
        cfg = merge(read_yaml(path), str(path))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. data.name=mini-metaqa)")
        cfg = merge(OmegaConf.from_dotlist([item]), f"override {item!r}")
    found = bad_choices + problems(cfg)
    if found:
        raise ConfigError("; ".join(found))
    return cfg


def read_yaml(path: str | Path) -> DictConfig:
    """A config file as a mapping; a file that is not one is a one-line error naming it.

    Raises:
        ConfigError: Naming the file (and the line of a YAML syntax error) when it cannot be
            read, is not YAML, or holds something other than a mapping of config keys.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read this config file ({err})") from None
    try:
        # Parsed once here for the checks (PyYAML reports the line); OmegaConf parses it again
        # with its own loader, as before, for the values.
        data = yaml.safe_load(text)
        if data is None:  # empty, or only comments
            return OmegaConf.create({})
        if not isinstance(data, dict):
            raise ConfigError(f"{path}:1: holds a YAML {type(data).__name__}, not a mapping of config keys "
                              "(e.g. `eval:` and below it `  limit: 10`)")
        return OmegaConf.load(path)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = " ".join(str(x) for x in (getattr(err, "context", None), getattr(err, "problem", None)) if x)
        raise ConfigError(f"{where}: not valid YAML ({what or type(err).__name__})") from None


def leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b": value}`` of every leaf of a nested dict (not a dict: none)."""
    if not isinstance(tree, dict):
        return {}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _valid_keys(node: Any, prefix: str = "") -> list[str]:
    keys = []
    for k, v in node.items():
        keys += _valid_keys(v, f"{prefix}{k}.") if isinstance(v, DictConfig) else [f"{prefix}{k}"]
    return keys


def describe(err: OmegaConfBaseException, cfg: DictConfig) -> str:
    """OmegaConf's error in the project's words: the key, a close valid key, the expected type."""
    key = getattr(err, "full_key", None) or ""
    if isinstance(err, ConfigKeyError):
        valid = _valid_keys(cfg)
        hint = did_you_mean(key, valid, cutoff=0.7)
        if hint:
            return f"unknown key {key!r}{hint}"
        section = key.rpartition(".")[0]
        same = [k for k in valid if section and k.startswith(section + ".")]
        if same:
            return f"unknown key {key!r}; the keys of {section} are {', '.join(same)}"
        sections = sorted({k.split(".")[0] for k in valid})
        return f"unknown key {key!r}; keys start with one of {', '.join(sections)} (e.g. eval.limit)"
    choice = choice_problem(err)
    if choice:
        return choice
    message = str(getattr(err, "msg", None) or err).splitlines()[0]
    hint = getattr(err, "object_type", None)
    field_name = getattr(err, "key", None)
    expected = _expected_type(hint, field_name) if hint is not None and field_name is not None else None
    if expected:
        shown = re.search(r"Value '(.*?)'", message)
        return f"{key} takes {expected}" + (f", not {shown.group(1)!r}" if shown else "")
    if "is not a subclass of" in message:  # a section given a plain value (eval=3)
        return "that is a group of keys, not a value: set one of its keys (e.g. eval.limit=10)"
    return f"{key}: {message}".strip(": ")


_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _expected_type(schema: type, name: str) -> str | None:
    """``an integer``, ``null or a number`` ...: what a schema field takes, in words."""
    try:
        hint = typing.get_type_hints(schema).get(name)
    except (NameError, TypeError):
        return None
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if hint in _TYPE_WORDS:
        return _TYPE_WORDS[hint]
    if len(args) == 1 and args[0] in _TYPE_WORDS and type(None) in typing.get_args(hint):
        return f"null or {_TYPE_WORDS[args[0]]}"
    return None
