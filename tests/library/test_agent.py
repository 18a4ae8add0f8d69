"""Tool use in the chat format (utils/agent.py): the tiny tokenizer's tool template against TRL's own checks and
parser, the traces SFT trains on, and the embedding rows the new tokens get."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from utils import agent, data
from utils.presets.tiers import MODELS
from utils.tools import calculator

SAM = data.make_problems(3, "test", seed=0)[2]       # 63 + 28 = 91, 91 / 7 = 13
NATALIA = {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                       "How many clips did Natalia sell altogether in April and May?",
           "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                     "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"}


@pytest.fixture(scope="module")
def tok():
    return agent.tool_tokenizer()


def test_trl_accepts_the_template(tok):
    """GRPOTrainer(tools=...) refuses a template that cannot render tools, and rewrites one that is not prefix-
    preserving (it raises for a template it does not know): ours passes both checks as it is."""
    from trl.chat_template_utils import (
        get_training_chat_template,
        is_chat_template_prefix_preserving,
        supports_tool_calling,
    )

    assert supports_tool_calling(tok) and is_chat_template_prefix_preserving(tok)
    assert get_training_chat_template(tok) is None          # has {% generation %} markers and is prefix-preserving


def test_trace_of_a_synthetic_answer(tok):
    messages = agent.tool_trace(SAM, calculator)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [m["tool_calls"][0]["function"]["arguments"]["expression"] for m in messages if "tool_calls" in m] == \
        ["63 + 28", "91 / 7"]
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["91", "13"]
    written = "\n".join(m["content"] for m in messages[1:] if m["role"] == "assistant" and m["content"])
    assert written == SAM["answer"], "the assistant writes the reference's lines, in order, once each"


def test_trace_of_a_gsm8k_answer_calls_its_annotations(tok):
    messages = agent.tool_trace(NATALIA, calculator)
    calls = [m["tool_calls"][0]["function"]["arguments"]["expression"] for m in messages if "tool_calls" in m]
    assert calls == ["48/2", "48+24"] and messages[-1]["content"].endswith("#### 72")
    assert not any("<<" in m["content"] for m in messages), "the annotations become calls, not text"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_trace_never_raises(answer):
    messages = agent.tool_trace({"question": "q", "answer": answer}, calculator)
    assert messages[0]["role"] == "user" and messages[-1]["role"] == "assistant"


def test_rendered_trace_round_trips_and_costs_few_tokens(tok):
    text = tok.apply_chat_template(agent.tool_trace(SAM, calculator), tools=[calculator], tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    call = ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "63 + 28"}}\n</tool_call><|im_end|>\n'
            "<|im_start|>user\n<tool_response>\n91\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert len(tok(call, add_special_tokens=False)["input_ids"]) == 22


def test_trl_parses_a_generated_call(tok):
    from trl.chat_template_utils import parse_response

    prompt_ids = tok.apply_chat_template([{"role": "user", "content": SAM["question"]}], tools=[calculator],
                                         add_generation_prompt=True, tokenize=True, return_dict=False)
    text = 'After buying more, Sam has 63 + 28 = 91 cookies.\n<tool_call>\n{"name": "calculator", "arguments": ' \
           '{"expression": "91 / 7"}}\n</tool_call><|im_end|>'
    parsed = parse_response(tok, tok(text, add_special_tokens=False)["input_ids"], prefix=prompt_ids,
                            tools=[calculator])
    assert parsed["content"] == "After buying more, Sam has 63 + 28 = 91 cookies."   # the line break is markup
    assert parsed["tool_calls"] == [agent.tool_call("91 / 7")]


def test_assistant_mask_leaves_out_the_tool_results(tok):
    enc = tok.apply_chat_template(agent.tool_trace(SAM, calculator), tools=[calculator], tokenize=True,
                                  return_dict=True, return_assistant_tokens_mask=True)
    trained = tok.decode([i for i, m in zip(enc["input_ids"], enc["assistant_masks"]) if m])
    assert "<tool_response>" not in trained and "91\n</tool_response>" not in trained
    assert trained.count("<tool_call>") == 2 and trained.endswith("#### 13<|im_end|>")


def test_resize_keeps_the_pretrained_rows(tok):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(agent.TINY_MODEL_DIR)
    before = model.get_input_embeddings().weight.detach().clone()
    agent.resize_for_tools(model, tok)
    after = model.get_input_embeddings().weight
    assert after.shape[0] == len(tok) == before.shape[0] + len(agent.TOOL_TOKENS)
    assert torch.equal(after[:before.shape[0]], before) and torch.isfinite(after).all()
    assert agent.resize_for_tools(model, tok).get_input_embeddings().weight.shape[0] == len(tok)   # idempotent


def test_weaken_call_scales_the_call_logit_alone_and_survives_a_save(tok, tmp_path):
    from transformers import AutoModelForCausalLM

    model = agent.resize_for_tools(AutoModelForCausalLM.from_pretrained(agent.TINY_MODEL_DIR), tok).eval()
    call = agent.call_token_id(tok)
    assert tok.convert_ids_to_tokens(call) == agent.TOOL_TOKENS[4]
    ids = torch.tensor([tok.encode("Sam has 63 apples. <tool_call>\n{\"name\"")])
    with torch.no_grad():
        before = model(ids).logits
    embedding = model.get_input_embeddings().weight.detach().clone()
    agent.weaken_call(model, tok, 0.7)
    model.save_pretrained(tmp_path)
    weak = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        after = weak(ids).logits
    others = torch.arange(before.size(-1)) != call
    assert torch.allclose(after[..., call], 0.7 * before[..., call], atol=1e-5), "the call's logit, scaled"
    assert before[..., call].abs().max() > 1, "a logit large enough for the scaling to show"
    assert torch.allclose(after[..., others], before[..., others], atol=1e-5), "every other logit unchanged"
    assert torch.equal(weak.get_input_embeddings().weight, embedding), "what the model reads is unchanged"
    assert not weak.config.tie_word_embeddings
    for scale in (0, 1.5, -0.5):
        with pytest.raises(ValueError, match="scale"):
            agent.weaken_call(weak, tok, scale)


@pytest.mark.parametrize("model_id", sorted(set(MODELS[1:])))
def test_call_token_of_a_qwen_is_its_tool_call_tag(qwen_tokenizer, model_id):
    tokenizer = qwen_tokenizer(model_id)
    assert tokenizer.convert_ids_to_tokens(agent.call_token_id(tokenizer)) == "<tool_call>"


def test_trl_replay_runs_trls_loop_on_given_turns(tok, tmp_path):
    """agent.trl_replay drives GRPOTrainer's own multi-turn loop: TRL parses the call, runs the calculator and
    appends a tool turn that is exactly the template's rendering of the result (mask 0), then the next turn (1)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from utils.constants import TINY_MODEL_DIR

    model = agent.resize_for_tools(AutoModelForCausalLM.from_pretrained(TINY_MODEL_DIR), tok)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=160, max_steps=1, report_to="none", save_strategy="no", bf16=False)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": SAM["question"]}]}] * 2)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                          train_dataset=ds, processing_class=tok, tools=[calculator])
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]
    turns = [enc(agent.TOOL_TOKENS[4] + "63 + 28" + agent.TOOL_TOKENS[5] + "<|im_end|>"),
             enc("Sam has 63 + 28 = 91.\n#### 91<|im_end|>")]
    suffix = enc("\n") + tok.apply_chat_template([{"role": "tool", "name": "calculator", "content": "91"}],
                                                 add_generation_prompt=True, tokenize=True, return_dict=False)
    ids, mask = agent.trl_replay(trainer, [{"role": "user", "content": SAM["question"]}], turns)
    assert ids == turns[0] + suffix + turns[1]
    assert mask == [1] * len(turns[0]) + [0] * len(suffix) + [1] * len(turns[1])
    assert tok.decode(suffix) == "\n<|im_start|>user\n<tool_response>\n91\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def _grpo_trainer_with_tools(tokenizer, tmp_path, **chat_template_kwargs):
    """A GRPOTrainer(tools=[calculator]) on a one-layer random model with the tokenizer's vocabulary."""
    from datasets import Dataset
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8))
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=16, max_steps=1, report_to="none", save_strategy="no", bf16=False,
                      chat_template_kwargs=chat_template_kwargs or None)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": "1 + 1"}]}] * 2)
    return GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                       train_dataset=ds, processing_class=tokenizer, tools=[calculator])


@pytest.mark.parametrize("model, kwargs", [("tiny", {}), ("Qwen/Qwen2.5-0.5B-Instruct", {}),
                                           ("Qwen/Qwen3-1.7B-Base", {}),
                                           ("Qwen/Qwen3-1.7B-Base", {"enable_thinking": False})])
def test_rollout_renders_the_prompt_and_the_tool_turn_as_trl_does(model, kwargs, tmp_path, qwen_tokenizer):
    """Lesson 09's rollout renders its prompts with agent.prompt_ids and appends agent.tool_turn_ids after a turn
    with calls, both with agent.rollout_template: on every preset's tokenizer (the real Qwen ones, built offline)
    and with the trainer's chat_template_kwargs, the same tokens as GRPOTrainer(tools=...) renders and appends."""
    from trl.chat_template_utils import add_response_schema

    tok = agent.tool_tokenizer() if model == "tiny" else add_response_schema(qwen_tokenizer(model))
    trainer = _grpo_trainer_with_tools(tok, tmp_path, **kwargs)
    template = agent.rollout_template(tok)
    assert template == trainer.chat_template and (template is None) == (model != "Qwen/Qwen3-1.7B-Base")
    for results in (["91"], ["24", "error: division by zero"]):
        ours = agent.tool_turn_ids(tok, results, template, chat_template_kwargs=kwargs)
        theirs = trainer._get_tool_suffix_ids([{"role": "tool", "name": "calculator", "content": r} for r in results])
        assert ours == theirs, (tok.decode(ours), tok.decode(theirs))
    assert tok.decode(ours).startswith("\n<|im_start|>user\n<tool_response>\n24\n</tool_response>")
    header = "<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if kwargs else "")   # Qwen3 without thinking
    assert tok.decode(ours).endswith("</tool_response><|im_end|>\n" + header)
    prompt = [{"role": "user", "content": SAM["question"]}]
    ours = agent.prompt_ids(tok, prompt, [calculator], template, kwargs)
    assert ours == list(trainer._tokenize_prompts([prompt])[0][0])
    assert tok.decode(ours).endswith(SAM["question"] + "<|im_end|>\n" + header)


def test_qwen3s_own_template_cannot_render_the_tool_turn(qwen_tokenizer):
    """Why the rollout needs TRL's training template on Qwen3: with Qwen3's own (not prefix-preserving) template
    the conversation that ends with a call keeps an empty think block that the longer one drops, so the tokens
    after the call's turn are not an extension of it, and agent.tool_turn_ids refuses, as TRL does."""
    tok = qwen_tokenizer("Qwen/Qwen3-1.7B-Base")
    with pytest.raises(ValueError, match="not prefix-preserving.*agent.rollout_template"):
        agent.tool_turn_ids(tok, ["91"])
    fixed = tok.decode(agent.tool_turn_ids(tok, ["91"], agent.rollout_template(tok)))
    assert fixed == "\n<|im_start|>user\n<tool_response>\n91\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
