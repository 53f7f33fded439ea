"""Options shared by several commands, declared once."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from lucebox_cli.errors import UsageError

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout (for scripts).")]
ProfileOpt = Annotated[
    Optional[str],
    typer.Option("--profile", help="Hardware profile name (default: matched from the GPU). See `lucebox profiles`."),
]
OfflineOpt = Annotated[
    bool, typer.Option("--offline", help="Use only the local HF cache; never touch the network (like HF_HUB_OFFLINE=1).")
]


def check_choice(flag: str, value: Optional[str], choices: tuple[str, ...]) -> None:
    """A one-line UsageError when an option given as text is not one of `choices` (None: not given)."""
    if value is not None and value not in choices:
        raise UsageError(f"{flag} {value!r} is not one of: {', '.join(choices)}")


# --prefill-weights of run and bench speed (RunConfig.prefill_weights)
PREFILL_WEIGHTS_CHOICES = ("q", "f16")
PREFILL_WEIGHTS_HELP = ("27B GGUF engine: what its cuBLAS prefill passes read, q (dequantize each pass) or f16 (fp16 "
                        "copies made once at load: faster prefill for 2 B a weight of GPU memory, 48.7 GB on the 27B). "
                        "Other engines ignore it.")
