"""Feed our verl export through verl's own code. Runs in the verl venv, not the lesson venv.

Started by ``tests/side/test_verl.py`` as ``<verl venv>/bin/python check_verl.py spec.json out.json``
from a scratch folder (so that the repository's ``utils`` package is NOT importable: the reward
module must stand alone). ``spec.json`` holds:

* ``command``       the ``python -m verl.trainer.main_ppo ...`` line from ``utils.verl_export``
* ``more_commands`` further command lines whose keys are only checked (e.g. a LoRA/vLLM preset)
* ``validated_commands`` further command lines run through ``main`` like ``command`` (lesson 07's PPO with a
  critic and REINFORCE++), each with what verl derives from it: ``need_critic``, ``need_reference_policy``
* ``cases``         ``[{"data_source", "solution_str", "ground_truth", "extra_info"}, ...]`` to score
* ``hydra_dir``     a scratch folder for Hydra's run directory

What it does, each step with verl's own functions (verl 0.9.1):

1. ``verl.trainer.main_ppo.main`` (the Hydra entry point) parses the command's overrides, runs
   ``auto_set_device`` and ``validate_config``; only ``run_ppo`` (Ray, GPUs) is replaced by a
   function that keeps the config. Every override key is also looked up in
   ``verl/trainer/config/_generated_ppo_trainer.yaml``.
2. The tokenizer and HF config come from ``omega_conf_to_dataclass(config.actor_rollout_ref.model)``
   (what the trainer does); ``verl.trainer.ppo.utils.create_rl_dataset`` builds ``RLHFDataset``
   on ``data.train_files`` / ``data.val_files`` with ``config.data``; every item's prompt is
   tokenized by the Continuous Token builder the agent loop uses
   (``verl.utils.tokenizer.continuous_token_wiring.create_continuous_token_builder``).
3. ``verl.trainer.ppo.reward.get_custom_reward_fn(config)`` loads our reward module by path and
   scores ``cases``; ``load_reward_manager(config, tokenizer)`` (the ``naive`` manager) scores
   the same completions from token ids in a ``DataProto`` built from the dataset's own items.

Everything found is written to ``out.json``; the test compares it with the lesson venv.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import time


def flatten_keys(cfg, prefix=""):
    """All dotted keys of an OmegaConf tree (dicts only; list items are values)."""
    from omegaconf import OmegaConf

    keys = set()
    for k in cfg.keys():
        key = f"{prefix}{k}"
        keys.add(key)
        v = cfg._get_node(k)
        if OmegaConf.is_dict(v):
            keys |= flatten_keys(v, key + ".")
    return keys


def overrides_of(command: str) -> list[str]:
    """The Hydra overrides of a ``python -m verl.trainer.main_ppo ...`` line, as bash would split it."""
    argv = shlex.split(command.replace("\\\n", " "))  # bash drops backslash-newline continuations
    assert argv[1:3] == ["-m", "verl.trainer.main_ppo"], argv[:3]
    return argv[3:]


def run_main_ppo(overrides: list[str], hydra_dir: str):
    """verl's Hydra entry point on our overrides, up to (not into) ``run_ppo``; returns the config."""
    import verl.trainer.main_ppo as main_ppo

    captured = {}

    def keep_config(config, task_runner_class):
        captured["config"] = config
        captured["runner"] = getattr(task_runner_class, "__name__", str(task_runner_class))

    main_ppo.run_ppo = keep_config
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()       # main may run more than once in this process
    argv = sys.argv
    sys.argv = ["main_ppo.py", *overrides, f"hydra.run.dir={hydra_dir}", "hydra.output_subdir=null",
                "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    try:
        main_ppo.main()
    finally:
        sys.argv = argv
    if "config" not in captured:
        raise RuntimeError("verl.trainer.main_ppo.main did not reach run_ppo")
    return captured["config"], captured["runner"]


def compose(overrides: list[str]):
    """verl's ``ppo_trainer`` config composed with ``overrides`` (no validation)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module("verl.trainer.config", version_base=None):
        return hydra_compose("ppo_trainer", overrides=overrides)


def plain(x):
    """numpy / OmegaConf values as JSON-able Python."""
    import numpy as np
    from omegaconf import OmegaConf

    if OmegaConf.is_config(x):
        return OmegaConf.to_container(x, resolve=True)
    if isinstance(x, np.ndarray):
        return [plain(v) for v in x.tolist()]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


def main(spec_path: str, out_path: str) -> None:
    t0 = time.time()
    spec = json.load(open(spec_path))
    out: dict = {}

    import torch
    import transformers
    import verl
    from omegaconf import OmegaConf

    out["verl_version"] = verl.__version__
    out["transformers_version"] = transformers.__version__

    # ---------------------------------------------------------------- 1. the command
    generated = OmegaConf.load(os.path.join(os.path.dirname(verl.__file__),
                                            "trainer/config/_generated_ppo_trainer.yaml"))
    known = flatten_keys(generated)
    overrides = overrides_of(spec["command"])
    out["override_keys"] = [o.split("=", 1)[0] for o in overrides]
    out["missing_keys"] = [k for k in out["override_keys"] if k not in known]
    config, runner = run_main_ppo(overrides, spec["hydra_dir"])
    out["runner"] = runner
    out["config"] = {k: plain(OmegaConf.select(config, k)) for k in out["override_keys"]}
    out["more_commands"] = []
    for command in spec.get("more_commands", []):
        ov = overrides_of(command)
        keys = [o.split("=", 1)[0] for o in ov]
        composed = compose(ov)
        out["more_commands"].append({
            "missing_keys": [k for k in keys if k not in known],
            "config": {k: plain(OmegaConf.select(composed, k)) for k in keys},
        })

    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    out["validated_commands"] = []
    for command in spec.get("validated_commands", []):
        ov = overrides_of(command)
        keys = [o.split("=", 1)[0] for o in ov]
        validated, validated_runner = run_main_ppo(ov, spec["hydra_dir"])
        out["validated_commands"].append({
            "missing_keys": [k for k in keys if k not in known],
            "runner": validated_runner,
            "need_critic": need_critic(validated),
            "need_reference_policy": bool(need_reference_policy(validated)),
            "config": {k: plain(OmegaConf.select(validated, k)) for k in keys},
        })

    # ---------------------------------------------------------------- 2. the data
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.dataset.rl_dataset import collate_fn
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    tokenizer = model_config.tokenizer
    model_type = getattr(model_config.hf_config, "model_type", None)
    builder = create_continuous_token_builder(
        tokenizer, hf_model_type=model_type,
        chat_template_kwargs=config.data.get("apply_chat_template_kwargs", {}))
    out["model_type"] = model_type
    out["builder"] = type(builder).__name__

    built, out["data"] = {}, {}
    for split, files, is_train, max_key in (("train", config.data.train_files, True, "train_max_samples"),
                                            ("test", config.data.val_files, False, "val_max_samples")):
        ds = create_rl_dataset(files, config.data, tokenizer, None, is_train=is_train,
                               max_samples=config.data.get(max_key, -1))
        built[split] = ds
        items = []
        for i in range(len(ds)):
            item = ds[i]
            ids = builder.build_initial_tokens(list(item["raw_prompt"]))
            items.append({
                "keys": sorted(item.keys()),
                "raw_prompt": plain(list(item["raw_prompt"])),
                "data_source": item["data_source"],
                "ability": item.get("ability"),
                "reward_model": plain(item["reward_model"]),
                "extra_info": plain(item["extra_info"]),
                "index": plain(item["index"]),
                "prompt_ids": [int(t) for t in ids],
                "prompt_text": tokenizer.decode(ids),
            })
        out["data"][split] = {"class": type(ds).__name__, "len": len(ds), "items": items}

    # ---------------------------------------------------------------- 3. the reward
    from verl import DataProto
    from verl.trainer.ppo.reward import get_custom_reward_fn, load_reward_manager

    fn = get_custom_reward_fn(config)
    out["reward_fn"] = repr(fn)[:200]
    out["scores"] = [fn(**case) for case in spec["cases"]]

    # The naive reward manager, as the trainer's reward loop calls it: one DataProto row per
    # (test item, completion), built from the dataset's own items plus tokenized responses.
    manager = load_reward_manager(config, tokenizer)
    out["reward_manager"] = type(manager).__name__
    ds = built["test"]
    rows, responses = [], []
    for i in range(len(ds)):
        for template in spec["manager_templates"]:
            text = template.format(ground_truth=ds[i]["reward_model"]["ground_truth"])
            rows.append(ds[i])
            responses.append(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
    batch = collate_fn(rows)
    pad = tokenizer.pad_token_id
    prompts = [builder.build_initial_tokens(list(r["raw_prompt"])) for r in rows]
    p_len, r_len = max(map(len, prompts)), max(map(len, responses))
    prompt_t = torch.tensor([[pad] * (p_len - len(p)) + p for p in prompts])             # left-padded
    response_t = torch.tensor([r + [pad] * (r_len - len(r)) for r in responses])         # right-padded
    mask = torch.tensor([[0] * (p_len - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (r_len - len(r))
                         for p, r in zip(prompts, responses)])
    non_tensors = {k: v for k, v in batch.items() if not isinstance(v, torch.Tensor)}
    dp = DataProto.from_dict(
        tensors={"prompts": prompt_t, "responses": response_t, "attention_mask": mask,
                 "input_ids": torch.cat([prompt_t, response_t], dim=1)},
        non_tensors=non_tensors)
    results = [manager.loop.run_until_complete(manager.run_single(dp[j:j + 1])) for j in range(len(dp))]
    out["manager_scores"] = [float(r["reward_score"]) for r in results]
    out["manager_ground_truths"] = [r["reward_model"]["ground_truth"] for r in rows]
    # the texts the manager scored: it decodes the valid response ids with skip_special_tokens=True
    out["manager_response_texts"] = [tokenizer.decode(r, skip_special_tokens=True) for r in responses]
    out["seconds"] = round(time.time() - t0, 2)

    with open(out_path, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
