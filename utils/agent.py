"""Tool use in the chat format (taught in lesson 09).

A tool call is written the way Qwen2.5 and Qwen3 write it, so the same code runs on the tiny model
and on a real Qwen, and TRL's ``GRPOTrainer(tools=[...])`` parses it with its Qwen3 parser::

    <|im_start|>assistant
    Tom has 7 * 4 = 28 apples.
    <tool_call>
    {"name": "calculator", "arguments": {"expression": "28 - 23"}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>
    5
    </tool_response><|im_end|>

The tiny model's tokenizer has no tool support: :func:`tool_tokenizer` gives it a chat template
(``assets/tool_chat_template.jinja``: Qwen3's tool markup, ``{% generation %}`` markers, and a
one-line tool list instead of Qwen's JSON system prompt, which would fill half of its 512-token
context) and adds :data:`TOOL_TOKENS`: the markup's fixed pieces become one token each (Qwen's
151,643-token vocabulary has the four tags as single tokens already; the tiny one would spend about
110 of its 512 positions on each call and its result, 22 with them). The pretrained weights stay:
:func:`resize_for_tools` appends embedding rows for the new tokens.
"""
from __future__ import annotations

import copy
import re

from .constants import ASSETS_DIR, TINY_MODEL_DIR

# The markup's fixed pieces, one token each (non-special: decoding keeps them, so TRL's parser reads the text).
# The tokenizer matches the longest, so a calculator call opens with one token and closes with one: a 1.7 M
# model sampled at temperature 1 garbles a 50-token JSON wrapper in most of its calls; the single tags stay
# for any other call.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
               '<tool_call>\n{"name": "calculator", "arguments": {"expression": "', '"}}\n</tool_call>',
               "<tool_response>\n", "\n</tool_response>"]
TOOL_CHAT_TEMPLATE = ASSETS_DIR / "tool_chat_template.jinja"
_EQUATION_RE = re.compile(r"(-?\d+(?:\.\d+)?) ([-+*/]) (-?\d+(?:\.\d+)?) = ")
_ANNOTATION_RE = re.compile(r"<<([^<>=]{1,100})=[^<>]{0,100}>>")


def tool_tokenizer(model: str = str(TINY_MODEL_DIR)):
    """The tokenizer of ``model`` ready for tool calls: a chat template that renders ``tools=``, assistant
    ``tool_calls`` and ``tool`` messages, and the ``response_template`` TRL parses completions with.

    The tiny model gets ``assets/tool_chat_template.jinja`` and :data:`TOOL_TOKENS` (non-special, so decoding
    keeps them; call :func:`resize_for_tools` on its model). A Qwen keeps its own template and tokens and gets
    TRL's parser for it (``trl.chat_template_utils.add_response_schema``)."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema, qwen3_template

    tokenizer = AutoTokenizer.from_pretrained(model)
    if str(model) != str(TINY_MODEL_DIR):
        return add_response_schema(tokenizer)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE.read_text()
    tokenizer.add_tokens(TOOL_TOKENS)
    tokenizer.response_template = copy.deepcopy(qwen3_template)
    return tokenizer


def resize_for_tools(model, tokenizer):
    """Give ``model`` embedding rows for the tokens :func:`tool_tokenizer` added (drawn around the mean of the
    existing rows); a model that has them already is left as it is. Returns the model."""
    import logging

    if model.get_input_embeddings().num_embeddings < len(tokenizer):
        log = logging.getLogger("transformers.modeling_utils")   # its note on mean resizing: the choice made here
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
        finally:
            log.setLevel(level)
    return model


def call_token_id(tokenizer) -> int:
    """The id of the token a calculator call opens with: the tiny tokenizer's one-token call prefix of
    :data:`TOOL_TOKENS`, a Qwen's ``<tool_call>``."""
    return tokenizer.encode(TOOL_TOKENS[4], add_special_tokens=False)[0]


def weaken_call(model, tokenizer, scale: float):
    """Make ``model`` reach for the tool less often without touching how it uses it (lesson 09, section 7).

    The output row of :func:`call_token_id` is multiplied by ``scale``, so the logit of opening a call becomes
    ``scale`` times what it was at every position (``(hidden,) @ (hidden,)``, float in the model's dtype): a large
    logit, where the model would call, falls (a negative one rises towards 0); every other logit and every other
    weight stay. A model with tied input and output embeddings is untied first
    (``config.tie_word_embeddings = False``, ``lm_head`` a copy of the embedding matrix, shape ``(vocab, hidden)``),
    so the token's input embedding, what the model reads once it has called, is unchanged; that adds a
    ``(vocab, hidden)`` matrix (Qwen3-4B: 151,936 x 2,560, 0.78 GB in bf16). Changes ``model`` in place and returns
    it; ``scale`` must be in (0, 1] (ValueError otherwise)."""
    import torch

    if not 0 < scale <= 1:
        raise ValueError(f"weaken_call: scale must be in (0, 1], got {scale!r}")
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head.weight.data_ptr() == embed.weight.data_ptr():
        head.weight = torch.nn.Parameter(embed.weight.detach().clone())
    model.config.tie_word_embeddings = False      # saved untied, loaded untied (else the load would tie them again)
    if getattr(model.config, "get_text_config", None) is not None:
        model.config.get_text_config().tie_word_embeddings = False
    with torch.no_grad():
        head.weight[call_token_id(tokenizer)] *= scale
    return model


def tool_call(expression: str) -> dict:
    """One calculator call as a chat message's ``tool_calls`` entry (OpenAI's format, as TRL builds it)."""
    return {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}


def tool_trace(problem: dict, calculator) -> list[dict]:
    """A worked answer as a tool-use conversation: before writing a line of working the assistant asks
    ``calculator`` for what the line computes, and writes the line once the result has come back.

    Args:
        problem: ``{"question", "answer"}`` in the course schema. A line's computations are GSM8K's calculator
            annotations (``48/2 = <<48/2=24>>24``: one call each, the annotation left out of the line) or, without
            any, its first ``a op b = c`` (the synthetic task's lines).
        calculator: the tool, ``calculator(expression: str) -> str``.
    Returns:
        messages: the user's question; per line that computes, an assistant turn (the lines written since the
        previous call as content, the calls) and one ``tool`` message per call; the last assistant turn with
        the remaining lines and ``#### N``. A computation the calculator refuses stays text.
    """
    messages = [{"role": "user", "content": problem["question"]}]
    lines = problem["answer"].split("\n")
    pending = []
    for line in lines[:-1]:
        expressions = _ANNOTATION_RE.findall(line)
        if expressions:
            line = _ANNOTATION_RE.sub("", line)
        elif (eq := _EQUATION_RE.search(line)):
            expressions = [f"{eq.group(1)} {eq.group(2)} {eq.group(3)}"]
        results = [calculator(e) for e in expressions]
        if expressions and not any(r.startswith("error") for r in results):
            messages.append({"role": "assistant", "content": "\n".join(pending),
                             "tool_calls": [tool_call(e) for e in expressions]})
            messages += [{"role": "tool", "name": "calculator", "content": r} for r in results]
            pending = []
        pending.append(line)
    messages.append({"role": "assistant", "content": "\n".join(pending + lines[-1:])})
    return messages


def rollout_template(tokenizer) -> str | None:
    """The chat template a multi-turn rollout renders with, chosen as ``GRPOTrainer(tools=...)`` chooses it:
    ``None`` (the tokenizer's own) when it is prefix-preserving, else TRL's training version of it. Qwen3's own
    template is not prefix-preserving (the last assistant turn gets an empty think block that earlier turns lose),
    so a rollout on Qwen3 renders with ``qwen3_training.jinja``, as TRL does (taught in lesson 09)."""
    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

    return None if is_chat_template_prefix_preserving(tokenizer) else get_training_chat_template(tokenizer)


def prompt_ids(tokenizer, messages: list[dict], tools: list, chat_template: str | None = None,
               chat_template_kwargs: dict | None = None) -> list[int]:
    """A rollout's prompt: ``messages`` rendered with the generation prompt, as ``GRPOTrainer`` renders its prompts
    (``tools=`` offered, or None for none; ``chat_template``: :func:`rollout_template`; ``chat_template_kwargs``:
    the trainer's ``args.chat_template_kwargs``). Returns a list of int token ids (lesson 09)."""
    return list(tokenizer.apply_chat_template(messages, tools=tools or None, chat_template=chat_template,
                                              add_generation_prompt=True, tokenize=True, return_dict=False,
                                              **(chat_template_kwargs or {})))


def tool_turn_ids(tokenizer, results: list[str], chat_template: str | None = None, name: str = "calculator",
                  chat_template_kwargs: dict | None = None) -> list[int]:
    """The token ids the environment appends after an assistant turn whose calls returned ``results``.

    What follows the turn's end-of-sequence token (the template's newline), the tool turn and the next
    assistant header, rendered as TRL 1.16 renders it (``GRPOTrainer._get_tool_suffix_ids``): a conversation
    that ends with a call, then the same with the results, and what the second adds after the first's last
    end-of-sequence token (a template may add a system turn to a conversation that has none, so the results
    are never rendered alone). Taught in lesson 09.

    Args:
        tokenizer: the policy's tokenizer (``eos_token_id`` ends an assistant turn).
        results: the calls' results, one ``tool`` message each (non-empty).
        chat_template: :func:`rollout_template` of the tokenizer (None: its own template).
        name: the tool's name in the ``tool`` messages.
        chat_template_kwargs: the trainer's ``args.chat_template_kwargs`` (e.g. ``enable_thinking``).
    Returns:
        list of int token ids.
    Raises:
        ValueError: the template is not prefix-preserving (the rendering with the results does not start
            with the one without them), as TRL raises: Qwen3's own template, for one.
    """
    call = [{"role": "user", "content": "dummy"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": name, "arguments": {}}}]}]
    messages = [{"role": "tool", "name": name, "content": r} for r in results]
    kw = dict(chat_template=chat_template, tokenize=True, return_dict=False, **(chat_template_kwargs or {}))
    prefix = tokenizer.apply_chat_template(call, add_generation_prompt=False, **kw)
    full = tokenizer.apply_chat_template(call + messages, add_generation_prompt=True, **kw)
    ends = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    if ends:
        prefix = prefix[:ends[-1] + 1]
    if full[:len(prefix)] != prefix:
        raise ValueError("this chat template is not prefix-preserving: the conversation with the tool's results "
                         "does not start with the one without them; render with agent.rollout_template(tokenizer)")
    return full[len(prefix):]


def trl_replay(trainer, prompt: list[dict], turns: list[list[int]]) -> tuple[list[int], list[int]]:
    """The completion ids and loss mask TRL builds for a conversation whose assistant turns are given.

    Runs ``trainer._tool_call_loop`` (TRL 1.16's multi-turn loop of ``GRPOTrainer(tools=...)``: it parses each
    turn's calls, runs the trainer's tools, appends the tool turn's tokens and marks them 0 in ``tool_mask``)
    with the model's generation replaced by ``turns``, so a from-scratch rollout can be compared with TRL's
    token for token (lesson 09).

    Args:
        trainer: a ``trl.GRPOTrainer`` built with ``tools=`` (its tools run, its tokenizer renders).
        prompt: the conversation before the first assistant turn (list of messages).
        turns: the token ids of each assistant turn as generated, each ending with ``<|im_end|>``.
    Returns:
        (completion_ids, tool_mask): two lists of equal length, TRL's (1 on the model's tokens, 0 on the tool's).
    """
    from trl.chat_template_utils import parse_response

    tok = trainer.processing_class
    first_ids = list(trainer._tokenize_prompts([prompt])[0][0])   # TRL's own rendering of the prompt
    later = iter(turns[1:])
    saved = trainer._generate_single_turn, getattr(trainer, "_sync_tool_dicts", None), \
        getattr(trainer, "_async_tool_dicts", None)
    trainer._generate_single_turn = lambda ids, *a, **k: ([list(next(later)) for _ in ids], None)
    trainer._sync_tool_dicts = [{t.__name__: t for t in trainer.tools}]
    trainer._async_tool_dicts = [{}]
    try:
        first = parse_response(tok, list(turns[0]), prefix=first_ids, tools=trainer.tools)
        out = trainer._tool_call_loop([copy.deepcopy(prompt)], [first_ids], [list(turns[0])], [[first]], None,
                                      None, None)
    finally:
        trainer._generate_single_turn, trainer._sync_tool_dicts, trainer._async_tool_dicts = saved
    mask, _, completion_ids = out[0], out[1], out[2]
    return list(completion_ids[0]), list(mask[0])
