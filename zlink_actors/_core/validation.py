"""One rule for the arguments every entry point checks (docs/validation.md).

Time arguments: every number of seconds the package takes (a call's `timeout()`, an
observation timeout, a Host option, a deadline, a timer interval, a manual clock's step)
goes through `check_seconds`, so one mistake is refused alike everywhere:

- not a real number, or a `bool`: `TypeError` naming the argument;
- NaN, below the argument's minimum, infinite, or above `threading.TIMEOUT_MAX` (the
  longest timed wait the platform accepts): `ValueError`, never a raw `OverflowError`.

`None` ("no limit") is accepted only where a limit is optional (`check_optional_seconds`).

Names: a Spot or Actor id and a ChannelName are a `str` of 1-255 bytes in strict UTF-8
(`check_id`), so that every id this process accepts can go on the wire as it is.

Reply types: a request's `reply=` is a class (checked with `isinstance`, as cheap as
ever) or any other type msgspec can validate (`int | None`, `list[int]`,
`dict[str, Point]`, `Literal[...]`, `Annotated[...]`); `reply_rule` turns the latter into
a class whose `isinstance` asks msgspec, so the reply path is the same for both.
"""

from __future__ import annotations

import math
import numbers
import threading
import typing
from typing import Any, Final, cast

import msgspec

from .errors import InvalidOperationError

__all__ = [
    "MAX_NAME_BYTES",
    "MAX_SECONDS",
    "MIN_INTERVAL",
    "STRUCT_META",
    "add_metadata",
    "check_id",
    "check_optional_seconds",
    "check_seconds",
    "reply_mismatch",
    "reply_rule",
    "rule_type",
]

#: The longest number of seconds any argument takes: the platform's longest timed wait.
MAX_SECONDS: Final = threading.TIMEOUT_MAX
#: The shortest timer interval (1 ms): a shorter one would only spin the timer thread.
MIN_INTERVAL: Final = 0.001
#: The longest Spot or Actor id and ChannelName, in UTF-8 bytes.
MAX_NAME_BYTES: Final = 255


def check_seconds(
    name: str, value: object, *, minimum: float = 0.0, inclusive: bool = False
) -> float:
    """Validate a number of seconds and return it as a `float`.

    The default is a budget: more than 0 (a call's `timeout()`, a Host's default request
    timeout, a shutdown deadline). Observation timeouts and clock steps take
    `inclusive=True` (0 polls); timer intervals take `minimum=MIN_INTERVAL, inclusive=True`.

    Args:
        name: the argument's name, for the message.
        value: what the caller passed: an `int`, a `float` or another `numbers.Real`.
        minimum: the lower bound.
        inclusive: accept `minimum` itself.

    Returns:
        The value as a float, above `minimum` (or equal to it when `inclusive`) and at
        most `MAX_SECONDS`.

    Raises:
        TypeError: `value` is not a real number, or is a `bool`.
        ValueError: `value` is NaN, below the bound, infinite, or above `MAX_SECONDS`.
    """
    kind = type(value)
    if (
        kind is not float
        and kind is not int
        and (kind is bool or not isinstance(value, numbers.Real))
    ):
        raise TypeError(f"{name} must be a real number (seconds), got {_type_of(value)}")
    try:
        seconds = float(value)  # type: ignore[arg-type]  # a numbers.Real
    except OverflowError:  # an int (or a fraction) too large for a float
        seconds = math.inf if value > 0 else -math.inf  # type: ignore[operator]
    if (seconds >= minimum if inclusive else seconds > minimum) and seconds <= MAX_SECONDS:
        return seconds
    if math.isnan(seconds):
        raise ValueError(f"{name} must be a number, not NaN")
    if seconds > MAX_SECONDS:
        bound = "finite and at most threading.TIMEOUT_MAX"
    else:
        bound = f"{'>=' if inclusive else '>'} {minimum:g} seconds"
    raise ValueError(f"{name} must be {bound}, got {_shown(value)}")


def check_optional_seconds(name: str, value: object) -> float | None:
    """`None` (no limit), or a number of seconds >= 0 (0 polls): see `check_seconds`."""
    if value is None:
        return None
    return check_seconds(name, value, inclusive=True)


def check_id(what: str, value: object) -> str:
    """Validate a Spot or Actor id, or a ChannelName, and return it as is.

    Args:
        what: the argument's name, for the message.
        value: a `str` of 1-255 bytes once encoded as strict UTF-8 (a lone surrogate,
            which has no UTF-8 encoding, is refused).

    Raises:
        TypeError: `value` is not a str.
        ValueError: `value` is empty, longer than 255 UTF-8 bytes, or not encodable.
    """
    # The common case, in O(1): an ASCII character is one UTF-8 byte.
    if type(value) is str and 0 < len(value) <= MAX_NAME_BYTES and value.isascii():
        return value
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {_type_of(value)}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} has no UTF-8 encoding: {value[exc.start]!r} at index {exc.start} is a "
            "lone surrogate"
        ) from None
    if not 1 <= size <= MAX_NAME_BYTES:
        raise ValueError(f"{what} must be 1-{MAX_NAME_BYTES} UTF-8 bytes, got {size}")
    return value


class _ConformsMeta(type):
    """The metaclass of the class `reply_rule` makes for a type that is not a class."""

    reply_type: Any

    def __instancecheck__(cls, value: object) -> bool:
        # Conforms: msgspec validates it strictly and that changes nothing (so the value
        # is delivered as is; a dict is not a Struct, a tuple not a list, 3 not 3.0).
        try:
            converted = msgspec.convert(value, cls.reply_type, strict=True)
            return converted is value or (
                type(converted) is type(value) and bool(converted == value)
            )
        except Exception:  # a ValidationError, or a value whose == raised: no match
            return False


#: The metaclass of msgspec Structs: like `type`'s classes, theirs are their own rules.
STRUCT_META: Final = type(msgspec.Struct)
#: Reply rules already made, by `reply=` type (types are few; the cache stays small).
_RULES: dict[object, type | None] = {}
_MAX_RULES: Final = 1024


def reply_rule(reply: object) -> type | None:
    """What a request checks its reply against, for a `reply=` that is not `None`.

    A class is its own rule (the reply must be an instance of it). `typing.Any` checks
    nothing (None). Any other type msgspec can validate gets a class, made once per type,
    whose `isinstance` is true for a value that already conforms: one msgspec validates
    strictly (`msgspec.convert(value, reply, strict=True)`) without changing it. So an
    `int` conforms to `int | None`, while `"3"` does not, nor a `dict` to `Point | None`,
    nor a `tuple` to `list[int]`.

    Raises:
        TypeError: `reply` is a class that `isinstance` refuses (a protocol that is not
            `@runtime_checkable`), or not a type msgspec can handle at all.
    """
    try:
        return _RULES[reply]
    except KeyError:
        pass
    except TypeError:  # unhashable: check it, and do not cache it
        return _make_rule(reply)
    rule = _make_rule(reply)
    if len(_RULES) < _MAX_RULES:
        _RULES[reply] = rule
    return rule


def _make_rule(reply: object) -> type | None:
    if reply is typing.Any:
        return None
    if isinstance(reply, type):
        try:
            isinstance(None, reply)
        except TypeError as exc:
            raise TypeError(f"reply={reply.__qualname__} cannot be checked: {exc}") from None
        return reply
    try:
        msgspec.msgpack.Decoder(reply)  # the network tiers' codec: refuses what it cannot do
    except TypeError as exc:
        raise TypeError(
            f"reply= takes a class or a type msgspec can validate, got {reply!r}: {exc}"
        ) from None
    return _ConformsMeta(repr(reply), (), {"__slots__": (), "reply_type": reply})


def rule_type(rule: type) -> object:
    """The type a `reply_rule` checks against (for a decoder): the class itself, or the
    msgspec type a conformance rule was made for."""
    if type(rule) is _ConformsMeta:
        return cast(Any, rule).reply_type
    return rule


def reply_mismatch(expected: type, value: object) -> str:
    """Why `value` is not a reply of `expected` (a `reply_rule`), for `ProtocolError`."""
    message = f"the reply is a {type(value).__name__}, expected {expected.__name__}"
    if type(expected) is not _ConformsMeta:
        return message
    try:
        msgspec.convert(value, expected.reply_type, strict=True)
    except msgspec.ValidationError as exc:
        return f"{message}: {exc}"
    except Exception as exc:  # a value msgspec cannot even look at
        return f"{message}: {type(exc).__name__}: {exc}"
    return f"{message}: it would have to be converted"


def _type_of(value: object) -> str:
    return "None" if value is None else type(value).__name__


def _shown(value: object) -> str:
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"
    return repr(value)


def add_metadata(meta: dict[str, object] | None, key: object, value: object) -> dict[str, object]:
    """`meta` (made on first use) with `key=value` added: the one rule of every call's
    `metadata()` option.

    Raises:
        TypeError: `key` is not a str.
        InvalidOperationError: `key` was already set.
    """
    if not isinstance(key, str):
        raise TypeError(f"metadata keys are str, got {type(key).__name__}")
    if meta is None:
        meta = {}
    elif key in meta:
        raise InvalidOperationError(f"metadata {key!r} was already set on this call")
    meta[key] = value
    return meta
