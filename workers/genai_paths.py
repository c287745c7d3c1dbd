"""google-genai's request building without its walk through every field, with the same results.

google-genai turns each request into the API's JSON by reading paths out of its pydantic models
with `_common.get_value_by_path`, which asks `key in data` before anything else. A pydantic model
has no `__contains__`, so Python answers by iterating the model: every field, as a (name, value)
pair that never equals a string, before the function falls back to `getattr`. A
`GenerateContentConfig` has 39 fields and a request reads some hundred paths, so about a
millisecond of CPU of every model call goes to these walks: a seventh of google-genai's call
with an instant model (measured side by side, docs/benchmarks.md, "Orchestration overhead").

`get_value_by_path` below gives exactly the answers google-genai's gives. For a model, `key in
data` is always False, so its answer is the attribute when the model has one, else the default
(a list path such as `tools[]` names no attribute: the default too); anything else (dicts,
lists, `_self`) is left to google-genai's own function. `install()` puts it where
`google.genai.models` looks the function up (`getv`), only while that name is still
google-genai's own function: a release that changes either leaves google-genai as it is.
"""

from __future__ import annotations

from typing import Any

from google.genai import _common
from google.genai import models as genai_models
from pydantic import BaseModel

_original = _common.get_value_by_path


def get_value_by_path(data: Any, keys: list[str], *, default_value: Any = None) -> Any:
    """`google.genai._common.get_value_by_path`, answered without iterating pydantic models."""
    if keys == ["_self"]:
        return data
    for i, key in enumerate(keys):
        if not isinstance(data, BaseModel) or not data:
            return _original(data, keys[i:], default_value=default_value)
        if not hasattr(data, key):  # a list path (`tools[]`) names no attribute either
            return default_value
        data = getattr(data, key)
    return data


def install() -> bool:
    """Use `get_value_by_path` for google-genai's model calls; True if it is in use."""
    if genai_models.getv is _original:
        genai_models.getv = get_value_by_path
    return genai_models.getv is get_value_by_path
