"""Environment configuration: validation, canonical bytes and the config digest.

An environment's configuration travels inside tasks (coordinator → worker → validator), so it must
be plain JSON data, and every party must be able to check that it runs the same environment as the
task: :func:`config_digest` hashes a canonical serialisation that any language can reproduce.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, NoReturn

import blake3

from rollnet.sdk.domains import CONFIG_DIGEST_DOMAIN

__all__ = [
    "CONFIG_DIGEST_DOMAIN",
    "MAX_SAFE_INTEGER",
    "ConfigReader",
    "EnvironmentConfigError",
    "canonical_json",
    "config_digest",
]

#: Integers in a configuration must lie within ±(2**53 − 1): JSON numbers are IEEE-754 doubles in
#: most languages (and in ``google.protobuf.Struct``), so larger ones would not survive the trip.
MAX_SAFE_INTEGER = 2**53 - 1


class EnvironmentConfigError(ValueError):
    """An environment configuration is invalid; :attr:`key` names the offending key."""

    def __init__(self, environment: str, key: str, message: str) -> None:
        self.environment = environment
        self.key = key
        self.message = message
        super().__init__(f"environment {environment!r}: config key {key!r}: {message}")


def canonical_json(value: Any) -> bytes:
    """Serialise JSON data canonically (RFC 8785, JSON Canonicalization Scheme) as UTF-8 bytes.

    Object keys are sorted by their UTF-16 code units, no insignificant whitespace is written,
    strings use the minimal JSON escapes and numbers use the ECMAScript shortest round-trip form
    (so ``1.0`` and ``1`` serialise identically, as they do in JavaScript). Accepted values:
    ``None``, ``bool``, ``int`` within ±(2**53 − 1), finite ``float``, ``str``, lists/tuples and
    mappings with ``str`` keys. Anything else raises :class:`TypeError` or :class:`ValueError`.
    """
    parts: list[str] = []
    _write_canonical(value, parts, "$")
    return "".join(parts).encode("utf-8")


def config_digest(name: str, config: Mapping[str, Any]) -> str:
    """Return the hex BLAKE3 digest identifying environment ``name`` with ``config``.

    The digest is ``BLAKE3(CONFIG_DIGEST_DOMAIN || canonical_json({"config": config, "name":
    name}))``. Hash the *normalised* configuration (``Environment.config``), which spells out every
    default, so that ``{}`` and ``{"seed": 0}`` give the same digest when they mean the same thing.
    """
    document = {"name": name, "config": dict(config)}
    return blake3.blake3(CONFIG_DIGEST_DOMAIN + canonical_json(document)).hexdigest()


def _write_canonical(value: Any, parts: list[str], where: str) -> None:
    # bool before int: bool is a subclass of int.
    if value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise ValueError(f"{where}: integer {value} is outside ±(2**53 - 1)")
        parts.append(str(int(value)))
    elif isinstance(value, float):
        parts.append(_ecmascript_number(value, where))
    elif isinstance(value, str):
        # ensure_ascii=False gives exactly RFC 8785's string form: \" \\ \b \f \n \r \t, other
        # control characters as lowercase \u00xx, everything else verbatim.
        parts.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"{where}: object key {key!r} is not a string")
        parts.append("{")
        for index, key in enumerate(sorted(value, key=lambda k: k.encode("utf-16-be"))):
            if index:
                parts.append(",")
            parts.append(json.dumps(key, ensure_ascii=False))
            parts.append(":")
            _write_canonical(value[key], parts, f"{where}.{key}")
        parts.append("}")
    elif isinstance(value, list | tuple):
        parts.append("[")
        for index, item in enumerate(value):
            if index:
                parts.append(",")
            _write_canonical(item, parts, f"{where}[{index}]")
        parts.append("]")
    else:
        raise TypeError(f"{where}: {type(value).__name__} is not JSON data")


def _ecmascript_number(value: float, where: str) -> str:
    """Format a finite double as ECMAScript's ``Number.prototype.toString`` does."""
    if not math.isfinite(value):
        raise ValueError(f"{where}: {value} is not a finite number")
    if value == 0:
        return "0"  # also for -0.0, as ECMAScript does
    sign = "-" if value < 0 else ""
    # repr() is the shortest string that round-trips, which is what ECMAScript requires too.
    decimal = Decimal(repr(abs(value))).normalize()
    _, digit_tuple, exponent = decimal.as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    k = len(digits)
    n = exponent + k  # value = 0.digits × 10**n
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
        text = f"{mantissa}e{'+' if e > 0 else '-'}{abs(e)}"
    return sign + text


class ConfigReader:
    """Reads and validates one environment's configuration, key by key.

    Each accessor removes its key from the pending set and records the normalised value;
    :meth:`finish` rejects any key nobody asked for and returns the normalised configuration (every
    default spelled out), which is what :func:`config_digest` should hash.
    """

    def __init__(self, environment: str, config: Mapping[str, Any]) -> None:
        if not isinstance(config, Mapping):
            raise EnvironmentConfigError(
                environment, "<root>", f"expected a mapping, got {type(config).__name__}"
            )
        self.environment = environment
        self._pending = dict(config)
        self._normalised: dict[str, Any] = {}
        for key in self._pending:
            if not isinstance(key, str):
                self.fail(repr(key), "config keys must be strings")

    def fail(self, key: str, message: str) -> NoReturn:
        """Raise :class:`EnvironmentConfigError` about ``key``."""
        raise EnvironmentConfigError(self.environment, key, message)

    def _take(self, key: str) -> tuple[bool, Any]:
        if key in self._normalised:
            raise KeyError(f"config key {key!r} read twice")  # a bug in the environment itself
        if key in self._pending:
            return True, self._pending.pop(key)
        return False, None

    def integer(
        self, key: str, default: int, *, minimum: int | None = None, maximum: int | None = None
    ) -> int:
        """Read an integer within ``[minimum, maximum]``.

        Integral floats such as ``3.0`` are accepted as integers because configurations travel in
        ``google.protobuf.Struct``, where every number is a double; bools are refused.
        """
        present, raw = self._take(key)
        value = self._as_integer(key, raw if present else default)
        self._check_range(key, value, minimum, maximum)
        self._normalised[key] = value
        return value

    def number(
        self,
        key: str,
        default: float,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> float:
        """Read a finite number (int or float; bools are refused) and return it as a float."""
        present, raw = self._take(key)
        value = raw if present else default
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(key, f"expected a number, got {value!r}")
        if isinstance(value, int) and abs(value) > MAX_SAFE_INTEGER:
            self.fail(key, f"{value} is outside ±(2**53 - 1)")
        result = float(value)
        if not math.isfinite(result):
            self.fail(key, f"expected a finite number, got {value!r}")
        self._check_range(key, result, minimum, maximum)
        self._normalised[key] = result
        return result

    def boolean(self, key: str, default: bool) -> bool:
        """Read a boolean (``true``/``false``; integers are refused)."""
        present, raw = self._take(key)
        value = raw if present else default
        if not isinstance(value, bool):
            self.fail(key, f"expected true or false, got {value!r}")
        self._normalised[key] = value
        return value

    def string(self, key: str, default: str) -> str:
        """Read a string."""
        present, raw = self._take(key)
        value = raw if present else default
        if not isinstance(value, str):
            self.fail(key, f"expected a string, got {value!r}")
        self._normalised[key] = value
        return value

    def optional_string(self, key: str) -> str | None:
        """Read a string that may be absent or ``null``."""
        _, value = self._take(key)
        if value is not None and not isinstance(value, str):
            self.fail(key, f"expected a string or null, got {value!r}")
        self._normalised[key] = value
        return value

    def optional_integer(
        self, key: str, *, minimum: int | None = None, maximum: int | None = None
    ) -> int | None:
        """Read an integer within ``[minimum, maximum]`` that may be absent or ``null``."""
        present, raw = self._take(key)
        if not present or raw is None:
            self._normalised[key] = None
            return None
        value = self._as_integer(key, raw)
        self._check_range(key, value, minimum, maximum)
        self._normalised[key] = value
        return value

    def raw(self, key: str, default: Any) -> Any:
        """Take ``key``'s value unchecked (``default`` when absent); the caller validates it
        and records the normalised form with :meth:`set_normalised`."""
        present, value = self._take(key)
        return value if present else default

    def integer_list(
        self, key: str, default: Sequence[int], *, minimum: int | None = None
    ) -> list[int]:
        """Read a list of integers (integral floats accepted), each at least ``minimum``."""
        present, raw = self._take(key)
        value = raw if present else list(default)
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            self.fail(key, f"expected a list of integers, got {value!r}")
        result: list[int] = []
        for item in value:
            number = self._as_integer(key, item)
            self._check_range(key, number, minimum, MAX_SAFE_INTEGER)
            result.append(number)
        self._normalised[key] = list(result)
        return result

    def set_normalised(self, key: str, value: Any) -> None:
        """Record a derived value in the normalised configuration (e.g. a computed file digest)."""
        self._normalised[key] = value

    def finish(self) -> dict[str, Any]:
        """Refuse unknown keys; return the normalised configuration."""
        if self._pending:
            unknown = sorted(self._pending)
            known = ", ".join(sorted(self._normalised)) or "none"
            self.fail(unknown[0], f"unknown key (known keys: {known})")
        normalised = dict(self._normalised)
        canonical_json(normalised)  # guarantees the result can travel in a task
        return normalised

    def _as_integer(self, key: str, value: Any) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"expected an integer, got {value!r}")
        if abs(value) > MAX_SAFE_INTEGER:
            self.fail(key, f"{value} is outside ±(2**53 - 1)")
        return value

    def _check_range(
        self, key: str, value: float, minimum: float | None, maximum: float | None
    ) -> None:
        if minimum is not None and value < minimum:
            self.fail(key, f"{value!r} is below the minimum {minimum!r}")
        if maximum is not None and value > maximum:
            self.fail(key, f"{value!r} is above the maximum {maximum!r}")
