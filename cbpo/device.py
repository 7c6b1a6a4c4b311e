"""Device and precision settings (``device``, ``dtype`` in configs/config.yaml), read by both
backends and by evaluation."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads on first use: the Snakefile reads DEVICES/DTYPES through cbpo.schema
    import torch

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16")


def check(device: str, dtype: str) -> None:
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def resolve_device(device: str) -> torch.device:
    """``auto`` is the GPU when one is visible; ``cuda`` without one is an error rather than a
    silent CPU run that would take days."""
    import torch

    check(device, "auto")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda but torch sees no CUDA GPU (use device=auto or device=cpu)")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The compute dtype of forward passes. ``auto`` is bfloat16 on a GPU that supports it and
    float32 elsewhere (CPU bf16 matmuls are slower than fp32 on most CPUs)."""
    import torch

    check("auto", dtype)
    if dtype == "auto":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if bf16 else torch.float32
    return getattr(torch, dtype)


def autocast(device: torch.device, dtype: torch.dtype):
    """Forward passes in ``dtype`` while weights and AdamW's state stay float32: an update of
    lr 1e-6 times a unit-scale step is below bfloat16's resolution of a weight near 1, so pure
    bf16 weights would not move."""
    import torch

    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
