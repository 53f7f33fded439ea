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


def render(rows: Sequence[dict[str, Any]], fmt: str = "md") -> str:
    if fmt == "json":
        return json.dumps(list(rows), indent=2, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    table = [[get(r) for _, get in COLUMNS] for r in rows]
    heads = [h for h, _ in COLUMNS]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(heads)
        w.writerows(table)
        return buf.getvalue()
    if fmt != "md":
        raise ValueError(f"unknown format {fmt!r}: md, csv or json")
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---:" if h in ("t/s", "GB/s", "% bw", "tok/J") else "---" for h in heads) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    return "\n".join(lines) + "\n"
