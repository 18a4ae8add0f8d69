"""utils/sft.py and utils/training.py, and lesson 01's answers where they meet them."""
import random

import numpy as np
import pytest
import torch

from utils import data, presets, sft, training
from utils.course import tiny
from utils.solutions import lesson01 as l01


@pytest.fixture(scope="module")
def tok():
    return tiny.load()[1]


def test_mask_covers_answer_and_end_of_turn_only(tok):
    p = {"question": "Tom has 2 apples. How many apples does Tom have now?", "answer": "2 + 0 = 2\n#### 2"}
    ex = sft.tokenize_sft_example(tok, data.to_messages(p), max_length=512)
    ids, labels = ex["input_ids"], ex["labels"]
    answer = tok(p["answer"], add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    n_prompt = len(ids) - len(answer)
    assert ids[n_prompt:] == answer
    assert labels == [-100] * n_prompt + answer
    # the same positions the chat template's {% generation %} markers give (TRL's assistant_only_loss)
    out = tok.apply_chat_template(data.to_messages(p), return_dict=True, return_assistant_tokens_mask=True)
    mask = out["assistant_masks"][:len(ids)]
    assert [l != -100 for l in labels] == [bool(m) for m in mask]


@pytest.mark.parametrize("template", ["tiny", "qwen2_5", "qwen3"])
def test_mask_is_lesson_01s_answer_on_every_template(tok, template):
    """The helper reads TRL's assistant mask; lesson 01's answer finds the answer by the prompt's length.
    On the tiny template and on TRL's copy of Qwen3's they agree exactly; TRL's training version of
    Qwen2.5's template also trains the line break after '<|im_start|>assistant' (one more label)."""
    import copy
    from pathlib import Path

    import trl

    tok = copy.deepcopy(tok)
    if template != "tiny":
        tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / f"{template}.jinja").read_text()
    for p in data.make_problems(20, "train", seed=3):
        for system in (None, "Answer briefly."):
            for max_length in (512, 40):
                messages = data.to_messages(p, system=system)
                ours, answer = sft.tokenize_sft_example(tok, messages, max_length), l01.build_sft_example(
                    tok, messages, max_length)
                assert ours["input_ids"] == answer["input_ids"]
                extra = [i for i, (a, b) in enumerate(zip(ours["labels"], answer["labels"])) if a != b]
                if template == "qwen2_5":
                    assert len(extra) <= 1 and all(tok.decode(ours["input_ids"][i]).startswith("\n") for i in extra)
                else:
                    assert extra == []


def test_mask_needs_an_assistant_turn(tok):
    with pytest.raises(ValueError, match="assistant"):
        sft.tokenize_sft_example(tok, [{"role": "user", "content": "hi"}], 64)


def test_completion_loss_is_the_padded_batchs_loss(tok):
    model = tiny.load()[0]
    exs = [sft.tokenize_sft_example(tok, data.to_messages(p), 160) for p in data.make_problems(5, "test", seed=1)]
    with torch.no_grad():
        want = model(**l01.collate(exs, tok.pad_token_id)).loss.item()
    assert sft.completion_loss(model, exs, tok.pad_token_id, batch_size=5) == pytest.approx(want, abs=1e-6)


def test_truncation(tok):
    msgs = data.to_messages(data.make_problems(1, "train")[0])
    ex = sft.tokenize_sft_example(tok, msgs, max_length=20)
    assert len(ex["input_ids"]) == len(ex["labels"]) == 20


def test_collate_known_values():
    b = l01.collate([{"input_ids": [1, 2], "labels": [-100, 2]}, {"input_ids": [3], "labels": [3]}], pad_token_id=9)
    assert b["input_ids"].tolist() == [[1, 2], [3, 9]]
    assert b["labels"].tolist() == [[-100, 2], [3, -100]]
    assert b["attention_mask"].tolist() == [[1, 1], [1, 0]]
    assert all(v.dtype == torch.long for v in b.values())


def test_pack_known_values():
    exs = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}, {"input_ids": [4, 5], "labels": [-100, 5]},
           {"input_ids": [6, 7, 8, 9], "labels": [-100, -100, 8, 9]}]
    b = sft.pack(exs, pad_token_id=0, max_length=6)
    # longest first: [6 7 8 9] opens row 0, [1 2 3] does not fit beside it, [4 5] does
    assert b["input_ids"].tolist() == [[6, 7, 8, 9, 4, 5], [1, 2, 3, 0, 0, 0]]
    assert b["labels"].tolist() == [[-100, -100, 8, 9, -100, 5], [-100, 2, 3, -100, -100, -100]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 1, 2]]
    assert b["use_cache"] is False and "attention_mask" not in b
    # an example's first label is dropped even when it is a target (collate never predicts it either)
    assert sft.pack([{"input_ids": [1, 2], "labels": [1, 2]}], 0, 4)["labels"].tolist() == [[-100, 2]]
    with pytest.raises(ValueError, match="max_length"):
        sft.pack(exs, pad_token_id=0, max_length=3)


def test_pack_gives_the_loss_and_gradient_of_padding(tok):
    """Packed rows: no attention across examples, the same tokens under the loss -> same loss and gradient."""
    model = tiny.load()[0]
    exs = [sft.tokenize_sft_example(tok, data.to_messages(p), 160) for p in data.make_problems(12, "train", seed=3)]
    padded, packed = l01.collate(exs, tok.pad_token_id), sft.pack(exs, tok.pad_token_id, 160)
    assert packed["input_ids"].numel() < padded["input_ids"].numel() and len(packed["input_ids"]) < len(exs)
    grads = []
    for batch in (padded, packed):
        model.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        grads.append((loss.item(), model.model.layers[0].self_attn.q_proj.weight.grad.clone()))
    assert grads[0][0] == pytest.approx(grads[1][0], abs=1e-5)
    torch.testing.assert_close(grads[0][1], grads[1][1], atol=1e-6, rtol=1e-4)


def test_completion_loss_does_not_depend_on_batch_size(tok):
    model = tiny.load()[0]
    exs = [sft.tokenize_sft_example(tok, data.to_messages(p), 256) for p in data.make_problems(6, "test")]
    a = sft.completion_loss(model, exs, tok.pad_token_id, batch_size=6)
    b = sft.completion_loss(model, exs, tok.pad_token_id, batch_size=4)
    assert a == pytest.approx(b, rel=1e-4)


def test_training_arguments_follow_the_preset(tmp_path):
    cfg = presets.resolve("tiny", "01")
    args = training.training_arguments(cfg, tmp_path, max_steps=7)
    assert args.max_steps == 7 and args.learning_rate == cfg.learning_rate
    assert not args.fp16 and not args.bf16 and args.save_strategy == "no"


def test_last_checkpoint_is_numeric_order(tmp_path):
    assert training.last_checkpoint(tmp_path) is None
    for n in (9, 10, 100):
        (tmp_path / f"checkpoint-{n}").mkdir()
    assert training.last_checkpoint(tmp_path).endswith("checkpoint-100")


def test_with_lora_trains_only_adapters():
    cfg = presets.resolve("tiny", "01")
    model = training.with_lora(tiny.load()[0], cfg)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)


def test_train_sft_few_steps_lowers_loss(tmp_path):
    """The shared recipe later lessons reuse: loss goes down and the trainer logs it."""
    cfg = presets.resolve("tiny", "01", max_steps=12, logging_steps=4, n_train=64)
    model, tok = tiny.load()
    trainer = sft.train_sft(model, tok, data.make_problems(64, "train", seed=2), cfg, tmp_path)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and losses[-1] < losses[0]


def test_train_sft_on_given_examples_uses_them_instead_of_the_problems(tmp_path):
    """Lesson 09 trains its tool traces with the same recipe: ``examples`` replace the problems' chat answers."""
    cfg = presets.resolve("tiny", "01", max_steps=1, logging_steps=1, batch_size=2)
    model, tok = tiny.load()
    examples = [{"input_ids": [1, 2, 3, 4], "labels": [-100, -100, 3, 4]}] * 4
    trainer = sft.train_sft(model, tok, [], cfg, tmp_path, examples=examples)
    assert trainer.train_dataset is examples and trainer.state.global_step == 1


def test_sft_config_keeps_the_presets_precision(tmp_path, recwarn):
    """SFTConfig alone would turn on bf16 and gradient checkpointing; the preset's choices win."""
    cfg = presets.resolve("tiny", "02")
    sft.sft_config(cfg, tmp_path, packing=True)
    recwarn.clear()   # what a first import warns (torch.jit, in whichever test of an xdist worker imports it first)
    args = sft.sft_config(cfg, tmp_path, packing=True)
    assert not args.bf16 and not args.fp16 and args.use_cpu
    assert args.activation_checkpointing is False and args.gradient_checkpointing is False
    assert args.packing and args.max_length == cfg.max_length and args.max_steps == cfg.max_steps
    assert not [w for w in recwarn if "deprecated" in str(w.message)], [str(w.message) for w in recwarn]


def test_token_counter_counts_padding():
    counter = sft.TokenCounter(lambda b: l01.collate(b, pad_token_id=0))
    counter([{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}, {"input_ids": [4], "labels": [4]}])
    assert (counter.tokens, counter.positions) == (4, 6)
    assert counter.padding_fraction == pytest.approx(2 / 6)
    assert counter.pairs == 2 * 3 ** 2 and counter.pairs_per_token == pytest.approx(18 / 4)
    flat = sft.TokenCounter(lambda b: l01.collate([{"input_ids": sum((e["input_ids"] for e in b), []),
                                                      "labels": sum((e["labels"] for e in b), [])}], pad_token_id=0))
    flat([{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}, {"input_ids": [4], "labels": [4]}])
    assert (flat.positions, flat.pairs) == (4, 16), "one flattened row of 4 tokens: 4 x 4 pairs"
    assert sft.TokenCounter(None).padding_fraction == 0.0 and sft.TokenCounter(None).pairs_per_token == 0.0
    with pytest.raises(ValueError, match="callback"):
        counter.tokens_per_s


def test_token_counter_times_steps_after_the_first(tmp_path):
    """tokens/s counts the batches of steps 2..N over the time between the end of step 1 and of step N."""
    cfg = presets.resolve("tiny", "02", max_steps=4, logging_steps=100)
    model, tok = tiny.load()
    exs = [sft.tokenize_sft_example(tok, data.to_messages(p), 160) for p in data.make_problems(40, "train")]
    from transformers import Trainer
    trainer = training.quiet(Trainer(model=model, args=training.training_arguments(cfg, tmp_path, per_device_train_batch_size=4,
                                                                         gradient_accumulation_steps=2),
                                train_dataset=exs, data_collator=lambda b: l01.collate(b, tok.pad_token_id)))
    counter = trainer.data_collator = sft.TokenCounter(trainer.data_collator)
    trainer.add_callback(counter.callback)
    trainer.train()
    assert len(counter.step_ends) == 4 and counter.grad_accum == 2
    assert len(counter.batch_tokens) >= 8
    expected = sum(counter.batch_tokens[2:8]) / (counter.step_ends[-1] - counter.step_ends[0])
    assert counter.tokens_per_s == pytest.approx(expected)
    assert counter.tokens_per_s > 0


def test_sft_checkpoint_saves_once_and_resume_reuses_it(tmp_path, tok):
    from transformers import AutoModelForCausalLM

    cfg = presets.resolve("tiny", lesson="01", max_steps=2)
    problems = data.make_problems(16, split="train", seed=0)
    sft_dir = sft.sft_checkpoint(cfg, tok, problems, tmp_path)
    assert sft_dir == tmp_path / "sft-model" and (sft_dir / "config.json").exists()
    weights = sft_dir / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert sft.sft_checkpoint(cfg, tok, problems, tmp_path, resume=True) == sft_dir
    assert weights.stat().st_mtime_ns == stamp, "resume reuses the saved model instead of training again"
    trained = AutoModelForCausalLM.from_pretrained(sft_dir)
    base, _ = tiny.load()
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), base.parameters())), "it was trained"


def test_lessons_with_the_same_recipe_share_one_sft_model(tmp_path, tok):
    """Lessons 06 and 08 (and 04 and 05, 03 and 07) train the same SFT start: the second loads the first's copy, which is
    bit-for-bit what its own training would give; another recipe or other data trains anew."""
    from safetensors.torch import load_file

    cfg = presets.resolve("tiny", lesson="01", max_steps=2)
    problems = data.make_problems(16, split="train", seed=0)
    def draws():   # what a lesson samples next, from each random generator
        return torch.rand(3).tolist(), random.random(), float(np.random.rand())

    torch.manual_seed(5)
    first = sft.sft_checkpoint(cfg, tok, problems, tmp_path / "runs" / "05_x")
    after_training = draws()
    shared = tmp_path / "runs" / sft.SHARED_DIR / sft.recipe_digest(cfg, tok, problems)
    assert first == tmp_path / "runs" / "05_x" / "sft-model" and (shared / "model.safetensors").is_file()
    torch.manual_seed(6)   # another lesson, in another state
    random.seed(6)
    second = sft.sft_checkpoint(cfg, tok, problems, tmp_path / "runs" / "06_y")
    assert second == tmp_path / "runs" / "06_y" / "sft-model", "its own folder: the model's name is the same"
    assert (second / "model.safetensors").stat().st_ino == (shared / "model.safetensors").stat().st_ino, "a link"
    assert sft.reused(second) and not sft.reused(first)
    assert not (tmp_path / "runs" / "06_y" / "sft").exists(), "the second lesson did not train"
    assert draws() == after_training, "loading leaves the generators as training does: the same samples next"
    alone = sft.sft_checkpoint(cfg, tok, problems, tmp_path / "elsewhere" / "08_z")   # no shared copy there
    weights = [load_file(d / "model.safetensors") for d in (shared, alone)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0]), "training again gives the same model"
    for other_cfg, other_problems in ((presets.resolve("tiny", lesson="01", max_steps=3), problems),
                                      (cfg, data.make_problems(16, split="train", seed=1))):
        assert sft.recipe_digest(other_cfg, tok, other_problems) != shared.name
        assert sft.sft_checkpoint(other_cfg, tok, other_problems, tmp_path / "runs" / "07_w") != shared
    # another recipe trained where the shared model was linked: the shared copy keeps its weights
    sft.sft_checkpoint(presets.resolve("tiny", lesson="01", max_steps=3), tok, problems, tmp_path / "runs" / "06_y")
    kept = load_file(shared / "model.safetensors")
    assert all(torch.equal(kept[k], weights[0][k]) for k in kept), "writing a lesson's model changed the shared one"


def test_a_recipe_trained_side_by_side_is_trained_once(tmp_path, tok):
    """Two lessons executed side by side in one folder (``make test``) need the same SFT start: the second waits
    for the first's training (a lock file beside the shared copy) and takes its model instead of training too."""
    import fcntl
    import threading

    cfg = presets.resolve("tiny", lesson="01", max_steps=2)
    problems = data.make_problems(16, split="train", seed=0)
    shared = tmp_path / "runs" / sft.SHARED_DIR / sft.recipe_digest(cfg, tok, problems)
    shared.parent.mkdir(parents=True)
    done = {}
    with open(shared.with_name(f".{shared.name}.lock"), "w") as lock:   # the first lesson, training
        fcntl.flock(lock, fcntl.LOCK_EX)
        second = threading.Thread(target=lambda: done.update(
            dir=sft.sft_checkpoint(cfg, tok, problems, tmp_path / "runs" / "07_y")))
        second.start()
        second.join(timeout=2.0)
        assert second.is_alive(), "the second lesson waits while the first trains"
        first = sft._trained_or_shared(cfg, tok, problems, tmp_path / "runs" / "04_x",
                                       tmp_path / "runs" / "04_x" / "sft-model", shared)
    second.join(timeout=60)
    assert not second.is_alive() and sft.reused(done["dir"]) and not sft.reused(first)
    assert not (tmp_path / "runs" / "07_y" / "sft").exists(), "the second lesson did not train"
