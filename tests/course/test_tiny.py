"""The embedded tiny model: loads like a Hub model, is Qwen-shaped, and leaves room to learn."""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3ForCausalLM

from utils import data
from utils.course import tiny

MANIFEST = json.loads((tiny.TINY_MODEL_DIR / "manifest.json").read_text())


def test_loads_with_auto_classes():
    model = AutoModelForCausalLM.from_pretrained(tiny.TINY_MODEL_DIR)
    tok = AutoTokenizer.from_pretrained(tiny.TINY_MODEL_DIR)
    assert isinstance(model, Qwen3ForCausalLM)
    n = sum(p.numel() for p in model.parameters())
    assert 1_000_000 <= n <= 5_000_000 and n == MANIFEST["parameters"]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


def test_committed_size_under_20_mb():
    size = sum(p.stat().st_size for p in tiny.TINY_MODEL_DIR.iterdir())
    assert size < 20 * 2**20


def test_tokenizer_is_qwen_like():
    tok = AutoTokenizer.from_pretrained(tiny.TINY_MODEL_DIR)
    for t in tiny.SPECIAL_TOKENS:
        assert len(tok(t, add_special_tokens=False)["input_ids"]) == 1, t
    digits = tok("1234", add_special_tokens=False)["input_ids"]
    assert [tok.decode([i]) for i in digits] == ["1", "2", "3", "4"]
    text = "Zoë paid $3.50 — 日本 ✓"  # bytes it never saw still round-trip (byte-level BPE)
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_manifest_metrics_leave_room_for_post_training():
    m = MANIFEST["metrics"]
    assert 0.2 <= m["plain_greedy_accuracy"] <= 0.6
    assert m["plain_pass@8_t1"] >= m["plain_pass@1_t1"] + 0.15
    assert m["chat_format_compliance"] <= 0.05
    assert MANIFEST["build_seconds"]["total"] <= 15 * 60


def test_greedy_accuracy_reproduces_manifest_on_a_slice():
    """The committed weights are the ones the manifest was measured on."""
    model, tok = tiny.load()
    from utils import evaluation
    probs = data.make_problems(MANIFEST["metrics"]["n_test_greedy"], "test", seed=0)[:100]
    res = evaluation.evaluate(model, tok, probs, fmt="plain", max_new_tokens=96, progress=False)
    full = MANIFEST["metrics"]["plain_greedy_accuracy"]
    assert abs(res["accuracy"] - full) < 0.15


def test_pack_documents_rows_start_at_boundaries():
    rows = tiny.pack_documents([[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]], seq_len=4)
    assert rows.tolist() == [[1, 2, 3, 4], [6, 7, 8, 9]]


def test_lr_schedule_warmup_then_inverse_sqrt_independent_of_total_steps():
    r = dict(tiny.RECIPE, steps=100, warmup=10, lr=1.0)
    assert tiny.lr_at(0, r) == pytest.approx(0.1)
    assert tiny.lr_at(9, r) == pytest.approx(1.0)
    assert tiny.lr_at(39, r) == pytest.approx(0.5)
    assert tiny.lr_at(39, dict(r, steps=5000)) == tiny.lr_at(39, r)


def test_build_is_deterministic(tmp_path):
    """Two builds of a shrunken recipe give identical weights (the real one is the same code)."""
    small = dict(steps=3, n_pretrain_problems=300, hidden_size=32, intermediate_size=64, head_dim=16,
                 num_hidden_layers=1, seq_len=64, batch_size=4, metrics=False, log_every=0)
    tiny.build(tmp_path / "a", **small)
    tiny.build(tmp_path / "b", **small)
    from safetensors.torch import load_file
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()
    with pytest.raises(ValueError, match="unknown recipe"):
        tiny.build(tmp_path / "c", bogus=1)
