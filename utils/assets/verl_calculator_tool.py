"""The course's calculator as a verl 0.9.1 tool (lesson 09's scale-out; written next to the data by
``utils.verl_export.export_tool_task``, never imported by the lessons: it needs verl).

verl's ``ToolAgentLoop`` builds it from the tool config (``class_name: calculator_tool.CalculatorTool``;
the export folder must be on ``PYTHONPATH``) and, for every call the model makes, runs ``create``,
``execute`` and ``release`` on a fresh instance. ``calculator.py`` beside it is a copy of
``utils/tools.py`` (standard library only): the same parser the TRL lesson calls.
"""
from __future__ import annotations

from typing import Any
from uuid import uuid4

from calculator import calculator
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse


class CalculatorTool(BaseTool):
    """``execute`` returns the calculator's text (a result, or ``"error: ..."``), a step reward of 0.0 (the
    reward is the final answer's, as in the lesson) and ``{"error": bool}`` as the call's metrics."""

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        if isinstance(parameters, dict) and "expression" in parameters:
            text = calculator(parameters["expression"])
        else:   # the model named the argument wrongly: say which one the tool takes
            text = 'error: the calculator takes one argument, "expression", e.g. {"expression": "63 + 28"}'
        return ToolResponse(text=text), 0.0, {"error": text.startswith("error: ")}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        return None   # the calculator keeps no state per instance
