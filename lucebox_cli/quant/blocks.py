"""Block formats of the ggml types lucebox writes: ids, block sizes, byte layouts, bits per weight.

Layouts (little-endian, one block after another along a row; a row is `cols / block` blocks):
  Q8_0  (32 weights, 34 B):  d fp16 | qs int8[32]
  Q4_0  (32 weights, 18 B):  d fp16 | qs u8[16]            (low nibble j, high nibble j+16)
  Q5_0  (32 weights, 22 B):  d fp16 | qh u32 | qs u8[16]   (qh bit j = 5th bit of weight j)
  Q5_1  (32 weights, 24 B):  d fp16 | m fp16 | qh u32 | qs u8[16]
  Q4_K (256 weights, 144 B): d fp16 | dmin fp16 | scales u8[12] (8 × 6-bit scale + 8 × 6-bit min) | qs u8[128]
  Q5_K (256 weights, 176 B): d fp16 | dmin fp16 | scales u8[12] | qh u8[32] | qs u8[128]
  Q6_K (256 weights, 210 B): ql u8[128] | qh u8[64] | scales int8[16] | d fp16
"""

from __future__ import annotations

from dataclasses import dataclass

from lucebox_cli.errors import UsageError

QK_K = 256


@dataclass(frozen=True)
class BlockType:
    name: str
    ggml_type: int  # GGMLQuantizationType value
    block: int  # weights per block
    nbytes: int  # bytes per block

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.nbytes / self.block

    def row_bytes(self, cols: int) -> int:
        if cols % self.block:
            raise ValueError(f"{self.name} needs rows of a multiple of {self.block} weights, got {cols}")
        return cols // self.block * self.nbytes


# ggml type ids are fixed by the GGUF format (ggml.h enum ggml_type)
TYPES: dict[str, BlockType] = {
    t.name: t
    for t in (
        BlockType("F32", 0, 1, 4),
        BlockType("F16", 1, 1, 2),
        BlockType("Q4_0", 2, 32, 18),
        BlockType("Q4_1", 3, 32, 20),
        BlockType("Q5_0", 6, 32, 22),
        BlockType("Q5_1", 7, 32, 24),
        BlockType("Q8_0", 8, 32, 34),
        BlockType("Q4_K", 12, QK_K, 144),
        BlockType("Q5_K", 13, QK_K, 176),
        BlockType("Q6_K", 14, QK_K, 210),
        BlockType("BF16", 30, 1, 2),
    )
}
BY_ID: dict[int, BlockType] = {t.ggml_type: t for t in TYPES.values()}


def block_type(name_or_id: str | int) -> BlockType:
    """Look a type up by name ('Q4_K') or ggml id (12)."""
    if isinstance(name_or_id, str):
        found = TYPES.get(name_or_id.upper())
    else:
        found = BY_ID.get(int(name_or_id))
    if found is None:
        raise UsageError(f"unknown tensor type {name_or_id!r}", hint=f"known: {', '.join(TYPES)}")
    return found


def is_quantized(name: str) -> bool:
    """Block-quantized (not a plain float type)."""
    return block_type(name).block > 1
