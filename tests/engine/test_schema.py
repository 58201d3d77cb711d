"""The trainer's options: types in the schema (src/engine/schema.py), values in conf/trainer/default.yaml,
each stated once; a wrong type and an option no file gives a value are refused, naming the key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from conftest import CONF
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from omegaconf import MISSING

from src.cli import config_loader
from src.engine.schema import TrainerSchema, check_values
from src.errors import ConfigError

DEFAULTS = CONF / "trainer" / "default.yaml"


def test_the_schema_states_types_only_and_the_yaml_a_value_for_each():
    """No default in the schema (a second statement of the yaml's), and every option it types has
    its value in the yaml, where a reader looks for it."""
    fields = dataclasses.fields(TrainerSchema)
    assert [
        f.name for f in fields if f.default is not MISSING or f.default_factory is not dataclasses.MISSING
    ] == []
    stated = yaml.safe_load(DEFAULTS.read_text(encoding="utf-8"))
    assert {f.name for f in fields} <= set(stated) - {"defaults"}


@pytest.mark.parametrize(
    "override, wanted",
    [
        ("trainer.log_every=abc", "Value 'abc' of type 'str' could not be converted to Integer"),
        ("trainer.checkpoints=maybe", "Value 'maybe' is not a valid bool"),
        ("trainer.clip_grad=big", "Value 'big' of type 'str' could not be converted to Float"),
    ],
)
def test_a_trainer_option_of_the_wrong_type_is_refused_when_composed(override, wanted):
    with pytest.raises(ConfigCompositionException) as refused:
        config_loader().load_configuration("config", [override], RunMode.RUN)
    message = f"{refused.value} {refused.value.__cause__}"
    assert wanted in message and override.split("=")[0] in message


def trainer_file_without(tmp_path: Path, *keys: str) -> Path:
    """A config folder with ``trainer/partial.yaml``: conf/trainer/default.yaml without ``keys``."""
    stated = yaml.safe_load(DEFAULTS.read_text(encoding="utf-8"))
    for key in keys:
        del stated[key]
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "partial.yaml").write_text(yaml.safe_dump(stated), encoding="utf-8")
    return tmp_path


def composed_with(folder: Path, overrides: list[str]):
    """The config composed with ``folder`` on the search path (as ``--config-dir`` adds it)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[f"hydra.searchpath=[file://{folder}]", *overrides])


@pytest.mark.parametrize("keys", [["log_every"], ["precision", "ema"]])
def test_an_option_no_trainer_file_states_is_refused_naming_it(keys, tmp_path):
    cfg = composed_with(trainer_file_without(tmp_path, *keys), ["trainer=partial", "trainer.max_steps=2"])
    with pytest.raises(ConfigError) as refused:
        check_values(cfg)
    named = [part.strip() for part in str(refused.value).split(":")[0].split(",")]
    assert named == [f"trainer.{key}" for key in sorted(keys)]


def test_the_full_trainer_file_passes(tmp_path):
    """The refusal above is the left-out key's, not the copied file's."""
    check_values(composed_with(trainer_file_without(tmp_path), ["trainer=partial", "trainer.max_steps=2"]))
