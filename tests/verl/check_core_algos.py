"""Run verl 0.9.1's own PPO / REINFORCE++ functions on given tensors. Runs in the verl venv, not the lesson venv.

Started by ``tests/side/test_verl.py`` as ``<verl venv>/bin/python check_core_algos.py spec.json out.json`` from a
scratch folder (the repository's ``utils`` is not importable here, so nothing of ours is compared with
itself). ``spec.json`` holds the inputs as nested lists of floats; ``out.json`` gets verl's outputs:

* ``gae``: ``core_algos.compute_gae_advantage_return`` (whitened advantages, returns)
* ``reinforce_pp``: ``core_algos.compute_reinforce_plus_plus_outcome_advantage`` with ``AlgoConfig(gamma)``
* ``grpo``, ``rloo``: ``core_algos.compute_grpo_outcome_advantage`` (std-normalised, verl's epsilon) and
  ``compute_rloo_outcome_advantage`` on the given groups (``index``)
* ``low_var_kl``: ``core_algos.kl_penalty(..., "low_var_kl")``, the k3 estimate of GRPO's KL loss
* ``value_loss``: ``core_algos.compute_value_loss`` (loss, clipfrac)
* ``policy_loss``: ``core_algos.compute_policy_loss_vanilla`` with an ``FSDPActorConfig`` (loss, metrics)
* ``kl_in_reward``: ``apply_kl_penalty`` from ``verl/trainer/ppo/ray_trainer.py`` on a ``DataProto`` with
  a fixed KL controller. That module imports torchdata and peft, which the verl venv leaves out, so
  the function's own source is compiled from the file (``ast``) with the names it uses.
* ``whiten``, ``entropy``: ``verl.utils.torch_functional.masked_whiten`` and ``entropy_from_logits``
"""
from __future__ import annotations

import ast
import json
import sys
from pathlib import Path


def load_apply_kl_penalty():
    """verl's ``apply_kl_penalty``, compiled from ray_trainer.py's source with the globals it reads."""
    import torch
    import verl.trainer.ppo as ppo_pkg
    from verl import DataProto
    from verl.trainer.ppo import core_algos
    from verl.utils.torch_functional import masked_mean

    path = Path(ppo_pkg.__file__).parent / "ray_trainer.py"
    tree = ast.parse(path.read_text())
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "apply_kl_penalty"]
    namespace = {"core_algos": core_algos, "DataProto": DataProto, "masked_mean": masked_mean, "torch": torch}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["apply_kl_penalty"], str(path)


def main(spec_path: str, out_path: str) -> None:
    import numpy as np
    import torch
    import verl
    from verl import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos
    from verl.utils import torch_functional as verl_F
    from verl.workers.config import FSDPActorConfig

    spec = json.loads(Path(spec_path).read_text())
    t = {k: torch.tensor(v, dtype=torch.float32) for k, v in spec["tensors"].items()}
    mask = t["mask"]
    out = {"verl_version": verl.__version__}

    adv, ret = core_algos.compute_gae_advantage_return(t["token_level_rewards"], t["values"], mask,
                                                       spec["gamma"], spec["lam"])
    out["gae"] = {"advantages": adv.tolist(), "returns": ret.tolist()}

    adv, ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        t["token_level_rewards"], mask, config=AlgoConfig(gamma=spec["gamma"]))
    out["reinforce_pp"] = {"advantages": adv.tolist(), "returns": ret.tolist()}

    index = np.array(spec["index"])
    rewards = t["token_level_rewards"] * mask                  # as the trainer builds them: 0 off the response
    adv, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, index, epsilon=spec["grpo_epsilon"])
    out["grpo"] = adv.tolist()
    adv, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, index, config=AlgoConfig())
    out["rloo"] = adv.tolist()
    out["low_var_kl"] = core_algos.kl_penalty(t["logps"], t["ref_logps"], "low_var_kl").tolist()

    loss, clipfrac = core_algos.compute_value_loss(t["vpreds"], t["returns"], t["values"], mask,
                                                   cliprange_value=spec["cliprange_value"])
    out["value_loss"] = {"loss": loss.item(), "clipfrac": clipfrac.item()}

    actor = FSDPActorConfig(strategy="fsdp", clip_ratio=spec["clip_ratio_low"], clip_ratio_low=spec["clip_ratio_low"],
                            clip_ratio_high=spec["clip_ratio_high"], clip_ratio_c=spec["clip_ratio_c"],
                            ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, rollout_n=1)
    loss, metrics = core_algos.compute_policy_loss_vanilla(t["old_logps"], t["logps"], t["advantages"], mask,
                                                           loss_agg_mode="token-mean", config=actor)
    out["policy_loss"] = {"loss": loss.item(), **{k.split("/")[-1]: v for k, v in metrics.items()}}

    apply_kl_penalty, where = load_apply_kl_penalty()
    batch = DataProto.from_dict(tensors={"response_mask": mask, "token_level_scores": t["token_level_scores"],
                                         "old_log_probs": t["old_logps"], "ref_log_prob": t["ref_logps"]})
    batch, metrics = apply_kl_penalty(batch, core_algos.FixedKLController(kl_coef=spec["beta"]), kl_penalty="kl")
    out["kl_in_reward"] = {"token_level_rewards": batch.batch["token_level_rewards"].tolist(),
                           "kl": metrics["actor/reward_kl_penalty"], "source": where}

    out["whiten"] = verl_F.masked_whiten(t["values"], mask).tolist()
    out["whiten_keep_mean"] = verl_F.masked_whiten(t["values"], mask, shift_mean=False).tolist()
    out["entropy"] = verl_F.entropy_from_logits(t["logits"]).tolist()
    Path(out_path).write_text(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:3])
