"""The inner compiler: what compiles each piece, or the whole graph."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch._dynamo.backends.registry import lookup_backend

from goddp.options import Options


def resolve_inner(options: Options) -> Callable[..., Any]:
    """The callable that compiles one graph (a piece, or the whole graph)."""
    inner = options.inner
    if callable(inner) and not isinstance(inner, str):
        return inner
    if options.compile_mode is None and not options.inner_options:
        return lookup_backend(inner)
    # torch.compile(mode=...) and inner_options go to the inner backend the
    # way torch.compile itself would hand them over.
    if inner == "inductor" and hasattr(torch, "_TorchCompileInductorWrapper"):
        return torch._TorchCompileInductorWrapper(options.compile_mode, options.inner_options, None)
    if hasattr(torch, "_TorchCompileWrapper"):
        return torch._TorchCompileWrapper(inner, options.compile_mode, options.inner_options, None)
    return lookup_backend(inner)


def inner_name(inner: Any) -> str:
    """The inner compiler's name, for the plan record."""
    return inner if isinstance(inner, str) else getattr(inner, "__name__", repr(inner))
