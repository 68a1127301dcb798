"""A connector is generic over its config model: the model it names in brackets is the one the
engine validates its config with, so ``context.config`` is of that type (mypy checks the
reference connectors with no ``isinstance`` in them)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from connectors import Connector, NoConfig, Table


class Account(BaseModel):
    account: str


class Other(BaseModel):
    other: str


def test_a_config_model_other_than_the_one_named_is_refused_when_the_class_is_defined() -> None:
    with pytest.raises(TypeError, match=r"Connector\[Account\].*config_model = Account"):

        class Wrong(Connector[Account]):
            provider = "wrong"
            config_model = Other

    with pytest.raises(TypeError, match="its config_model is NoConfig"):

        class Forgot(Connector[Account]):
            provider = "forgot"


def test_a_subclass_of_the_named_model_and_an_unparameterised_connector_are_accepted() -> None:
    class Narrower(Account):
        region: str = "eu"

    class Fine(Connector[Account]):
        provider = "fine"
        tables = (Table("items"),)
        config_model = Narrower

    class Plain(Connector):  # type: ignore[type-arg]
        provider = "plain"

    assert Fine.config_model is Narrower and Plain.config_model is NoConfig
