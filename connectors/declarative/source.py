"""Reading a provider file: YAML (PyYAML's safe loader: plain data, no tags that build objects)
into a :class:`ProviderSpec`, with every mistake reported at its line. The shape is checked by
pydantic, all mistakes at once; what the fields mean together by ``checks``, once the shape is
right."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from connectors.declarative.checks import Location, problems
from connectors.declarative.spec import ProviderSpec

MAX_SOURCE = 256 * 1024  # a provider file is a page or two; anything near this is a mistake


@dataclass(frozen=True)
class Mistake:
    line: int
    where: str  # the field, as a dotted path: tables[1].primary_key
    message: str

    def __str__(self) -> str:
        return (
            f"line {self.line}: {self.where}: {self.message}"
            if self.where
            else (f"line {self.line}: {self.message}")
        )


class ProviderFileError(ValueError):
    """A provider file that cannot be used; ``mistakes`` each name their line."""

    def __init__(self, mistakes: list[Mistake]) -> None:
        self.mistakes = mistakes
        count = len(mistakes)
        first = str(mistakes[0]) if mistakes else "invalid"
        more = f" (and {count - 1} more)" if count > 1 else ""
        super().__init__(f"{first}{more}")


def parse(text: str, reserved: Collection[str] = ()) -> ProviderSpec:
    """The provider ``text`` declares, or :class:`ProviderFileError` listing every mistake.
    ``reserved``: names the provider may not take (the installed plugins')."""
    if len(text) > MAX_SOURCE:
        raise ProviderFileError([Mistake(1, "", f"the file is over {MAX_SOURCE // 1024} KiB")])
    data, lines = _load(text)
    try:
        spec = ProviderSpec.model_validate(data)
    except ValidationError as exc:
        raise ProviderFileError(_from_pydantic(exc, lines)) from None
    found = problems(spec, reserved)
    if found:
        mistakes = [Mistake(_line(loc, lines), _dotted(loc), message) for loc, message in found]
        raise ProviderFileError(sorted(mistakes, key=lambda m: m.line))
    return spec


def _load(text: str) -> tuple[Any, dict[Location, int]]:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ProviderFileError([Mistake(1, "", "the file is empty")])
        lines: dict[Location, int] = {}
        _walk(node, (), lines)
        return loader.construct_document(node), lines
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise ProviderFileError([Mistake(line, "", f"not YAML: {exc.problem}")]) from None
    except yaml.YAMLError as exc:
        raise ProviderFileError([Mistake(1, "", f"not YAML: {exc}")]) from None
    finally:
        loader.dispose()


def _walk(node: yaml.Node, at: Location, lines: dict[Location, int]) -> None:
    """Record the line of every key and item under ``node``; refuse a key given twice (YAML
    would quietly keep the last)."""
    lines.setdefault(at, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else str(key.start_mark)
            here = (*at, name)
            if here in lines and here != at:
                raise ProviderFileError(
                    [Mistake(key.start_mark.line + 1, _dotted(here), "given twice")]
                )
            lines[here] = key.start_mark.line + 1
            _walk(value, here, lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*at, i)] = item.start_mark.line + 1
            _walk(item, (*at, i), lines)


def _from_pydantic(exc: ValidationError, lines: dict[Location, int]) -> list[Mistake]:
    mistakes = []
    for error in exc.errors():
        loc = _in_file(tuple(error["loc"]), lines)
        message = _MESSAGES.get(error["type"], error["msg"])
        mistakes.append(Mistake(_line(loc, lines), _dotted(loc), message))
    return sorted(mistakes, key=lambda m: m.line)


_MESSAGES = {"missing": "required, and missing", "extra_forbidden": "not a field here (a typo?)"}


def _in_file(loc: Location, lines: dict[Location, int]) -> Location:
    """The error's location without the parts pydantic adds (the tag of a union, the kind of
    a check): each step is kept only if the file has it."""
    kept: Location = ()
    for step in loc:
        if (*kept, step) in lines:
            kept = (*kept, step)
    missing = loc[-1] if loc else None
    if missing is not None and kept[-1:] != (missing,) and isinstance(missing, str):
        return (*kept, missing)
    return kept


def _line(loc: Location, lines: dict[Location, int]) -> int:
    """The line of the deepest part of ``loc`` the file has."""
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return 1


def _dotted(loc: Location) -> str:
    text = ""
    for step in loc:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else str(step))
    return text
