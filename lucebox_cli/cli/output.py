"""Human and --json output. Data goes to stdout; progress, stats and errors go to stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console


def stderr_console() -> Console:
    """Console for progress bars, stats lines and errors (never mixes with stdout data)."""
    return Console(stderr=True, highlight=False)


def stdout_console() -> Console:
    return Console(highlight=False)


def print_json(obj: Any) -> None:
    """One JSON document on stdout, nothing else (scripts parse it)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default) + "\n")
    sys.stdout.flush()


def _json_default(obj: Any) -> Any:
    # numpy scalars/arrays and dataclasses show up in results; keep the CLI free of numpy imports.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(obj)
    if hasattr(obj, "__fspath__"):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
