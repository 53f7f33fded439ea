"""lucebox: single-GPU inference of Qwen3.5/3.6 hybrid models."""

__version__ = "0.1.0"
