"""Quoting user values in messages, bounded: a message names a value by its start and length, never
whole, so that no input can make an error, a status condition or an Event larger than the API server
stores (a 1 MiB label value once made a 3 MB status write the server refused, and the policy stayed
Ready for a generation never applied)."""

from __future__ import annotations

QUOTE_MAX = 40
"""Characters of a value a message shows: enough to recognise it, short enough to keep lines readable."""
MESSAGE_MAX = 32768
"""The longest condition message: metav1.Condition's limit (maxLength 32768 in its OpenAPI schema)."""
_INT_DIGITS_MAX = 64
"""Integers with more bits than this many decimal digits hold are described, not printed: Python refuses
to turn one of more than 4300 digits into text at all."""


def quoted(value: object, limit: int = QUOTE_MAX) -> str:
    """`value` as repr() writes it when short, else its first `limit` characters and its length:
    `'aaaa…' (1048576 characters)`."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > _INT_DIGITS_MAX * 3.33:
            return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
        text = str(value)
        return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} digits)"
    if not isinstance(value, str):
        text = repr(value)
        return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"
    return repr(value) if len(value) <= limit else f"{value[:limit] + '…'!r} ({len(value)} characters)"


def bounded(message: str, limit: int = MESSAGE_MAX) -> str:
    """`message` cut to at most `limit` characters, saying how much was left out."""
    if len(message) <= limit:
        return message
    tail = f"… ({len(message)} characters in all; the rest left out)"
    return message[: max(0, limit - len(tail))] + tail
