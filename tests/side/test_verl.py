"""Scale-out to verl: our parquet, reward module and main_ppo command, accepted by verl's own code.

The fast tests check ``utils.verl_export`` in the lesson venv. The ``slow`` ones build a second
virtual environment outside the repository, ``~/.cache/post-training-course/verl-venv/`` (reused while its stamp matches
``tests/verl/requirements.txt``), with verl and the few libraries its data and reward code
import, and run ``tests/verl/check_verl.py`` there: verl's ``main_ppo`` entry point parses and
validates our command, verl's ``RLHFDataset`` loads our parquet with the tiny model's tokenizer,
and verl's custom-reward loading and reward manager score completions exactly as the TRL
rewards of the GRPO lesson do. If the verl venv cannot be installed the tests FAIL (no skip).
Set ``VERL_VENV=/path`` to keep the venv elsewhere.
"""
from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from utils import data, ppo, rewards, rl, verl_export
from utils.constants import REPO_ROOT as ROOT
from utils.constants import TINY_MODEL_DIR as TINY
from utils.course import speed

VERL_DIR = ROOT / "tests" / "verl"
REQUIREMENTS = VERL_DIR / "requirements.txt"
CHECKER = VERL_DIR / "check_verl.py"
INSTALL_TIMEOUT = 1500   # seconds; about 35-60 s on 2 cores
CHECK_TIMEOUT = 300      # seconds; about 8 s

N_TRAIN, N_TEST = 6, 3
# Completions scored by verl's loaded compute_score and by our TRL rewards; {gt} is the problem's
# final answer, {wrong} another number, {answer} the reference worked answer.
COMPLETIONS = [
    "{answer}",                                         # correct, well formatted
    "Let me add them up: the answer is {gt}.",          # correct, loose format
    "Some working.\n#### {wrong}",                      # wrong, well formatted
    "I think it is {wrong}",                            # wrong, loose
    "Some working.\n#### {gt}\nQuestion: and then?\n#### {wrong}",  # rambles past its answer
    "#### banana",                                      # garbage
    "",                                                 # empty
    "\u6570\u5b66 \u2212 \U0001F600 " * 20_000 + "\n#### {gt}",     # huge unicode, then the answer
]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # as presets
# Completions pushed through verl's reward manager as token ids ({ground_truth} from the row).
MANAGER_TEMPLATES = ["Adding up.\n#### {ground_truth}", "It is {ground_truth}.",
                     "Adding up.\n#### 100000", "no idea"]


# Lesson 07's scale-out: PPO with a critic, REINFORCE++ and RLOO with the KL in the reward, GRPO with it in the loss.
LESSON07_COMMON = dict(n_gpus=1, train_batch_size=4, micro_batch_size_per_gpu=2, max_prompt_length=128,
                       max_response_length=96, learning_rate=1e-6, epochs=1, kl_coef=0.05)
LESSON07_COMMANDS = {
    "gae": dict(adv_estimator="gae", num_generations=1, gamma=1.0, lam=0.95, critic_learning_rate=1e-5,
                cliprange_value=0.5, entropy_coeff=0.001, critic_warmup=2, experiment_name="ppo"),
    "reinforce_plus_plus": dict(adv_estimator="reinforce_plus_plus", num_generations=4, gamma=1.0,
                                experiment_name="reinforce-pp"),
    "rloo": dict(adv_estimator="rloo", num_generations=4, experiment_name="rloo"),
    "grpo": dict(adv_estimator="grpo", num_generations=4, experiment_name="grpo", kl_coef=0.0, beta=0.05),
}


# ----------------------------------------------------------------------------- helpers
def trl_reward(completion: str, answer: str) -> float:
    """What GRPOTrainer(reward_funcs=[correctness_reward, format_reward]) gives one completion."""
    return (rewards.correctness_reward(completions=[completion], answer=[answer])[0]
            + rewards.format_reward(completions=[completion])[0])


def problems():
    """A few train and test problems; one extra train problem too long for max_prompt_length."""
    train = data.make_problems(N_TRAIN, "train", seed=3)
    test = data.make_problems(N_TEST, "test", seed=3)
    long = dict(train[0], question=" ".join([train[0]["question"]] * 30))
    return train + [long], test


def verl_env() -> dict:
    """Environment for the verl venv's python: offline, scratch caches, no repository on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", TQDM_DISABLE="1", RAY_USAGE_STATS_ENABLED="0")
    return env


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def verl_python(side_python) -> Path:
    """Python of the verl venv (tests/side_venv.py), from tests/verl/requirements.txt."""
    return side_python("verl", REQUIREMENTS, INSTALL_TIMEOUT)


@pytest.fixture(scope="module")
def verl_check(verl_python, tmp_path_factory):
    """Export, build the commands, run tests/verl/check_verl.py in the verl venv; returns its findings."""
    tmp = tmp_path_factory.mktemp("verl")
    train, test = problems()
    paths = verl_export.export_parquet(train, test, tmp / "export", data_source=verl_export.SYNTHETIC_SOURCE)
    command = verl_export.main_ppo_command(
        str(TINY), tmp / "export", n_gpus=1, train_batch_size=4, num_generations=4,
        micro_batch_size_per_gpu=2, max_prompt_length=128, max_response_length=96,
        learning_rate=1e-6, epochs=1, experiment_name="tiny-check")
    lora_command = verl_export.main_ppo_command(
        "Qwen/Qwen3-1.7B-Base", "/data/gsm8k", n_gpus=8, nnodes=2, train_batch_size=256,
        mini_batch_size=64, num_generations=8, learning_rate=5e-6, beta=0.001, lora_r=32, lora_alpha=64,
        lora_target_modules=LORA_TARGETS, max_steps=200, extra={"trainer.resume_mode": "disable"})
    ppo_commands = [verl_export.main_ppo_command(str(TINY), tmp / "export", **{**LESSON07_COMMON, **kw})
                    for kw in LESSON07_COMMANDS.values()]
    loss_commands = [verl_export.main_ppo_command(  # lesson 05's GSPO, CISPO and SAPO on GRPO's advantages
        str(TINY), tmp / "export", **{**LESSON07_COMMON, **LESSON07_COMMANDS["grpo"], "beta": 0.0,
                                      "experiment_name": mode, "extra": verl_export.loss_mode_overrides(mode)})
        for mode in verl_export.LOSS_MODES]
    rows = [verl_export.to_verl_row(p, "test", i, data_source=verl_export.SYNTHETIC_SOURCE)
            for i, p in enumerate(test)]
    cases, expected = [], []
    for p, row in zip(test, rows):
        gt = data.final_answer(p["answer"])
        for c in COMPLETIONS:
            text = c.format(answer=p["answer"], gt=gt, wrong=int(gt) + 1)
            cases.append({"data_source": row["data_source"], "solution_str": text,
                          "ground_truth": row["reward_model"]["ground_truth"], "extra_info": row["extra_info"]})
            expected.append(trl_reward(text, p["answer"]))
    spec = {"command": command, "more_commands": [lora_command], "validated_commands": ppo_commands + loss_commands,
            "cases": cases,
            "manager_templates": MANAGER_TEMPLATES, "hydra_dir": str(tmp / "hydra")}
    (tmp / "spec.json").write_text(json.dumps(spec))
    work = tmp / "work"   # cwd without the repository: reward.py must stand alone
    work.mkdir()
    env = verl_env()
    env["HF_DATASETS_CACHE"] = str(tmp / "hf-datasets")
    t0 = time.time()
    try:
        proc = subprocess.run([str(verl_python), str(CHECKER), str(tmp / "spec.json"), str(tmp / "out.json")],
                              cwd=work, env=env, capture_output=True, text=True, timeout=CHECK_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"check_verl.py timed out after {CHECK_TIMEOUT} s:\n{(e.stderr or '')[-3000:]}", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(f"check_verl.py failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}",
                    pytrace=False)
    out = json.loads((tmp / "out.json").read_text())
    out["wall_seconds"] = time.time() - t0
    return {"out": out, "train": train, "test": test, "paths": paths, "command": command, "ppo_commands": ppo_commands,
            "lora_command": lora_command, "expected": expected, "cases": cases}


# ----------------------------------------------------------------------------- fast: utils.verl_export
def test_row_matches_verl_gsm8k_schema():
    p = {"question": "Tom has 1,200 apples. How many?", "answer": "He has 1,200.\n#### 1,200"}
    row = verl_export.to_verl_row(p, "train", 7)
    assert row == {
        "data_source": "openai/gsm8k",
        "prompt": data.to_prompt_messages(p),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "1200"},
        "extra_info": {"split": "train", "index": 7, "answer": p["answer"], "question": p["question"]},
    }
    with_sys = verl_export.to_verl_row(p, "test", 0, data_source="synthetic-arithmetic", system="Be brief.",
                                       instruction=verl_export.VERL_GSM8K_INSTRUCTION)
    assert with_sys["prompt"] == [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": p["question"] + " " + verl_export.VERL_GSM8K_INSTRUCTION}]
    assert with_sys["extra_info"]["question"] == p["question"]
    assert verl_export.data_source_for("synthetic") == "synthetic-arithmetic"
    assert verl_export.data_source_for("openai/gsm8k") == "openai/gsm8k"


def test_export_parquet_writes_data_and_a_standalone_reward(tmp_path):
    import pyarrow.parquet as pq

    train, test = data.make_problems(5, "train"), data.make_problems(2, "test")
    paths = verl_export.export_parquet(train, test, tmp_path / "out")
    assert set(paths) == {"train", "test", "reward"}
    for split, probs in (("train", train), ("test", test)):
        rows = pq.read_table(paths[split]).to_pylist()
        assert rows == [verl_export.to_verl_row(p, split, i) for i, p in enumerate(probs)]
    reward = paths["reward"].read_text()
    assert reward == (ROOT / "utils" / "rewards.py").read_text()
    imported = {a.name.split(".")[0] for n in ast.walk(ast.parse(reward)) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(ast.parse(reward))
                 if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    with pytest.raises(ValueError):
        verl_export.export_parquet(train, [], tmp_path / "empty")


def test_command_shape_and_options(tmp_path):
    cmd = verl_export.main_ppo_command("Qwen/Qwen2.5-0.5B-Instruct", tmp_path, num_generations=6,
                                       learning_rate=3e-6, n_gpus=2)
    argv = shlex.split(cmd.replace("\\\n", " "))
    assert argv[:4] == ["python", "-m", "verl.trainer.main_ppo", "algorithm.adv_estimator=grpo"]
    assert argv == shlex.split(verl_export.main_ppo_command("Qwen/Qwen2.5-0.5B-Instruct", tmp_path,
                                                            num_generations=6, learning_rate=3e-6, n_gpus=2,
                                                            multiline=False))
    ov = dict(a.split("=", 1) for a in argv[3:])
    assert len(ov) == len(argv) - 3, "a key is set twice"
    assert ov["actor_rollout_ref.model.path"] == "Qwen/Qwen2.5-0.5B-Instruct"      # Hub id kept as is
    assert ov["data.train_files"] == str(tmp_path.resolve() / "train.parquet")
    assert ov["reward.custom_reward_function.path"] == str(tmp_path.resolve() / "reward.py")
    assert ov["reward.custom_reward_function.name"] == "compute_score"
    assert ov["actor_rollout_ref.rollout.n"] == "6"
    assert ov["actor_rollout_ref.actor.optim.lr"] == "3e-06"
    assert ov["actor_rollout_ref.actor.use_kl_loss"] == "False"                      # beta=0: no reference
    assert ov["trainer.n_gpus_per_node"] == "2"
    assert ov["trainer.logger"] == "[console]"
    assert not any(k.startswith("actor_rollout_ref.model.lora_") and k != "actor_rollout_ref.model.lora_rank"
                   for k in ov)
    lora = dict(a.split("=", 1) for a in verl_export.main_ppo_overrides(
        "m", "/d", lora_r=16, beta=0.04, reward_path="/r/reward.py", max_steps=5, extra=["x.y=1"]))
    assert lora["actor_rollout_ref.model.lora_rank"] == "16"
    assert lora["actor_rollout_ref.model.lora_alpha"] == "32"
    assert lora["actor_rollout_ref.model.target_modules"] == "all-linear"
    assert lora["actor_rollout_ref.rollout.load_format"] == "safetensors"
    assert lora["actor_rollout_ref.actor.use_kl_loss"] == "True"
    assert lora["actor_rollout_ref.actor.kl_loss_coef"] == "0.04"
    assert lora["reward.custom_reward_function.path"] == "/r/reward.py"
    assert lora["trainer.total_training_steps"] == "5"
    assert lora["x.y"] == "1"


# ----------------------------------------------------------------------------- slow: verl's own code
@pytest.mark.slow
def test_verl_main_ppo_accepts_our_commands(verl_check):
    out = verl_check["out"]
    assert out["verl_version"] == "0.9.1"
    assert out["missing_keys"] == [], "override keys not in verl's ppo_trainer config"
    assert "TaskRunnerV1" in out["runner"]       # main() validated the config and reached run_ppo
    cfg = out["config"]
    assert cfg["algorithm.adv_estimator"] == "grpo"
    assert cfg["reward.custom_reward_function.path"] == str(verl_check["paths"]["reward"].resolve())
    assert cfg["data.train_files"] == str(verl_check["paths"]["train"].resolve())
    assert cfg["actor_rollout_ref.rollout.n"] == 4
    assert cfg["actor_rollout_ref.actor.optim.lr"] == 1e-6
    assert cfg["trainer.logger"] == ["console"]
    (lora,) = out["more_commands"]
    assert lora["missing_keys"] == []
    assert lora["config"]["actor_rollout_ref.model.lora_rank"] == 32
    assert lora["config"]["actor_rollout_ref.model.target_modules"] == LORA_TARGETS
    assert lora["config"]["actor_rollout_ref.actor.use_kl_loss"] is True
    assert lora["config"]["trainer.nnodes"] == 2
    print("\n" + verl_check["command"])


@pytest.mark.slow
def test_verl_main_ppo_accepts_lesson07_commands(verl_check):
    """PPO with a critic (adv_estimator=gae), REINFORCE++, RLOO and GRPO pass verl's validate_config and reach
    run_ppo."""
    ppo_, rpp, rloo, grpo = verl_check["out"]["validated_commands"][:len(LESSON07_COMMANDS)]
    for got in (ppo_, rpp, rloo, grpo):
        assert got["missing_keys"] == [] and "TaskRunnerV1" in got["runner"]
        assert got["need_reference_policy"] is True and got["need_critic"] is (got is ppo_)  # the KL needs pi_ref
    assert grpo["config"]["algorithm.use_kl_in_reward"] is False
    assert grpo["config"]["actor_rollout_ref.actor.use_kl_loss"] is True
    assert grpo["config"]["actor_rollout_ref.actor.kl_loss_coef"] == 0.05
    assert grpo["config"]["actor_rollout_ref.actor.kl_loss_type"] == "low_var_kl"
    assert rloo["config"]["algorithm.adv_estimator"] == "rloo"
    for got in (ppo_, rpp, rloo):                                        # the KL in the reward
        assert got["config"]["algorithm.use_kl_in_reward"] is True
        assert got["config"]["algorithm.kl_ctrl.kl_coef"] == 0.05
        assert got["config"]["actor_rollout_ref.actor.use_kl_loss"] is False   # not both KL placements
    assert ppo_["config"]["algorithm.adv_estimator"] == "gae"
    assert ppo_["config"]["algorithm.lam"] == 0.95
    assert ppo_["config"]["critic.model.path"] == str(TINY)
    assert ppo_["config"]["critic.cliprange_value"] == 0.5
    assert ppo_["config"]["trainer.critic_warmup"] == 2
    assert ppo_["config"]["actor_rollout_ref.actor.entropy_coeff"] == 0.001
    assert rpp["config"]["algorithm.adv_estimator"] == "reinforce_plus_plus"
    assert not any(k.startswith("critic.") for k in rpp["config"])


@pytest.mark.slow
def test_verl_main_ppo_accepts_lesson05_loss_modes(verl_check):
    """GSPO, CISPO and SAPO (utils.verl_export.LOSS_MODES) pass verl's validate_config with their settings, and the
    actor keeps them."""
    validated = verl_check["out"]["validated_commands"][len(LESSON07_COMMANDS):]
    assert len(validated) == len(verl_export.LOSS_MODES) == 3
    for mode, got in zip(verl_export.LOSS_MODES, validated):
        assert got["missing_keys"] == [] and "TaskRunnerV1" in got["runner"], mode
        assert got["need_critic"] is False and got["need_reference_policy"] is False, mode   # beta 0: no reference
        for key, value in verl_export.LOSS_MODES[mode].items():
            assert got["config"][key] == value, (mode, key, got["config"][key])


def test_loss_mode_overrides_name_verls_keys():
    assert verl_export.loss_mode_overrides("cispo") == [
        "actor_rollout_ref.actor.policy_loss.loss_mode=cispo", "actor_rollout_ref.actor.clip_ratio_low=1.0",
        "actor_rollout_ref.actor.clip_ratio_high=4.0"]
    with pytest.raises(ValueError, match="expected one of"):
        verl_export.loss_mode_overrides("ppo")


@pytest.mark.slow
def test_verl_rlhf_dataset_loads_our_parquet(verl_check):
    from transformers import AutoTokenizer

    out, train, test = verl_check["out"], verl_check["train"], verl_check["test"]
    tok = AutoTokenizer.from_pretrained(TINY)
    assert out["model_type"] == "qwen3" and out["builder"] == "QwenContinuousTokenBuilder"
    # filter_overlong_prompts=True: verl drops (does not truncate) the prompt over max_prompt_length
    assert out["data"]["train"]["len"] == N_TRAIN and out["data"]["test"]["len"] == N_TEST
    for split, probs in (("train", train[:N_TRAIN]), ("test", test)):
        got = out["data"][split]
        assert got["class"] == "RLHFDataset"
        for i, (p, item) in enumerate(zip(probs, got["items"])):
            messages = data.to_prompt_messages(p)
            assert item["raw_prompt"] == messages                       # what the agent loop renders
            assert item["data_source"] == verl_export.SYNTHETIC_SOURCE
            assert item["ability"] == "math"
            assert item["reward_model"] == {"style": "rule", "ground_truth": data.final_answer(p["answer"])}
            assert item["extra_info"] == {"split": split, "index": i, "answer": p["answer"],
                                          "question": p["question"]}
            assert item["index"] == i
            # verl tokenizes the prompt as the TRL lesson does (transformers 5.9 there, ours here)
            want = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            assert item["prompt_text"] == want
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            assert item["prompt_ids"] == list(ids)


@pytest.mark.slow
def test_verl_custom_reward_scores_like_trl(verl_check):
    out, expected = verl_check["out"], verl_check["expected"]
    assert "compute_score" in out["reward_fn"]
    assert out["scores"] == expected
    assert {0.0, 1.0, 2.0} <= set(expected)                             # the cases are not all alike
    # verl's naive reward manager, from token ids in a DataProto built from RLHFDataset items
    assert out["reward_manager"] == "NaiveRewardManager"
    want_texts, want_scores = [], []
    for p in verl_check["test"]:
        for t in MANAGER_TEMPLATES:
            text = t.format(ground_truth=data.final_answer(p["answer"]))
            want_texts.append(text)
            want_scores.append(trl_reward(text, p["answer"]))
    assert out["manager_response_texts"] == want_texts
    assert out["manager_scores"] == want_scores
    limit = speed.scaled(120)   # stretched by the machine's measured slowdown (utils.course.speed)
    assert out["wall_seconds"] < limit, f"check_verl.py took {out['wall_seconds']:.0f} s (limit {limit} s)"


# ----------------------------------------------------------------------------- slow: PPO pieces against verl's core_algos
CORE_CHECKER = VERL_DIR / "check_core_algos.py"
GAMMA, LAM, BETA, CLIP_LOW, CLIP_HIGH, CLIP_C, CLIP_VALUE = 0.9, 0.8, 0.1, 0.2, 0.28, 3.0, 0.5
GROUP_SIZE, GRPO_EPSILON = 2, 1e-6      # the four responses as two prompts' groups; verl's default epsilon


def core_inputs() -> dict:
    """Inputs on which every clip, mask rule and discount shows: B=4 responses of up to T=7 tokens, ratios
    far from 1 (both clips and the dual clip bind), values that move past the value clip, a mask with padding
    at the end and a masked span inside a response (tool output in a multi-turn rollout)."""
    g = torch.Generator().manual_seed(7)
    B, T, V = 4, 7, 11
    mask = torch.ones(B, T)
    mask[1, 5:] = 0                     # padding after the end
    mask[2, 2:4] = 0                    # an observation span inside the response
    mask[2, 6:] = 0
    mask[3, 1:] = 0                     # a one-token response
    scores = torch.tensor([1.0, 0.0, 2.0, -1.0])
    old = -torch.rand(B, T, generator=g) * 3
    ref = old + torch.randn(B, T, generator=g) * 0.5
    return {
        "mask": mask,
        "token_level_scores": ppo.last_token_scores(scores, mask),
        "token_level_rewards": torch.randn(B, T, generator=g),       # nonzero on masked positions too
        "values": torch.randn(B, T, generator=g),
        "vpreds": torch.randn(B, T, generator=g) * 1.5,
        "returns": torch.randn(B, T, generator=g),
        "old_logps": old,
        "ref_logps": ref,
        "logps": old + torch.randn(B, T, generator=g) * 0.8,
        "advantages": torch.randn(B, T, generator=g) * 2,
        "logits": torch.randn(B, T, V, generator=g) * 3,
    }


@pytest.fixture(scope="module")
def core_algos(verl_python, tmp_path_factory):
    """(our inputs, verl's outputs) from tests/verl/check_core_algos.py in the verl venv."""
    tmp = tmp_path_factory.mktemp("core-algos")
    t = core_inputs()
    spec = {"tensors": {k: v.tolist() for k, v in t.items()}, "gamma": GAMMA, "lam": LAM, "beta": BETA,
            "clip_ratio_low": CLIP_LOW, "clip_ratio_high": CLIP_HIGH, "clip_ratio_c": CLIP_C,
            "cliprange_value": CLIP_VALUE, "index": [i // GROUP_SIZE for i in range(len(t["mask"]))],
            "grpo_epsilon": GRPO_EPSILON}
    (tmp / "spec.json").write_text(json.dumps(spec))
    work = tmp / "work"
    work.mkdir()
    proc = subprocess.run([str(verl_python), str(CORE_CHECKER), str(tmp / "spec.json"), str(tmp / "out.json")],
                          cwd=work, env=verl_env(), capture_output=True, text=True, timeout=CHECK_TIMEOUT)
    if proc.returncode != 0:
        pytest.fail(f"check_core_algos.py failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}", pytrace=False)
    return t, json.loads((tmp / "out.json").read_text())


def close(ours, theirs, what):
    theirs = torch.tensor(theirs, dtype=torch.float32)
    diff = (torch.as_tensor(ours, dtype=torch.float32) - theirs).abs().max().item()
    assert diff < 1e-5, f"{what}: max |ours - verl| = {diff:.2e}"


@pytest.mark.slow
def test_lesson07_gae_equals_verl(core_algos):
    """Lesson 07's GAE answer, whitened by utils.ppo, against compute_gae_advantage_return (mask rules included)."""
    from utils.solutions.lesson07 import gae

    t, verl = core_algos
    assert verl["verl_version"] == "0.9.1"
    adv, returns = gae(t["token_level_rewards"], t["values"], t["mask"], GAMMA, LAM)
    close(returns, verl["gae"]["returns"], "GAE returns")
    close(ppo.masked_whiten(adv, t["mask"]), verl["gae"]["advantages"], "GAE advantages, whitened")
    # the inputs make the mask rules matter: GAE without them would differ
    unmasked, _ = gae(t["token_level_rewards"], t["values"], torch.ones_like(t["mask"]), GAMMA, LAM)
    assert (unmasked - adv).abs().max() > 0.1


@pytest.mark.slow
def test_lesson07_rloo_and_grpo_equal_verl(core_algos):
    """Section 9's advantages and GRPO's KL loss term, as lesson 07 builds them, against verl's core_algos."""
    from utils.solutions.lesson04 import group_advantages, k3_kl

    t, verl = core_algos
    mask = t["mask"]
    sequence_reward = (t["token_level_rewards"] * mask).sum(1)        # score - kl_coef * sum of k1, per response
    close(rl.rloo_advantages(sequence_reward, GROUP_SIZE)[:, None] * mask, verl["rloo"], "RLOO advantages")
    close(group_advantages(sequence_reward, GROUP_SIZE, eps=GRPO_EPSILON)[:, None] * mask, verl["grpo"],
          "GRPO advantages")
    assert (torch.tensor(verl["grpo"]).abs() > 0.5).any()               # not all zero: the groups' rewards differ
    close(k3_kl(t["logps"], t["ref_logps"]), verl["low_var_kl"], "k3 KL (verl: low_var_kl)")


@pytest.mark.slow
def test_utils_ppo_equals_verl(core_algos):
    t, verl = core_algos
    mask = t["mask"]
    adv, returns = ppo.reinforce_pp_advantages(t["token_level_rewards"], mask, gamma=GAMMA)
    close(returns, verl["reinforce_pp"]["returns"], "REINFORCE++ returns")
    close(adv, verl["reinforce_pp"]["advantages"], "REINFORCE++ advantages")

    loss, clipfrac = ppo.value_loss(t["vpreds"], t["values"], t["returns"], mask, cliprange_value=CLIP_VALUE)
    close(loss.item(), verl["value_loss"]["loss"], "value loss")
    assert clipfrac == pytest.approx(verl["value_loss"]["clipfrac"], abs=1e-6) and 0 < clipfrac < 1

    loss, metrics = ppo.policy_loss(t["logps"], t["old_logps"], t["advantages"], mask, clip_ratio_low=CLIP_LOW,
                                    clip_ratio_high=CLIP_HIGH, clip_ratio_c=CLIP_C)
    close(loss.item(), verl["policy_loss"]["loss"], "policy loss")
    for k in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
        assert metrics[k] == pytest.approx(verl["policy_loss"][k], abs=1e-6), k
    assert metrics["pg_clipfrac"] > 0 and metrics["pg_clipfrac_lower"] > 0      # both clips bind on these inputs

    rewards_, kl = ppo.kl_in_reward(t["token_level_scores"], t["old_logps"], t["ref_logps"], mask, beta=BETA)
    close(rewards_, verl["kl_in_reward"]["token_level_rewards"], "token-level rewards with the KL")
    assert kl == pytest.approx(verl["kl_in_reward"]["kl"], abs=1e-6)
    assert verl["kl_in_reward"]["source"].endswith("verl/trainer/ppo/ray_trainer.py")

    close(ppo.masked_whiten(t["values"], mask), verl["whiten"], "masked_whiten")
    close(ppo.masked_whiten(t["values"], mask, shift_mean=False), verl["whiten_keep_mean"], "masked_whiten, mean kept")
    close(ppo.entropy_from_logits(t["logits"]), verl["entropy"], "entropy")


def test_command_for_ppo_with_a_critic_and_reinforce_pp(tmp_path):
    ov = dict(a.split("=", 1) for a in verl_export.main_ppo_overrides("m", tmp_path, adv_estimator="gae", kl_coef=0.02,
                                                                      lam=0.9, lora_r=8))
    assert ov["algorithm.adv_estimator"] == "gae" and ov["algorithm.use_kl_in_reward"] == "True"
    assert ov["algorithm.kl_ctrl.kl_coef"] == "0.02" and ov["algorithm.kl_penalty"] == "kl"
    assert ov["algorithm.lam"] == "0.9" and ov["critic.model.path"] == "m" and ov["critic.model.lora_rank"] == "8"
    assert ov["critic.model.lora_alpha"] == "16"
    rpp = dict(a.split("=", 1) for a in verl_export.main_ppo_overrides("m", tmp_path,
                                                                       adv_estimator="reinforce_plus_plus"))
    assert rpp["algorithm.use_kl_in_reward"] == "False" and "algorithm.lam" not in rpp
    assert not any(k.startswith("critic.") or k.startswith("algorithm.kl_ctrl") for k in rpp)
    grpo = dict(a.split("=", 1) for a in verl_export.main_ppo_overrides("m", tmp_path))
    assert "algorithm.gamma" not in grpo and not any(k.startswith("critic.") for k in grpo)
