"""How the report writes a value: the number and text formats its templates apply (Jinja filters and the table macro's cell formats).

Every value format (``fmt_*``, ``FORMATS``, ``cell``) renders a missing value (None, NaN, ±inf,
NA, blank text) as ``MISSING``, so a hole in a table shows as "—", never as "nan" or an error. A
Jinja undefined is not a missing value but a template reading a name or key that nothing set: it
fails the render with Jinja's error naming it, never shows as "—". The numbers are the
tables' own; a format changes only their units (fractions to percent, bytes to IEC units, seconds
to milliseconds) and how many digits show.

On the analysis side: no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jinja2
import markupsafe

from scalerepro.analysis.values import absent, finite_number

MISSING = "—"  # what every absent or non-finite value renders as


def is_missing(value: Any) -> bool:
    """None, an empty string or a non-finite float: shown as "—". A Jinja undefined raises
    Jinja's error naming what the template read: a value that may be absent is None on purpose
    (in the context, or a table row's absent column), so a misspelt name cannot read as a hole."""
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()  # Jinja's documented hook for custom undefined types
    return absent(value)


def truthy(value: Any) -> bool | None:
    """A flag as CSV round-trips it (True, "True", "true", 1, "1"), or None when absent."""
    if is_missing(value):
        return None
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        return None
    return bool(value)


def fmt_text(value: Any) -> str:
    if is_missing(value):
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value.is_integer():
            return str(int(value))
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def fmt_int(value: Any) -> str:
    number = finite_number(value)
    return fmt_text(value) if number is None else f"{round(number):,}"


def fmt_number(value: Any, digits: int = 1) -> str:
    number = finite_number(value)
    return fmt_text(value) if number is None else f"{number:,.{digits}f}"


def fmt_rate(value: Any) -> str:
    """A throughput: thousands separators, decimals only below 10 (12,345 · 87 · 4.2 · 0.35)."""
    number = finite_number(value)
    if number is None:
        return fmt_text(value)
    magnitude = abs(number)
    digits = 0 if magnitude >= 10 else 1 if magnitude >= 1 else 2
    return f"{number:,.{digits}f}"


def fmt_auto(value: Any) -> str:
    """A measurement spanning orders of magnitude (bandwidths, latencies) with about three
    significant digits and no exponent: 12,345 · 467.5 · 20.97 · 0.0512."""
    number = finite_number(value)
    if number is None:
        return fmt_text(value)
    magnitude = abs(number)
    if magnitude >= 1000:
        return f"{number:,.0f}"
    if magnitude >= 100:
        return f"{number:.1f}"
    if magnitude >= 1 or magnitude == 0:
        return f"{number:.2f}"
    return f"{number:.3g}"


def fmt_sig(value: Any, digits: int = 4) -> str:
    number = finite_number(value)
    return fmt_text(value) if number is None else f"{number:.{digits}g}"


def fmt_percent(fraction: Any, digits: int = 1) -> str:
    """A fraction (0.931) as a percentage (93.1 %)."""
    number = finite_number(fraction)
    return fmt_text(fraction) if number is None else f"{100 * number:.{digits}f} %"


def fmt_percent_value(percent: Any, digits: int = 1) -> str:
    """A value that is already in percent (GPU utilisation 87.5) as "87.5 %"."""
    number = finite_number(percent)
    return fmt_text(percent) if number is None else f"{number:.{digits}f} %"


def fmt_gain(fraction: Any, digits: int = 1) -> str:
    """A relative change (0.25 = 25 % faster) with its sign: +25.0 %, −4.0 %."""
    number = finite_number(fraction)
    if number is None:
        return fmt_text(fraction)
    return f"{100 * number:+.{digits}f} %".replace("-", "−")


def fmt_ratio(value: Any) -> str:
    number = finite_number(value)
    return fmt_text(value) if number is None else f"{number:.2f}×"


def fmt_bytes(value: Any) -> str:
    """IEC units; whole multiples (message sizes) without decimals: 4 KiB, 1.5 GiB."""
    number = finite_number(value)
    if number is None:
        return fmt_text(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(number) < 1024 or unit == "PiB":
            break
        number /= 1024
    if unit == "B" or number.is_integer():
        return f"{number:,.0f} {unit}"
    return f"{number:,.1f} {unit}"


def fmt_milliseconds(seconds: Any) -> str:
    """Seconds shown in milliseconds, for a column whose header says (ms)."""
    number = finite_number(seconds)
    return fmt_text(seconds) if number is None else f"{number * 1e3:,.1f}"


# Column formats the table macro understands; the numeric ones are right-aligned.
FORMATS = {
    "text": fmt_text,
    "code": fmt_text,
    "badge": fmt_text,
    "int": fmt_int,
    "num0": lambda v: fmt_number(v, 0),
    "num1": lambda v: fmt_number(v, 1),
    "num2": lambda v: fmt_number(v, 2),
    "rate": fmt_rate,
    "auto": fmt_auto,
    "sig": fmt_sig,
    "pct": fmt_percent,
    "pctv": fmt_percent_value,
    "ratio": fmt_ratio,
    "gain": fmt_gain,
    "bytes": fmt_bytes,
    "ms": fmt_milliseconds,
    "flag": lambda v: MISSING if is_missing(v) else "noisy" if truthy(v) else "",  # the noisy-cell flag
}
TEXT_FORMATS = {"text", "code", "badge"}


def cell(row: Mapping[str, Any], key: str, fmt: str = "text") -> str:
    """One table cell as text. Three composite formats read several columns:
    ``span:<fmt>`` shows ``<key>_min``–``<key>_max``; ``ci:<fmt>`` shows ``<key>_low``–``<key>_high``
    (a 95 % interval, "—" without one); ``of`` shows ``<key>_ok`` / ``<key>_total``."""
    if fmt.startswith("span:"):
        inner = FORMATS[fmt.split(":", 1)[1]]
        low, high = row.get(f"{key}_min"), row.get(f"{key}_max")
        if is_missing(low) and is_missing(high):
            return MISSING
        if inner(low) == inner(high):
            return inner(low)  # one value (a single repeat): no spread to show
        return f"{inner(low)} – {inner(high)}"
    if fmt.startswith("ci:"):
        inner = FORMATS[fmt.split(":", 1)[1]]
        low, high = row.get(f"{key}_low"), row.get(f"{key}_high")
        if is_missing(low) or is_missing(high):
            return MISSING  # fewer than 2 repeats: no interval
        return f"{inner(low)} – {inner(high)}"
    if fmt == "of":
        done, total = row.get(f"{key}_ok"), row.get(f"{key}_total")
        return fmt_int(done) if is_missing(total) else f"{fmt_int(done)} / {fmt_int(total)}"
    return FORMATS[fmt](row.get(key))


def shown_columns(table_rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple], optional: Iterable[str] = ()) -> list:
    """``columns`` without the ``optional`` ones that no row has a value in (e.g. an all-empty
    ``note``), so a table does not carry a column of dashes that says nothing."""
    optional = set(optional)
    return [column for column in columns if column[0] not in optional or any(not is_missing(row.get(column[0])) for row in table_rows)]


def is_numeric_format(fmt: str) -> bool:
    return fmt not in TEXT_FORMATS


def css_token(value: Any) -> str:
    """A status as a CSS class suffix ("not measured" -> "not-measured"); only [a-z0-9-]."""
    text = fmt_text(value).lower()
    token = "".join(ch if ch.isalnum() else "-" for ch in text).strip("-")
    return token or "unknown"


def breakable(value: Any) -> markupsafe.Markup:
    """Escaped text that may wrap after its underscores (long run ids in narrow columns)."""
    return markupsafe.escape(fmt_text(value)).replace("_", markupsafe.Markup("_<wbr>"))


def label(key: str) -> str:
    """A snake_case key as a heading: units and precisions spelled out, the rest as written."""
    spelled = {
        "tflops": "TFLOP/s",
        "tbps": "TB/s",
        "gbps": "GB/s",
        "w": "W",
        "mhz": "MHz",
        "pct": "%",
        "gpus": "GPUs",
        "cpus": "CPUs",
        "id": "ID",
        "ids": "IDs",
    }
    upper = {"bf16", "fp16", "fp32", "tf32", "fp8", "hbm", "gpu", "cpu", "pci", "uuid", "cuda", "nccl", "numa"}
    return " ".join(spelled.get(word, word.upper() if word in upper else word) for word in str(key).split("_"))


# The formats by the names the templates call them (``{{ value | rate }}``, ``cell(row, key, fmt)``,
# ``value is missing``): make_environment registers these.
TEMPLATE_FILTERS = {
    "text": fmt_text,
    "int": fmt_int,
    "num": fmt_number,
    "rate": fmt_rate,
    "pct": fmt_percent,
    "ratio": fmt_ratio,
    "token": css_token,
    "breakable": breakable,
}
TEMPLATE_GLOBALS = {"cell": cell, "shown_columns": shown_columns, "is_numeric_format": is_numeric_format, "is_missing": is_missing, "MISSING": MISSING}
