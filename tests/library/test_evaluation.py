"""Generation and metrics, on the embedded tiny model."""
import pytest
import torch

from utils import data, evaluation
from utils.course import tiny


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return tiny.load()


@pytest.mark.parametrize("n,c,k,expected", [(2, 1, 1, 0.5), (5, 0, 3, 0.0), (4, 2, 2, 1 - 1 / 6), (8, 8, 1, 1.0),
                                            (10, 3, 1, 0.3), (3, 1, 3, 1.0)])
def test_pass_at_k_known_values(n, c, k, expected):
    assert evaluation.pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_rejects_bad_arguments():
    with pytest.raises(ValueError):
        evaluation.pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        evaluation.pass_at_k(4, 1, 5)


def test_prompts_and_stop_tokens(model_and_tokenizer):
    _, tok = model_and_tokenizer
    p = data.make_problems(1, "test")[0]
    assert evaluation.format_prompts(tok, [p], "plain") == [data.to_plain_prompt(p)]
    chat = evaluation.format_prompts(tok, [p], "chat")[0]
    assert chat.startswith("<|im_start|>user\n") and chat.endswith("<|im_start|>assistant\n")
    ids = evaluation.stop_token_ids(tok)
    assert tok.convert_tokens_to_ids("<|im_end|>") in ids and tok.convert_tokens_to_ids("<|endoftext|>") in ids
    with pytest.raises(ValueError, match="fmt"):
        evaluation.format_prompts(tok, [p], "xml")


def test_generate_greedy_is_deterministic_and_batch_independent(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompts = evaluation.format_prompts(tok, data.make_problems(6, "test"), "plain")
    a = evaluation.generate(model, tok, prompts, max_new_tokens=40, batch_size=6, progress=False)
    b = evaluation.generate(model, tok, prompts, max_new_tokens=40, batch_size=2, progress=False)
    assert a == b and len(a) == 6 and all(len(x) == 1 for x in a)
    cut = evaluation.generate(model, tok, prompts, max_new_tokens=60, stop_strings=["\n\n"], progress=False)
    assert all("\n\n" not in x[0] for x in cut)
    with pytest.raises(ValueError):
        evaluation.generate(model, tok, prompts, num_return_sequences=2)


def test_evaluate_metrics(model_and_tokenizer):
    model, tok = model_and_tokenizer
    probs = data.make_problems(16, "test", seed=5)
    torch.manual_seed(0)
    res = evaluation.evaluate(model, tok, probs, fmt="plain", n=4, temperature=1.0, ks=(1, 2, 4),
                              max_new_tokens=64, progress=False)
    assert 0 <= res["pass@1"] <= res["pass@2"] <= res["pass@4"] <= 1
    assert res["accuracy"] == pytest.approx(res["pass@1"])
    assert len(res["completions"]) == 16 and all(len(c) == 4 for c in res["completions"])
    assert set(res["accuracy_by_difficulty"]) <= {1, 2, 3}
    # each problem's share of right and of well-formatted samples, in the problems' order
    assert res["by_problem"]["accuracy"] == [c / 4 for c in res["n_correct"]]
    assert sum(res["by_problem"]["format_compliance"]) / 16 == pytest.approx(res["format_compliance"])
    assert all(len(v) == 16 and all(x in (0, 0.25, 0.5, 0.75, 1) for x in v) for v in res["by_problem"].values())
    greedy = evaluation.evaluate(model, tok, probs, fmt="plain", max_new_tokens=64, progress=False)
    assert greedy["accuracy"] == sum(greedy["n_correct"]) / 16
    with pytest.raises(ValueError, match="greedy"):
        evaluation.evaluate(model, tok, probs, n=2)


def _chat_batch(tok, n, seed=0):
    prompts = evaluation.format_prompts(tok, data.make_problems(n, "test", seed=seed), "chat")
    return tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)


def test_decode_greedy_matches_generate(model_and_tokenizer):
    """Rows leave the batch as they end; the greedy tokens are still generate()'s."""
    model, tok = model_and_tokenizer
    enc = _chat_batch(tok, 8)
    # the base model rarely ends a chat turn: stopping at "####" too makes rows end at different steps
    stops = evaluation.stop_token_ids(tok) + tok("####", add_special_tokens=False)["input_ids"]
    ours = evaluation.decode(model, enc["input_ids"], enc["attention_mask"], max_new_tokens=48, stop_ids=stops,
                             pad_token_id=tok.pad_token_id)
    with torch.inference_mode():
        ref = model.generate(**enc, max_new_tokens=48, do_sample=False, eos_token_id=stops,
                             pad_token_id=tok.pad_token_id)[:, enc["input_ids"].shape[1]:]
    assert ours.shape == ref.shape and ours.dtype == torch.long
    assert torch.equal(ours, ref)
    ends = set()
    for row in ours.tolist():   # after a stop token: padding only
        end = next((i for i, t in enumerate(row) if t in stops), None)
        assert end is None or all(t == tok.pad_token_id for t in row[end + 1:])
        ends.add(end)
    assert len(ends) >= 3       # rows did leave the batch at different steps


def test_decode_samples_from_the_tempered_softmax(model_and_tokenizer):
    model, tok = model_and_tokenizer
    enc = _chat_batch(tok, 1, seed=4)
    n, temperature = 4000, 0.7
    with torch.inference_mode():
        probs = (model(**enc).logits[0, -1] / temperature).softmax(-1)
    torch.manual_seed(0)
    first = evaluation.decode(model, enc["input_ids"], enc["attention_mask"], num_return_sequences=n,  # one prefill
                              max_new_tokens=1, stop_ids=evaluation.stop_token_ids(tok),
                              pad_token_id=tok.pad_token_id, do_sample=True, temperature=temperature)[:, 0]
    freq = torch.bincount(first, minlength=probs.numel()).float() / n
    assert 0.5 * (freq - probs).abs().sum() < 0.05     # total variation distance


def test_sample_tokens_is_multinomial_on_a_small_vocabulary():
    """Up to MULTINOMIAL_MAX_VOCAB entries the draws are torch.multinomial's, seed for seed (the tiny records)."""
    probs = torch.rand(8, 512, generator=torch.Generator().manual_seed(1)).softmax(-1)
    torch.manual_seed(3)
    expected = torch.multinomial(probs, 1)[:, 0]
    torch.manual_seed(3)
    assert torch.equal(evaluation.sample_tokens(probs), expected)


def test_sample_tokens_draws_the_distribution_on_a_large_vocabulary(monkeypatch):
    """Above MULTINOMIAL_MAX_VOCAB (Qwen's 151,936 tokens): the same distribution, a zero entry never drawn,
    unnormalised rows and the extreme uniform draws included; a row torch.multinomial refuses is refused."""
    monkeypatch.setattr(evaluation, "MULTINOMIAL_MAX_VOCAB", 64)   # the same code at a small size: 40,000 rows of 100
    vocab, n = 100, 40_000
    probs = torch.zeros(vocab, dtype=torch.float32)
    support = torch.tensor([0, 7, 64, 65, vocab - 2])           # first entry in, last entry out (zero)
    probs[support] = torch.tensor([0.05, 0.4, 0.3, 0.05, 0.2])
    rows = probs.expand(n, vocab) * 0.9                         # rows summing to 0.9: weights, not probabilities
    torch.manual_seed(0)
    drawn = evaluation.sample_tokens(rows)
    assert drawn.dtype == torch.int64 and drawn.shape == (n,)
    freq = torch.bincount(drawn, minlength=vocab).double() / n
    assert set(drawn.unique().tolist()) <= set(support.tolist())
    assert (freq[support] - probs[support].double()).abs().max() < 0.01    # 4 standard errors at most
    # torch.rand's largest float64 value: the last nonzero entry; 0: the first nonzero entry
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.full(shape, 1 - 2.0 ** -53, **kw))
    assert evaluation.sample_tokens(rows[:2]).tolist() == [vocab - 2, vocab - 2]
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.zeros(shape, **kw))
    assert evaluation.sample_tokens(rows[:2]).tolist() == [0, 0]
    one_hot = torch.zeros(3, vocab)
    one_hot[:, vocab - 1] = 1.0                                  # the last entry alone: a draw of 0 skips the zeros
    assert evaluation.sample_tokens(one_hot).tolist() == [vocab - 1] * 3
    for bad in (float("nan"), float("inf"), -0.5):               # as torch.multinomial refuses them
        row = one_hot[:1].clone()
        row[0, 3] = bad
        with pytest.raises(ValueError, match="non-negative weights"):
            evaluation.sample_tokens(row)
    with pytest.raises(ValueError, match="positive sum"):
        evaluation.sample_tokens(torch.zeros(1, vocab))


def test_top_p_filter_matches_transformers():
    from transformers.generation.logits_process import TopPLogitsWarper

    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    for top_p in (0.1, 0.5, 0.9):
        expected = TopPLogitsWarper(top_p)(None, logits.clone())
        assert torch.equal(evaluation._top_p_filter(logits, top_p), expected)


def test_decode_reads_each_prompt_once_for_n_rows(model_and_tokenizer):
    """num_return_sequences=n: one prefill per prompt, its cache copied to n adjacent rows that go on
    alone. Near-greedy sampling (T=1e-3) must then give each prompt's greedy answer in all its rows
    (prompts of different lengths, left-padded: the copied cache and positions are right), and first
    tokens at T=0.7 follow each prompt's own tempered softmax."""
    model, tok = model_and_tokenizer
    enc = _chat_batch(tok, 3, seed=2)
    assert enc["attention_mask"].sum(1).unique().numel() > 1           # different prompt lengths
    stops = evaluation.stop_token_ids(tok) + tok("####", add_special_tokens=False)["input_ids"]
    greedy = evaluation.decode(model, enc["input_ids"], enc["attention_mask"], max_new_tokens=32, stop_ids=stops,
                               pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    rows = evaluation.decode(model, enc["input_ids"], enc["attention_mask"], max_new_tokens=32, stop_ids=stops,
                             pad_token_id=tok.pad_token_id, do_sample=True, temperature=1e-3, num_return_sequences=4)
    assert rows.shape == (12, greedy.shape[1])
    assert torch.equal(rows, greedy.repeat_interleave(4, dim=0))

    n, temperature = 3000, 0.7
    with torch.inference_mode():
        probs = (model(**enc).logits[:, -1] / temperature).softmax(-1)   # left padding: the last column is real
    torch.manual_seed(1)
    first = evaluation.decode(model, enc["input_ids"], enc["attention_mask"], max_new_tokens=1,
                              stop_ids=evaluation.stop_token_ids(tok), pad_token_id=tok.pad_token_id,
                              do_sample=True, temperature=temperature, num_return_sequences=n)[:, 0]
    for i in range(3):
        freq = torch.bincount(first[i * n:(i + 1) * n], minlength=probs.shape[1]).float() / n
        assert 0.5 * (freq - probs[i]).abs().sum() < 0.06
    with pytest.raises(ValueError, match="do_sample"):
        evaluation.decode(model, enc["input_ids"], enc["attention_mask"], max_new_tokens=4, stop_ids=stops,
                          pad_token_id=tok.pad_token_id, num_return_sequences=2)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_decode_returns_the_log_probs_a_forward_pass_computes(model_and_tokenizer, top_p):
    """return_logprobs: the same tokens as without it, and each token's log-prob under softmax(logits / T), what a
    forward pass over prompt + answer computes (lesson 07 trains on them as the sampling policy's), 0 after the end;
    top_p filters what is sampled, not the log-probs."""
    model, tok = model_and_tokenizer
    enc = _chat_batch(tok, 3, seed=5)
    stops = evaluation.stop_token_ids(tok) + tok("####", add_special_tokens=False)["input_ids"]
    kw = dict(max_new_tokens=48, stop_ids=stops, pad_token_id=tok.pad_token_id, do_sample=True, temperature=0.7,
              top_p=top_p, num_return_sequences=2)
    torch.manual_seed(1)
    plain = evaluation.decode(model, enc["input_ids"], enc["attention_mask"], **kw)
    torch.manual_seed(1)
    tokens, logps = evaluation.decode(model, enc["input_ids"], enc["attention_mask"], return_logprobs=True, **kw)
    assert torch.equal(tokens, plain) and logps.shape == tokens.shape and logps.dtype == torch.float32
    ended = torch.isin(tokens, torch.tensor(stops))
    mask = (ended.cumsum(1) - ended.long()) == 0                       # up to and including the stop token
    assert not mask.all() and mask.any(1).all()
    ids = torch.cat([enc["input_ids"].repeat_interleave(2, 0), tokens], 1)
    attention = torch.cat([enc["attention_mask"].repeat_interleave(2, 0), mask.long()], 1)
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=attention,
                       position_ids=(attention.cumsum(1) - 1).clamp(min=0)).logits[:, -tokens.shape[1] - 1:-1]
    expected = (logits / 0.7).log_softmax(-1).gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(logps[mask], expected[mask], atol=1e-5, rtol=1e-5)
    assert (logps[~mask] == 0).all() and (logps[mask] <= 0).all()


def _qwen2_standin():
    """A small random Qwen2 (biases on q/k/v, no query-key norms, one query head per key head): the
    architecture of the t4-16g preset's Qwen2.5, at the tiny model's vocabulary."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                         rope_theta=1e6, tie_word_embeddings=True, attn_implementation="sdpa")
    return Qwen2ForCausalLM(config).eval()


def _with_lora(model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                            init_lora_weights=False))
    return lora.eval()


@pytest.mark.parametrize("which", ["tiny", "tiny+lora", "qwen2"])
def test_static_cache_steps_give_the_models_own_logits_bit_for_bit(model_and_tokenizer, monkeypatch, which):
    """decode with the static cache against decode through the model's forward (transformers' cache): the same
    tokens and log-probs, bit for bit, with left padding, rows ending at different steps, n rows per prompt."""
    tiny_model, tok = model_and_tokenizer
    model = {"tiny": lambda: tiny_model, "tiny+lora": lambda: _with_lora(tiny.load()[0]),
             "qwen2": _qwen2_standin}[which]()
    problems = data.make_problems(6, "test", seed=3)
    enc = tok(evaluation.format_prompts(tok, problems, "chat")[:6:2] + [data.to_plain_prompt(problems[1])],
              return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    assert not enc["attention_mask"].all(), "the batch should hold left padding"
    stops = evaluation.stop_token_ids(tok) + [14, 338, 376] + list(range(100, 140))   # rows end at different steps

    def run(**kw):
        torch.manual_seed(7)
        return evaluation.decode(model, enc["input_ids"], enc["attention_mask"], max_new_tokens=24, stop_ids=stops,
                                 pad_token_id=tok.pad_token_id, return_logprobs=True, **kw)

    used = []
    build = evaluation.StaticCacheDecoder.build
    monkeypatch.setattr(evaluation.StaticCacheDecoder, "build",
                        classmethod(lambda cls, *a: used.append(build(*a)) or used[-1]))
    fast = [run(), run(do_sample=True, num_return_sequences=3, temperature=1.3)]
    assert all(d is not None for d in used), "the static cache should serve this model"
    monkeypatch.setattr(evaluation.StaticCacheDecoder, "build", classmethod(lambda cls, *a: None))
    slow = [run(), run(do_sample=True, num_return_sequences=3, temperature=1.3)]
    for (tokens, logps), (ref_tokens, ref_logps) in zip(fast, slow):
        assert torch.equal(tokens, ref_tokens)
        assert torch.equal(logps, ref_logps), (logps - ref_logps).abs().max()
    lengths = (slow[1][0] != tok.pad_token_id).sum(1)
    assert len(set(lengths.tolist())) > 2, "rows should end at different steps"


def test_static_cache_is_not_used_where_equality_is_not_established(model_and_tokenizer):
    from transformers import DynamicCache

    model, tok = model_and_tokenizer
    enc = tok(["Question: 1 + 1?"], return_tensors="pt")
    cache = DynamicCache(config=model.config)
    model(**enc, past_key_values=cache, use_cache=True)
    assert evaluation.StaticCacheDecoder.build(model, cache, enc["attention_mask"], 40) is not None
    model.config._attn_implementation = "eager"
    try:
        assert evaluation.StaticCacheDecoder.build(model, cache, enc["attention_mask"], 40) is None
    finally:
        model.config._attn_implementation = "sdpa"
    # a hook or a forward of its own on a module the step bypasses, or training mode: the model's own forward
    layer = model.model.layers[0]
    handle = layer.self_attn.register_forward_hook(lambda *a: None)
    try:
        assert evaluation.StaticCacheDecoder.build(model, cache, enc["attention_mask"], 40) is None
    finally:
        handle.remove()
    layer.forward = layer.forward                       # an instance attribute, as a patch would be
    try:
        assert evaluation.StaticCacheDecoder.build(model, cache, enc["attention_mask"], 40) is None
    finally:
        del layer.forward
    model.train()
    try:
        assert evaluation.StaticCacheDecoder.build(model, cache, enc["attention_mask"], 40) is None
    finally:
        model.eval()
    assert evaluation.StaticCacheDecoder.build(model, cache, enc["attention_mask"], 40) is not None


def test_static_cache_takes_grpo_trainers_model_with_trls_fused_lm_head(model_and_tokenizer):
    """GRPOTrainer patches the model's forward with TRL's fused LM head, which is the original forward unless asked
    (add_fused_lm_head's docstring): lesson 04's rollouts (rl.decode_rollout) keep the static cache."""
    import copy

    from peft import LoraConfig, get_peft_model
    from transformers import DynamicCache
    from trl.trainer.utils import add_fused_lm_head

    model, tok = model_and_tokenizer
    model = copy.deepcopy(model)
    add_fused_lm_head(model)
    assert "forward" in vars(model)
    policy = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).eval()
    enc = tok(["Question: 1 + 1?"], return_tensors="pt")
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        policy(**enc, past_key_values=cache, use_cache=True)
    assert evaluation.StaticCacheDecoder.build(policy, cache, enc["attention_mask"], 40) is not None
