"""Where a Dynamo graph came from: its frame, and the graph break that ended it.

Trainers break graphs of their own: Lightning's ``self.log`` is wrapped in
``torch.compiler.disable``, Hugging Face models hand back output objects and
losses through code Dynamo cannot trace. Each break leaves one more frame for
goddp to see. goddp names the frame in its plan log and in
``last_plans()[i]["frame"]``, so a user can tell the graph holding the model
from the small ones trainers leave behind.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import fx
from torch._dynamo.symbolic_convert import InstructionTranslator


@dataclass(frozen=True)
class FrameInfo:
    """frame: "function (file:line)" of the code Dynamo compiled; compile_id:
    Dynamo's "frame/recompile" id; graph_break: None when the graph ends
    with its frame, else the first line of Dynamo's reason; break_at:
    "function (file:line)" of the user code where it broke."""

    frame: str | None
    compile_id: str | None
    graph_break: str | None
    break_at: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        text = f"frame {self.frame or '?'}"
        if self.compile_id:
            text += f" [{self.compile_id}]"
        if self.graph_break:
            text += f", graph break at {self.break_at or '?'}: {self.graph_break}"
        return text


def _where(name: str, filename: str, lineno: int | None) -> str:
    return f"{name} ({os.path.basename(filename)}:{lineno})"


def frame_info(gm: fx.GraphModule) -> FrameInfo:
    """What Dynamo tells a backend about the graph being compiled; every
    field may be None when this torch keeps it elsewhere."""
    frame = compile_id = None
    try:
        tx = InstructionTranslator.current_tx()
        code = getattr(tx, "f_code", None)
        if code is not None:
            frame = _where(code.co_name, code.co_filename, code.co_firstlineno)
    except AttributeError:  # outside Dynamo (a test calling the backend by hand): no translator
        pass
    try:
        current = torch._guards.CompileContext.current_compile_id()
        compile_id = str(current) if current is not None else None
    except AttributeError:  # a torch that keeps the compile id elsewhere
        pass
    reason = getattr(gm, "compile_subgraph_reason", None)
    graph_break = break_at = None
    if reason is not None and getattr(reason, "graph_break", False):
        text = str(getattr(reason, "reason", "") or "").strip().splitlines()
        graph_break = text[0] if text else "graph break"
        stack = getattr(reason, "user_stack", None) or []
        if stack:
            # The outermost user frame: the line in the compiled frame's own
            # code (inner entries are inside the callee that broke).
            top = stack[0]
            break_at = _where(top.name, top.filename, top.lineno)
    return FrameInfo(frame, compile_id, graph_break, break_at)
