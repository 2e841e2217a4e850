"""JSON in, JSON out: results are JSON (pydantic models dumped in JSON mode) and revalidated on
replay when the step declares a return type. No pickle, ever: a journal must stay readable by any
later version of the code and by `kubectl get -o yaml`."""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any, get_type_hints

import pydantic_core
from pydantic import TypeAdapter

from durable_sandbox.engine.errors import SerializationError


def _type_marker(obj: Any) -> str:
    # Digests must not depend on memory addresses, so opaque objects contribute their type only.
    return f"<{type(obj).__module__}.{type(obj).__qualname__}>"


def to_jsonable(value: Any, *, what: str) -> Any:
    try:
        return pydantic_core.to_jsonable_python(value)
    except pydantic_core.PydanticSerializationError as exc:
        raise SerializationError(
            f"{what} is not JSON-serializable ({exc}). Return JSON types or pydantic models; "
            f"results are stored as JSON so that any later version of the code can replay them."
        ) from None


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def input_digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    data = pydantic_core.to_json([args, kwargs], fallback=_type_marker)
    return hashlib.sha256(data).hexdigest()[:32]


def value_digest(value: Any) -> str:
    return hashlib.sha256(pydantic_core.to_json(value, fallback=_type_marker)).hexdigest()[:32]


def callable_name(fn: Callable[..., Any]) -> str:
    while isinstance(fn, partial):
        fn = fn.func
    # __name__, not __qualname__: renaming the enclosing workflow function (which a lambda's or a nested
    # function's qualname contains) must not turn every recorded step into a nondeterminism error.
    return getattr(fn, "__name__", None) or type(fn).__name__


@lru_cache(maxsize=1024)
def _return_adapter(fn: Callable[..., Any]) -> TypeAdapter[Any] | None:
    target = fn.func if isinstance(fn, partial) else fn
    try:
        hints = get_type_hints(target)
    except Exception:
        return None
    ann = hints.get("return")
    if ann is None or ann is Any or ann is type(None):
        return None
    if inspect.isclass(ann) and ann in (dict, list, str, int, float, bool):
        return None  # JSON already gives these back; skip the cost
    try:
        return TypeAdapter(ann)
    except Exception:
        return None


def revalidate(fn: Callable[..., Any], value: Any) -> Any:
    """Turn a recorded JSON result back into what the step's return annotation declares."""
    try:
        adapter = _return_adapter(fn)
    except TypeError:  # unhashable callable
        return value
    return value if adapter is None else adapter.validate_python(value)
