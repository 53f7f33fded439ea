"""Options shared by several commands, declared once."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout (for scripts).")]
ProfileOpt = Annotated[
    Optional[str],
    typer.Option("--profile", help="Hardware profile name (default: matched from the GPU). See `lucebox profiles`."),
]
OfflineOpt = Annotated[
    bool, typer.Option("--offline", help="Use only the local HF cache; never touch the network (like HF_HUB_OFFLINE=1).")
]
