"""Feed lesson 09's verl export (the calculator task for verl's multi-turn agent loop) through verl's own code.
Runs in the verl venv, not the lesson venv.

Started by ``tests/side/test_verl_tools.py`` as ``<verl venv>/bin/python check_verl_tools.py spec.json out.json`` from a
scratch folder, with the export folder (``utils.verl_export.export_tool_task``) on ``sys.path`` as verl needs it.
``spec.json`` holds ``export_dir``, ``command`` (the ``main_ppo`` line with ``utils.verl_export.tool_overrides``),
``calls`` (argument dicts to execute) and ``hydra_dir``. With verl 0.9.1's functions:

1. ``verl.tools.tool_registry.initialize_tools_from_config`` builds the tools of ``tool_config.yaml``; each call of
   ``calls`` runs through the tool's ``create`` / ``execute`` / ``release`` (what ``ToolAgentLoop`` does per call).
2. ``verl.trainer.main_ppo.main`` parses and validates the command (``run_ppo`` replaced, as in check_verl.py).
3. ``verl.trainer.ppo.utils.create_rl_dataset`` reads the rows with the command's data config: each item keeps
   ``agent_name`` (which agent loop runs it) and ``extra_info.tools_kwargs`` (the tool's ``create_kwargs``).
"""
from __future__ import annotations

import asyncio
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_verl import overrides_of, plain, run_main_ppo  # noqa: E402


def main(spec_path: str, out_path: str) -> None:
    spec = json.load(open(spec_path))
    sys.path.insert(0, spec["export_dir"])
    out: dict = {}

    from verl.tools.tool_registry import initialize_tools_from_config

    tools = initialize_tools_from_config(os.path.join(spec["export_dir"], "tool_config.yaml"))
    out["tools"] = [{"class": f"{type(t).__module__}.{type(t).__name__}", "name": t.name,
                     "schema": t.tool_schema.model_dump(exclude_none=True)} for t in tools]

    async def run(tool, calls):
        iid, _ = await tool.create(create_kwargs={"ground_truth": "13"})
        results = []
        for call in calls:
            response, reward, metrics = await tool.execute(iid, call)
            results.append({"text": response.text, "reward": reward, "metrics": plain(metrics)})
        await tool.release(iid)
        return results

    out["results"] = asyncio.run(run(tools[0], spec["calls"]))

    config, out["runner"] = run_main_ppo(overrides_of(spec["command"]), spec["hydra_dir"])
    multi_turn = config.actor_rollout_ref.rollout.multi_turn
    out["multi_turn"] = plain(multi_turn)
    out["rollout_mode"] = config.actor_rollout_ref.rollout.mode

    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.config import omega_conf_to_dataclass

    tokenizer = omega_conf_to_dataclass(config.actor_rollout_ref.model).tokenizer
    ds = create_rl_dataset(config.data.train_files, config.data, tokenizer, None, is_train=True)
    out["items"] = [{"agent_name": ds[i].get("agent_name"), "tools_kwargs": plain(ds[i].get("tools_kwargs")),
                     "extra_info": plain(ds[i]["extra_info"]), "raw_prompt": plain(list(ds[i]["raw_prompt"]))}
                    for i in range(len(ds))]
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
