"""Composing a configuration: the schema's defaults, YAML files, then ``key=value`` overrides
(``compose``, the one layering every entry point, sweep task and on-demand training uses),
checking what the schema's types cannot, and wording what fails.

Every key's valid values are declared once, on its field in the schema (``cbr2.config.schema``):

* a closed vocabulary (``prompt.format``, ``retrieval.cases``, ``llm.dtype`` ...) is the
  ``Literal`` type of its field: OmegaConf rejects any other value as it merges, and
  ``choice_problem`` words it;
* a number's range is its field's ``bounded(default, low, high)`` (``cbr2.config.fields``);
* a name of a registry the code extends (``data.name``, ``llm.backend``) is checked here against
  that registry (``REGISTERED``), imported when checked; ``data.split``, ``data.kb`` and
  ``data.cases`` depend on ``data.name``.

Every bad value of a configuration is named at once, before any data, model or W&B run is loaded.
"""

from __future__ import annotations

import importlib
import re
import typing
from collections.abc import Iterable
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from cbr2.common.console import did_you_mean
from cbr2.common.errors import ConfigError
from cbr2.config.ablations import ablation as table5_setting
from cbr2.config.fields import ranges
from cbr2.config.files import CONFIG_DIR, leaves, read_yaml
from cbr2.config.schema import Config, TrainConfig

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


# ---------------------------------------------------------------------------------- checks

def problems(cfg: DictConfig) -> list[str]:
    """What the schema's types cannot reject, one line each (empty when the configuration is fine):
    registry names, ``data.split``, ``data.kb`` / ``data.cases``, the fields' ranges.

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
    found += _custom_data_problems(name, value("data.root"), value("data.kb"), value("data.cases"), missing)
    schema = OmegaConf.get_type(cfg)
    for key, allowed in (ranges(schema) if is_dataclass(schema) else {}).items():
        v = value(key)
        if v is not missing and v is not None and not allowed.accepts(v):
            found.append(f"{key}={v!r}: must be {allowed}")
    return found


CUSTOM_DATA_NEEDS = "data.kb=FILE (a triples file or KoPL JSON) and data.cases=FILE (solved cases, YAML)"
"""What ``data.name=custom`` needs, as every message about it says (``cbr2.data.benchmarks`` too)."""


def _custom_data_problems(name: Any, root: Any, kb: Any, cases: Any, missing: object) -> list[str]:
    """``data.kb`` and ``data.cases``: both given with ``data.name=custom`` (and no ``data.root``),
    neither with another benchmark, whose files are its folder's."""
    if kb is missing:  # a schema without them
        return []
    given = [key for key, v in (("data.kb", kb), ("data.cases", cases)) if v not in (missing, None, "")]
    if name == "custom":
        found = []
        if len(given) < 2:
            found.append(f"data.name=custom needs {CUSTOM_DATA_NEEDS}")
        if root not in (missing, None):
            found.append(f"data.root={root!r}: data.name=custom does not read it (its files are data.kb and data.cases)")
        return found
    if given:
        return [(f"{' and '.join(given)}: read with data.name=custom only (a KB and cases of your own), not "
                 f"with data.name={name}; unset {'them' if len(given) > 1 else 'it'} or set data.name=custom")]
    return []


# ------------------------------------------------------------------------------------ merging

def merge_layers(cfg: DictConfig, files: typing.Iterable[str | Path], overrides: typing.Iterable[str]) -> DictConfig:
    """``cfg`` (the schema's defaults) with each file, then each ``key=value`` override, merged on top.

    Raises:
        ConfigError: On the first unknown key or value of the wrong type (naming the file or the
            override); else on every value outside its ``Literal`` set and every one of
            ``problems``, all at once.
    """
    bad_choices = []  # named with the other problems, so every bad value is named at once

    def merge(layer: DictConfig, where: str) -> DictConfig:
        try:
            return OmegaConf.merge(cfg, layer)
        except OmegaConfBaseException as err:
            choice = choice_problem(err)
            if choice is None:
                raise ConfigError(f"{where}: {describe(err, cfg)}") from err
            bad_choices.append(choice)  # this layer is left out; the defaults stay valid
            return cfg

    layers = [(read_yaml(path), str(path)) for path in files]
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. data.name=mini-metaqa)")
        layers.append((OmegaConf.from_dotlist([item]), f"override {item!r}"))
    try:
        # One merge of every layer: each merge copies the whole configuration, and a run's
        # command line has a dozen layers. Only when it fails are they merged one by one, to
        # name the layer at fault (the result of a clean merge is the same either way).
        cfg = OmegaConf.merge(cfg, *(layer for layer, _ in layers)) if layers else cfg
    except OmegaConfBaseException:
        for layer, where in layers:
            cfg = merge(layer, where)
    found = bad_choices + problems(cfg)
    if found:
        raise ConfigError("; ".join(found))
    return cfg


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


# ------------------------------------------------------------------------------------ layering

def load_config(overrides: list[str] | None = None, files: list[str | Path] = (), schema: type = Config) -> DictConfig:
    """Build the configuration.

    Args:
        overrides: OmegaConf dotlist (``["data.name=mini-metaqa", "eval.limit=10"]``).
        files: YAML files merged in order on top of the defaults.
        schema: The dataclass describing valid keys.

    Raises:
        ConfigError: Naming the unknown key (with the list of valid ones), the file (and line,
            for a file that is not a YAML mapping), or the value that does not fit its type or
            its allowed values (its ``Literal`` type, ``problems``), every bad value at once.
    """
    return merge_layers(OmegaConf.structured(schema), files, overrides or [])


def compose(schema: type = Config, *, ablation: str | None = None, files: Iterable[str | Path] = (),
            overrides: Iterable[str] = ()) -> DictConfig:
    """The configuration of a run, layered the one way every entry point, sweep task and on-demand
    training does: the schema's defaults, its entry point's file (``configs/evaluate.yaml`` or
    ``configs/train.yaml``) and ``files`` make the base; the ablation puts the base in its Table 5
    setting (``Ablation.apply``: whatever the files hold, their other values stand); then the
    ``key=value`` overrides, which must leave the run in that setting.

    Raises:
        ConfigError: As ``load_config``; for an unknown ablation; or naming the override (or
            file) that takes the run out of the setting ``ablation`` names, with the setting.
    """
    files = [CONFIG_DIR / ("train.yaml" if schema is TrainConfig else "evaluate.yaml"), *files]
    overrides = list(overrides)
    if not ablation:
        return load_config(overrides, files=files, schema=schema)
    setting = table5_setting(ablation)
    cfg = merge_layers(setting.apply(load_config([], files=files, schema=schema)), [], overrides)
    departures = setting.departures(cfg)
    if departures:
        raise ConfigError("; ".join(f"{_origin(key, files, overrides)} contradicts --ablation {setting.name}: that "
                                    f"setting needs {key} {need}, not {value}" for key, value, need in departures))
    return cfg


def _origin(key: str, files: list[str | Path], overrides: list[str]) -> str:
    """The last layer that sets ``key``: ``override 'k=v'`` or the file's path (else ``the defaults``)."""
    for item in reversed(overrides):
        if item.partition("=")[0].strip() == key:
            return f"override {item!r}"
    for path in reversed(files):
        if key in leaves(OmegaConf.to_container(read_yaml(path))):
            return str(path)
    return "the defaults"
