"""Run configuration (and, below, hardware profiles).

RunConfig is resolved once — CLI > LUCEBOX_* environment > profile run defaults > built-in defaults —
then frozen; `-v` prints it and bench JSON embeds it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class RunConfig:
    model: str
    engine: str = "auto"  # auto | cpu | cuda
    profile: Optional[str] = None  # None: matched from the GPU
    max_tokens: int = 128
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int = 0
    chat: bool = False
    thinking: bool = False
    stop_at_eos: bool = True
    draft: Optional[str] = None  # alias | folder | .gguf | replay[:RATE]
    spec: str = "none"  # none | chain | ddtree
    budget: int = 22  # DDTree node budget (excluding the root)
    max_context: int = 4096

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)
