"""Reading a request body the way dockerd will, and writing the one the gate forwards instead.

dockerd (20.10, built with Go 1.19) decodes bodies with Go's `encoding/json`, which is lenient
where a Python reading would differ:

- a key names a struct field case-insensitively (an exact match is preferred), and Go 1.19 also
  folds `ſ` (U+017F) into `s` and `K` (U+212A, the Kelvin sign) into `k`: `hostconfig`,
  `Bindſ` and `BINDS` all set `Binds`;
- when two keys name one field, both are decoded into it in turn: the last scalar wins, and two
  objects are merged (`HostConfig` then `hostconfig` adds the second's settings to the first's);
- a key that names no field is ignored, and so is whatever follows the first JSON value;
- map-typed settings (`Labels`, `Tmpfs`, `LogConfig.Config`, `Volumes`) keep their keys exactly.

So the gate reads no key the way Python would and forwards no byte the caller sent. `parse`
refuses what is not one JSON object in UTF-8, a key written twice in any object, and numbers
that are not integers or not numbers at all (NaN); `GoStruct` maps each key of a struct to its
field as Go would, refusing a key that is not ASCII, two keys that name the same field, and a
key the gate does not know, at any depth; the models in `schema.py` then type every value
strictly (a bool is a bool, an integer an int64). What is forwarded is `encode` of the
validated model: canonical spellings, the validated fields only.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Annotated, Any, NoReturn, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from sandbox.gate.errors import Refused

Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
"""Go's int64: a JSON integer (not a bool, not 1.0) within its range."""
QUOTED_CHARS = 40
"""How much of a key a reason quotes."""
REASONS_SHOWN = 3
"""How many of a body's errors a refusal names."""

Shape = TypeVar("Shape", bound="GoStruct")


class GoStruct(BaseModel):
    """A Go struct as `encoding/json` fills it, with the gate's allowlist of its fields: the
    attribute names are Docker's own spellings, and every field is optional (JSON `null`
    leaves a Go field at its zero value, which the gate treats as absent)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def fold_keys(cls, data: Any) -> Any:
        """Each key, as the field Go would fill with it; a key that is not ASCII, that names
        the same field as another, or that names no field of this allowlist is refused."""
        if not isinstance(data, dict):
            return data  # pydantic answers that it is not an object
        fields = _fields_by_fold(cls)
        named: dict[str, Any] = {}
        spelled: dict[str, str] = {}
        for key, value in data.items():
            if not key.isascii():
                _refuse("go_key", f"the key {_quoted(key)} is not ASCII: dockerd reads some "
                        "letters as others (ſ as s, the Kelvin sign as k)")  # fmt: skip
            folded = key.lower()
            if folded in spelled:
                _refuse("go_key", f"the keys {_quoted(spelled[folded])} and {_quoted(key)} "
                        "name one setting: dockerd reads keys case-insensitively")  # fmt: skip
            spelled[folded] = key
            field = fields.get(folded)
            if field is None:
                _refuse("go_key", f"the key {_quoted(key)} is not one the gate forwards here")
            named[field] = value
        return named


class Nothing(GoStruct):
    """Go's `struct{}`: the values of `Volumes`; any key in it is refused."""


@cache
def _fields_by_fold(shape: type[GoStruct]) -> dict[str, str]:
    names = list(shape.model_fields)
    folded = {name.lower(): name for name in names}
    if len(folded) != len(names):
        raise TypeError(f"{shape.__name__} has fields that differ only in case")
    return folded


def _refuse(kind: str, message: str) -> NoReturn:
    # the message is built here, never by pydantic from the caller's input
    raise PydanticCustomError(kind, "{reason}", {"reason": message})


def _quoted(key: str) -> str:
    return repr(key if len(key) <= QUOTED_CHARS else key[:QUOTED_CHARS] + "…")


def parse(raw: bytes) -> dict[str, Any]:
    """`raw` as one JSON object; `Refused` for anything dockerd could read otherwise: not
    UTF-8, not JSON, not an object, a key twice in one object, a number that is not an
    integer."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused(f"its body is not UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(
            text, object_pairs_hook=_object, parse_float=_fraction, parse_constant=_constant
        )
    except Refused:
        raise
    except json.JSONDecodeError as exc:
        raise Refused(f"its body is not one JSON value: {exc.msg} (character {exc.pos})") from None
    except ValueError:  # an integer of more digits than Python converts
        raise Refused("its body holds an integer far out of any range") from None
    except RecursionError:
        raise Refused("its body nests too deeply") from None
    if not isinstance(value, dict):
        raise Refused("its body is not a JSON object")
    return value


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise Refused(f"the key {_quoted(key)} appears twice in one object")
        found[key] = value
    return found


def _fraction(text: str) -> NoReturn:
    raise Refused("its body holds a number with a fraction or an exponent; Docker's are integers")


def _constant(text: str) -> NoReturn:
    raise Refused(f"its body holds {text}, which is not JSON")


def decode(shape: type[Shape], raw: bytes) -> Shape:
    """`raw` read as dockerd reads it into `shape`, typed strictly; `Refused` naming where and
    what is wrong otherwise (never quoting a value: an environment may hold secrets)."""
    data = parse(raw)
    try:
        return shape.model_validate(data)
    except ValidationError as exc:
        raise Refused(reason(exc)) from None


def reason(error: ValidationError) -> str:
    """The first few errors of `error`, each as `Where.It.Is: what`."""
    found = error.errors(include_input=False, include_url=False)
    said = []
    for item in found[:REASONS_SHOWN]:
        where = ".".join(str(part) for part in item["loc"]) or "the body"
        said.append(f"{where}: {item['msg']}")
    more = f" (and {len(found) - REASONS_SHOWN} more)" if len(found) > REASONS_SHOWN else ""
    return "; ".join(said) + more


def encode(model: BaseModel) -> bytes:
    """The JSON the gate forwards for `model`: its fields, by Docker's spellings, without the
    unset ones. `Refused` when a string holds an unpaired surrogate (`\\ud800`), which Go would
    replace by U+FFFD: not what the caller wrote."""
    data = model.model_dump(exclude_none=True)
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused("its body holds an unpaired surrogate escape (\\ud800-\\udfff)") from None
