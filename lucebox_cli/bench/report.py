"""Bench rows rendered as a Markdown table, CSV or JSON (llama-bench style).

A row is a dict; COLUMNS name the human columns and how to format them. JSON keeps every key (raw
samples, GPU, commit, resolved config); md/csv show the columns alone.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Callable, Sequence


def _num(fmt: str) -> Callable[[Any], str]:
    return lambda v: "–" if v is None else format(v, fmt)


def _rate(row: dict[str, Any]) -> str:
    return f"{row['tok_s']:,.2f} ± {row['sd']:,.2f}"


# (header, getter(row) -> str)
COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("model", lambda r: str(r.get("model", "")) + (" (random weights)" if r.get("random_weights") else "")),
    ("size", lambda r: _num(".2f")(r.get("size_gib")) + " GiB"),
    ("params", lambda r: _num(".1f")(r.get("params_m")) + " M"),
    ("profile", lambda r: str(r.get("profile") or "–")),
    ("engine", lambda r: str(r.get("engine", ""))),
    ("test", lambda r: str(r.get("test", ""))),
    ("t/s", _rate),
    ("GB/s", lambda r: _num(".0f")(r.get("gbps"))),
    ("% bw", lambda r: _num(".1f")(r.get("pct_bw"))),
    ("tok/J", lambda r: _num(".2f")(r.get("tok_per_j"))),
]


def _spec(row: dict[str, Any]) -> str:
    mode = row.get("spec") or "none"
    if mode == "none":
        return "AR"
    budget = f" B={row['budget']}" if row.get("budget") is not None else ""
    return f"{mode}{budget} ({row.get('draft')})"


def _suite_rate(row: dict[str, Any]) -> str:
    # a per-prompt row is one measurement: no spread to show
    return _rate(row) if row.get("prompt") == "mean" else f"{row['tok_s']:,.2f}"


# suite rows (bench/suites.py): one per prompt and mode, then a mean row per mode
SUITE_COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("model", lambda r: str(r.get("model", ""))),
    ("engine", lambda r: str(r.get("engine", ""))),
    ("suite", lambda r: str(r.get("suite", ""))),
    ("prompt", lambda r: str(r.get("prompt", ""))),
    ("spec", _spec),
    ("tokens", lambda r: str(r.get("generated", ""))),
    ("t/s", _suite_rate),
    ("AL", lambda r: _num(".2f")(r.get("al"))),
    ("speedup", lambda r: _num(".2f")(r.get("speedup")) + "×"),
    ("= AR", lambda r: "yes" if r.get("matches_ar") else "NO"),
]
_NUMERIC = ("t/s", "GB/s", "% bw", "tok/J", "tokens", "AL", "speedup")


def render(rows: Sequence[dict[str, Any]], fmt: str = "md", columns=None) -> str:
    """Rows as md / csv (the `columns`, COLUMNS by default) or json (every key)."""
    if fmt == "json":
        return json.dumps(list(rows), indent=2, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    columns = COLUMNS if columns is None else columns
    table = [[get(r) for _, get in columns] for r in rows]
    heads = [h for h, _ in columns]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(heads)
        w.writerows(table)
        return buf.getvalue()
    if fmt != "md":
        raise ValueError(f"unknown format {fmt!r}: md, csv or json")
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---:" if h in _NUMERIC else "---" for h in heads) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    return "\n".join(lines) + "\n"
