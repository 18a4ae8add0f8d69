"""Lesson 09's scale-out: the calculator task for verl's multi-turn agent loop, accepted by verl's own code.

The fast tests check ``utils.verl_export.export_tool_task`` / ``tool_overrides`` in the lesson venv; the ``slow``
one runs ``tests/verl/check_verl_tools.py`` in the verl venv (``tests/side/test_verl.py`` builds it): verl 0.9.1's tool
registry builds the calculator from the exported tool config and runs calls through it, ``main_ppo`` accepts the
multi-turn overrides, and ``RLHFDataset`` reads the rows with their ``agent_name`` and tool arguments.
verl's ``ToolAgentLoop`` itself is not run: it needs an inference server (uvicorn, fastapi) the venv leaves out.
"""
from __future__ import annotations

import json
import re
import subprocess

import pyarrow.parquet as pq
import pytest

from tests.side.test_verl import INSTALL_TIMEOUT, REQUIREMENTS, VERL_DIR, verl_env
from utils import data, verl_export
from utils.constants import TINY_MODEL_DIR as TINY
from utils.tools import calculator

CHECKER = VERL_DIR / "check_verl_tools.py"
CALLS = [{"expression": "63 + 28"}, {"expression": "91 / 7"}, {"expression": "__import__('os')"},
         {"expression": "1 / 0"}, {"expr": "1 + 1"}, {"expression": "9" * 200}]


def export(tmp_path):
    train, test = data.make_problems(6, "train", seed=3), data.make_problems(3, "test", seed=3)
    return train, test, verl_export.export_tool_task(train, test, tmp_path / "export",
                                                     data_source=verl_export.SYNTHETIC_SOURCE)


def test_tool_rows_config_and_overrides(tmp_path):
    train, _, paths = export(tmp_path)
    assert set(paths) == {"train", "test", "reward", "tool_config", "calculator", "calculator_tool"}
    rows = pq.read_table(paths["train"]).to_pylist()
    assert [r["agent_name"] for r in rows] == [verl_export.TOOL_AGENT] * len(train)
    assert [r["extra_info"]["tools_kwargs"]["calculator"]["create_kwargs"]["ground_truth"] for r in rows] == \
        [data.final_answer(p["answer"]) for p in train]
    config = json.loads(paths["tool_config"].read_text())
    (tool,) = config["tools"]
    assert tool["class_name"] == "calculator_tool.CalculatorTool"
    assert tool["tool_schema"]["function"]["name"] == "calculator"
    assert tool["tool_schema"]["function"]["parameters"]["required"] == ["expression"]
    assert paths["calculator"].read_text() == (verl_export.TOOL_FILE).read_text()
    ov = verl_export.tool_overrides(tmp_path / "export", max_assistant_turns=8)
    assert ov["actor_rollout_ref.rollout.multi_turn.tool_config_path"] == str(paths["tool_config"].resolve())
    assert ov["actor_rollout_ref.rollout.multi_turn.max_assistant_turns"] == 8
    # verl runs only the first max_parallel_calls calls of a turn (its default: 1); TRL and the lesson run them all
    assert ov["actor_rollout_ref.rollout.multi_turn.max_parallel_calls"] >= 4
    # verl cuts a tool text longer than the cap in its middle: no message of the calculator is that long
    cap = ov["actor_rollout_ref.rollout.multi_turn.max_tool_response_length"]
    worst = ["x" * 100, "\x00" + "1" * 99, "1 " + "9" * 98, "9" * 13, "(" * 11 + "1", "1+" * 60, "0.0000004", None,
             "-" * 99 + "1", "1/0", "999999 * 999999 * 999999", "1 " + "." + "9" * 97]
    assert all(len(calculator(w)) <= cap for w in worst), max(worst, key=lambda w: len(calculator(w)))
    wrapper = (verl_export.TOOL_CLASS_FILE).read_text()
    messages = re.findall(r"""(["'])(error: .*?)\1""", wrapper)
    assert messages and all(len(m) <= cap for _, m in messages), "the verl wrapper's own messages"


@pytest.fixture(scope="module")
def verl_tools(side_python, tmp_path_factory):
    python = side_python("verl", REQUIREMENTS, INSTALL_TIMEOUT)
    tmp = tmp_path_factory.mktemp("verl-tools")
    train, test, paths = export(tmp)
    command = verl_export.main_ppo_command(str(TINY), tmp / "export", n_gpus=1, train_batch_size=4, num_generations=4,
                                           micro_batch_size_per_gpu=2, max_prompt_length=128, max_response_length=160,
                                           extra=verl_export.tool_overrides(tmp / "export", max_assistant_turns=8))
    spec = {"export_dir": str(tmp / "export"), "command": command, "calls": CALLS, "hydra_dir": str(tmp / "hydra")}
    (tmp / "spec.json").write_text(json.dumps(spec))
    (tmp / "work").mkdir()
    proc = subprocess.run([str(python), str(CHECKER), str(tmp / "spec.json"), str(tmp / "out.json")], cwd=tmp / "work",
                          env=verl_env(), capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"check_verl_tools.py failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}",
                    pytrace=False)
    return {"out": json.loads((tmp / "out.json").read_text()), "train": train}


@pytest.mark.slow
def test_verl_builds_the_calculator_and_runs_calls_like_the_lesson(verl_tools):
    out = verl_tools["out"]
    (tool,) = out["tools"]
    assert tool["class"] == "calculator_tool.CalculatorTool" and tool["name"] == "calculator"
    texts = [r["text"] for r in out["results"]]
    for call, text in zip(CALLS, texts):
        if "expression" in call:
            assert text == calculator(call["expression"]), (call, text)   # the very parser of the TRL lesson
    assert texts[:2] == ["91", "13"] and all(t.startswith("error: ") for t in texts[2:])
    assert "expression" in texts[4], "a wrong argument name is told the right one"
    assert [r["metrics"]["error"] for r in out["results"]] == [False, False, True, True, True, True]


@pytest.mark.slow
def test_verl_main_ppo_takes_the_multi_turn_overrides(verl_tools):
    out = verl_tools["out"]
    assert out["rollout_mode"] == "async"
    mt = out["multi_turn"]
    assert mt["enable"] is True and mt["format"] == "hermes" and mt["max_assistant_turns"] == 8
    assert mt["tool_config_path"].endswith("tool_config.yaml")
    assert mt["max_parallel_calls"] == 8 and mt["max_tool_response_length"] == 256, "verl takes the exported values"


@pytest.mark.slow
def test_verl_dataset_keeps_agent_name_and_tool_arguments(verl_tools):
    items, train = verl_tools["out"]["items"], verl_tools["train"]
    assert len(items) == len(train)
    for item, p in zip(items, train):
        assert item["agent_name"] == "tool_agent"
        assert item["tools_kwargs"] == {"calculator": {"create_kwargs": {"ground_truth": data.final_answer(p["answer"])}}}
        assert item["raw_prompt"][-1] == {"role": "user", "content": p["question"]}
