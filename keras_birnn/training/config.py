"""The trainer's settings: defaults, TOML files and `--set` overrides.

A config is a TOML file (read with the standard library's `tomllib`) of
the sections below; every setting has a default, so a config names only
what differs, and `--set section.key=value` overrides any of them:

    task = "tagger"
    [data]
    train = "train.conll"
    dev = "dev.conll"
    [train]
    epochs = 30

`resolve(path, overrides)` gives the complete settings, checked: an
unknown section or key, a value of the wrong type or outside its choices,
stop with a `ConfigError` whose message names the file and line (or the
`--set` item). `dump` writes settings back as TOML: a run folder keeps
the resolved config it trained with.

The defaults follow the BiLSTM-CRF literature; `SOURCES` says which
setting follows which paper:
- Lample et al. 2016, "Neural Architectures for Named Entity Recognition":
  word vectors of 100, a character BiLSTM of 25 units per direction over
  25-dimensional character vectors, a sentence BiLSTM of 100 units per
  direction, a CRF, dropout 0.5 on the word representation, gradient
  clipping at 5.0, and selection on the development set.
- Reimers and Gurevych 2017, "Reporting Score Distributions Makes a
  Difference" / "Optimal Hyperparameters for Deep LSTM-Networks for
  Sequence Labeling Tasks": Nadam, gradient normalization at threshold 1,
  two stacked BiLSTM layers of about 100 units, a CRF classifier for
  BIO-tagged spans, mini-batches of 8 to 32 sentences, variational
  dropout of 0.25 to 0.5.
Where the two differ the trainer takes the later study's optimizer and
clipping and the earlier one's character encoder and sizes.
"""

from __future__ import annotations

import copy
import os
import re
import tomllib
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

TASKS = ("tagger", "classifier")

DEFAULTS: Dict[str, Any] = {
    "task": "tagger",
    "seed": 0,
    "data": {
        "train": "",
        "dev": "",
        "format": "auto",
        "columns": {},
        "conllu_field": "upos",
        "scheme": "auto",
        "train_scheme": "auto",
        "held_out": 0.1,
        "header": False,
        "max_train": 0,
        "max_dev": 0,
    },
    "model": {
        "head": "crf",
        "cell": "lstm",
        "hidden": 100,
        "depth": 1,
        "word_dim": 100,
        "char_encoder": "lstm",
        "char_dim": 25,
        "char_units": 25,
        "max_chars": 16,
        "feature_dim": 16,
        "dropout": 0.5,
        "lowercase": True,
        "fold_digits": True,
        "min_word_count": 1,
        "pooling": "max",
    },
    "train": {
        "epochs": 30,
        "batch_size": 32,
        "optimizer": "nadam",
        "learning_rate": 0.002,
        "schedule": "cosine",
        "min_learning_rate": 0.05,
        "clipnorm": 1.0,
        "word_dropout": 0.05,
        "patience": 5,
        "checkpoint_minutes": 5.0,
        "checkpoint_steps": 0,
    },
    "export": {
        "enabled": True,
    },
}

SOURCES: Dict[str, str] = {
    "model.head": "Lample et al. 2016; Reimers and Gurevych 2017 (a CRF for BIO spans)",
    "model.hidden": "Lample et al. 2016 (100 per direction)",
    "model.word_dim": "Lample et al. 2016 (100)",
    "model.char_encoder": "Lample et al. 2016 (a character BiLSTM)",
    "model.char_dim": "Lample et al. 2016 (25)",
    "model.char_units": "Lample et al. 2016 (25 per direction)",
    "model.dropout": "Lample et al. 2016 (0.5); Reimers and Gurevych 2017 (0.25-0.5)",
    "train.optimizer": "Reimers and Gurevych 2017 (Nadam)",
    "train.clipnorm": "Reimers and Gurevych 2017 (gradient normalization, threshold 1; here Keras's clipnorm, "
                      "each variable's gradient)",
    "train.batch_size": "Reimers and Gurevych 2017 (8-32 sentences)",
    "train.patience": "Lample et al. 2016; Reimers and Gurevych 2017 (selection on dev, early stopping)",
}

CHOICES: Dict[str, Tuple[str, ...]] = {
    "task": TASKS,
    "data.format": ("auto", "conll", "conllu", "tsv"),
    "data.scheme": ("auto", "none", "iob1", "iob2", "bioes"),
    "data.train_scheme": ("auto", "iob2", "bioes"),
    "model.head": ("crf", "softmax"),
    "model.cell": ("lstm", "gru"),
    "model.char_encoder": ("lstm", "gru", "cnn", "none"),
    "model.pooling": ("max", "mean", "attention"),
    "train.optimizer": ("nadam", "adam", "sgd", "rmsprop"),
    "train.schedule": ("cosine", "constant"),
}

# Numbers that must be at least 1 (ints) or in a range (floats).
POSITIVE = ("model.hidden", "model.depth", "model.word_dim", "model.char_dim", "model.char_units",
            "model.max_chars", "model.feature_dim", "model.min_word_count", "train.epochs", "train.batch_size")
RANGES: Dict[str, Tuple[float, float]] = {
    "model.dropout": (0.0, 0.99), "train.word_dropout": (0.0, 0.99), "data.held_out": (0.01, 0.9),
    "train.min_learning_rate": (0.0, 1.0), "train.learning_rate": (1e-9, 10.0), "train.clipnorm": (0.0, 1e9),
    "train.checkpoint_minutes": (0.0, 1e9),
}


class ConfigError(ValueError):
    """A config file or `--set` item that cannot be used; the message names
    the file and line (or the item)."""


def line_of(text: str, section: Optional[str], key: Optional[str]) -> int:
    """The 1-based line where `key` is set in `[section]` of a TOML text
    (the section's header line without `key`; 1 when not found)."""
    current, header = None, 1
    for number, line in enumerate(text.splitlines(), start=1):
        match = re.match(r"\s*\[([^\]]+)\]", line)
        if match:
            current = match.group(1).strip()
            if (current == section and key is None) or (section is None and current == key):
                return number
            header = number if current == section else header
            continue
        if key is not None and current == section and re.match(rf"\s*\"?{re.escape(key)}\"?\s*=", line):
            return number
    return header


def check_value(name: str, value: Any, default: Any) -> Optional[str]:
    """Why `value` cannot be setting `name` (whose default is `default`), or None."""
    if isinstance(default, bool):
        return None if isinstance(value, bool) else f"must be true or false, received {value!r}"
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer, received {value!r}"
        if name in POSITIVE and value < 1:
            return f"must be at least 1, received {value}"
        return None if value >= 0 else f"must be 0 or more, received {value}"
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number, received {value!r}"
        low, high = RANGES.get(name, (0.0, float("inf")))
        return None if low <= value <= high else f"must be in [{low}, {high}], received {value}"
    if isinstance(default, str):
        if not isinstance(value, str):
            return f"must be a string, received {value!r}"
        choices = CHOICES.get(name)
        return None if choices is None or value in choices else f"must be one of {', '.join(choices)}, received {value!r}"
    if isinstance(default, dict):
        if not isinstance(value, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
            return f"must be a table of column indices, e.g. {{tokens = 0, tags = -1}}, received {value!r}"
    return None


def merge(settings: Dict[str, Any], given: Mapping[str, Any], where) -> None:
    """Sets `given`'s values into `settings`, checked; `where(section, key)`
    names the place of a bad one in the message."""
    for key, value in given.items():
        if key in DEFAULTS and not isinstance(DEFAULTS[key], dict):
            default = DEFAULTS[key]
            problem = check_value(key, value, default)
            if problem:
                raise ConfigError(f"{where(None, key)}: `{key}` {problem}")
            settings[key] = value
            continue
        if key not in DEFAULTS:
            raise ConfigError(f"{where(None, key)}: unknown setting `{key}`; the settings are "
                              f"{', '.join(sorted(DEFAULTS))}")
        if not isinstance(value, dict):
            raise ConfigError(f"{where(key, None)}: `{key}` is a section ([{key}]), received {value!r}")
        for name, item in value.items():
            if name not in DEFAULTS[key]:
                raise ConfigError(f"{where(key, name)}: unknown setting `{key}.{name}`; [{key}] has "
                                  f"{', '.join(sorted(DEFAULTS[key]))}")
            problem = check_value(f"{key}.{name}", item, DEFAULTS[key][name])
            if problem:
                raise ConfigError(f"{where(key, name)}: `{key}.{name}` {problem}")
            settings[key][name] = item


def parse_override(item: str) -> Tuple[List[str], Any]:
    """`section.key=value` as (["section", "key"], value); the value is read as
    a TOML value (`3`, `0.5`, `true`, `"x"`, `{tokens = 0}`), else as a bare string."""
    name, sign, text = item.partition("=")
    path = [part.strip() for part in name.split(".")]
    if not sign or not all(path) or len(path) > 2:
        raise ConfigError(f"--set {item!r}: expected section.key=value (e.g. train.epochs=10)")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    return path, value


def resolve(path: Optional[str] = None, overrides: Sequence[str] = ()) -> Dict[str, Any]:
    """The complete settings: `DEFAULTS`, then the TOML file at `path`, then `overrides`.

    Args:
        path: A TOML config file, or None for the defaults.
        overrides: `section.key=value` items (`--set`).

    Returns:
        A new dict of every setting, checked.

    Raises:
        ConfigError: An unreadable or malformed file (its line), an unknown
            setting or a bad value (the file's line, or the `--set` item),
            or settings that do not fit together (`check_settings`).
    """
    settings, text = copy.deepcopy(DEFAULTS), ""
    if path is not None:
        text = read_config_text(path)
        try:
            given = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            line = getattr(error, "lineno", None) or first_number(str(error))
            raise ConfigError(f"{path}:{line}: not valid TOML ({str(error).split(' (at')[0]})") from None
        merge(settings, given, lambda s, k: f"{path}:{line_of(text, s, k)}")
    for item in overrides:
        keys, value = parse_override(item)
        given = {keys[0]: value} if len(keys) == 1 else {keys[0]: {keys[1]: value}}
        merge(settings, given, lambda s, k, item=item: f"--set {item}")
    check_settings(settings, lambda key: f"{path}:{line_of(text, 'data', key)}" if path else "the settings")
    return settings


def first_number(text: str) -> int:
    """The first integer in `text` after "line" (tomllib's message), else 1."""
    match = re.search(r"line (\d+)", text)
    return int(match.group(1)) if match else 1


def read_config_text(path: str) -> str:
    """The config file's text; a ConfigError when it is missing or not UTF-8."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such config file")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte {data[error.start]:#04x})") from None
    except OSError as error:
        raise ConfigError(f"{path}: {error.strerror or error}") from None


def check_settings(settings: Dict[str, Any], where) -> None:
    """Raises ConfigError for settings that do not fit together; `where(key)`
    names the place of `data.key`."""
    data = settings["data"]
    if not data["train"]:
        raise ConfigError(f"{where('train')}: `data.train` is not set (a training file; --set data.train=PATH)")
    columns = data["columns"]
    if columns and settings["task"] == "tagger" and not {"tokens", "tags"} <= set(columns):
        raise ConfigError(f"{where('columns')}: `data.columns` of a tagger must name tokens and tags, received "
                          f"{', '.join(columns)}")
    if columns and settings["task"] == "classifier" and set(columns) - {"text", "label"}:
        raise ConfigError(f"{where('columns')}: `data.columns` of a classifier names text and label, received "
                          f"{', '.join(columns)}")


def dump(settings: Mapping[str, Any]) -> str:
    """Settings as TOML text (`resolve` reads it back to the same dict)."""
    lines = [f"{key} = {toml_value(value)}" for key, value in settings.items() if not isinstance(value, dict)]
    for key, section in settings.items():
        if isinstance(section, dict):
            lines += ["", f"[{key}]"] + [f"{name} = {toml_value(value)}" for name, value in section.items()]
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    """One value as TOML: booleans, numbers, strings and tables of those."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"Cannot write {value!r} as TOML.")


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> List[str]:
    """The `section.key` names whose values differ between two settings."""
    found = []
    for key in DEFAULTS:
        if isinstance(DEFAULTS[key], dict):
            found += [f"{key}.{name}" for name in DEFAULTS[key] if old[key].get(name) != new[key].get(name)]
        elif old.get(key) != new.get(key):
            found.append(key)
    return found
