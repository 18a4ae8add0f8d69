"""utils.course.qwen_tokenizers: Qwen's tokenizers built offline, against published ids and encodings."""
import pytest

from utils.course import qwen_tokenizers as qt
from utils.course import twins

# transformers' own Qwen2 tokenizer integration test (tests/models/qwen2/test_tokenization_qwen2.py,
# test_tokenizer_integration, "Qwen/Qwen-tokenizer"): its three sequences and their ids, padding left out.
PUBLISHED = [
    ("Transformers (formerly known as pytorch-transformers and pytorch-pretrained-bert) provides "
     "general-purpose architectures (BERT, GPT-2, RoBERTa, XLM, DistilBert, XLNet...) for Natural "
     "Language Understanding (NLU) and Natural Language Generation (NLG) with over 32+ pretrained "
     "models in 100+ languages and deep interoperability between Jax, PyTorch and TensorFlow.",
     [8963, 388, 320, 69514, 3881, 438, 4510, 27414, 32852, 388, 323, 4510, 27414, 21334, 35722, 1455, 529, 8, 5707,
      4586, 58238, 77235, 320, 61437, 11, 479, 2828, 12, 17, 11, 11830, 61437, 64, 11, 1599, 10994, 11, 27604, 321,
      33, 529, 11, 29881, 6954, 32574, 369, 18448, 11434, 45451, 320, 45, 23236, 8, 323, 18448, 11434, 23470, 320,
      30042, 38, 8, 448, 916, 220, 18, 17, 10, 80669, 4119, 304, 220, 16, 15, 15, 10, 15459, 323, 5538, 94130,
      2897, 1948, 619, 706, 11, 5355, 51, 21584, 323, 94986, 13]),
    ("🤗 Transformers 提供了可以轻松地下载并且训练先进的预训练模型的 API 和工具。使用预训练模型可以减少计算消耗和碳排放，"
     "并且节省从头训练所需要的时间和资源。",
     [144834, 80532, 93685, 83744, 34187, 73670, 104261, 29490, 62189, 103937, 104034, 102830, 98841, 104034,
      104949, 9370, 5333, 58143, 102011, 1773, 37029, 98841, 104034, 104949, 73670, 101940, 100768, 104997, 33108,
      100912, 105054, 90395, 100136, 106831, 45181, 64355, 104034, 113521, 101975, 33108, 85329, 1773]),
    ('```python\ntokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen-tokenizer")\ntokenizer("世界，你好！")```',
     [73594, 12669, 198, 85593, 284, 8979, 37434, 6387, 10442, 35722, 445, 48, 16948, 45274, 16948, 34841, 3135,
      1138, 85593, 445, 99489, 3837, 108386, 6313, 899, 73594]),
]
QWEN2_5, QWEN3 = "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen3-1.7B-Base"


@pytest.fixture(scope="module", params=[QWEN2_5, QWEN3])
def model_id(request):
    return request.param


@pytest.fixture(scope="module")
def tok(model_id, qwen_tokenizer):
    return qwen_tokenizer(model_id)


def test_every_gpu_preset_model_has_a_tokenizer():
    assert set(qt.MODELS) == set(twins.ARCHITECTURES)


def test_vocabulary_and_added_tokens_at_their_published_ids(model_id, tok):
    n_added = qt.MODELS[model_id]["added"]
    assert len(tok) == qt.FIRST_ADDED_ID + n_added == {QWEN2_5: 151665, QWEN3: 151669}[model_id]
    assert len(tok) <= twins.ARCHITECTURES[QWEN3]["vocab_size"] == 151936   # the models' embedding rows
    for i, (content, special) in enumerate(qt.ADDED_TOKENS[:n_added]):
        assert tok.convert_tokens_to_ids(content) == qt.FIRST_ADDED_ID + i
        assert tok.encode(content, add_special_tokens=False) == [qt.FIRST_ADDED_ID + i], content
        assert (content in tok.all_special_tokens) == special, content
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token, tok.pad_token_id) == ("<|im_end|>", 151645,
                                                                                  "<|endoftext|>", 151643)
    assert tok.bos_token is None
    if model_id == QWEN3:
        assert tok.convert_tokens_to_ids(["<tool_response>", "</tool_response>", "<think>", "</think>"]) == [
            151665, 151666, 151667, 151668]
    else:   # Qwen2.5 spells them out in the base vocabulary
        assert len(tok.encode("<think>", add_special_tokens=False)) > 1


@pytest.mark.parametrize("text, ids", PUBLISHED, ids=["english", "chinese", "code"])
def test_encodings_match_the_published_ones(tok, text, ids):
    assert tok.encode(text, add_special_tokens=False) == ids
    assert tok.decode(ids) == text


def test_special_tokens_split_the_text_and_nfc_normalizes(tok):
    assert tok.encode("<|im_start|>hello<|im_end|>", add_special_tokens=False) == [151644, 14990, 151645]
    # the three characters whose NFC, NFD, NFKC and NFKD forms all differ: only NFC is applied
    assert tok.backend_tokenizer.normalizer.normalize_str("\u03d2\u0301\u03d2\u0308\u017f\u0307") == "\u03d3\u03d4\u1e9b"


def test_chat_templates_are_qwens_as_trl_ships_them(model_id, tok):
    from trl.chat_template_utils import (
        get_training_chat_template,
        is_chat_template_prefix_preserving,
        qwen2_5_training_chat_template,
        qwen3_training_chat_template,
        supports_tool_calling,
    )

    qwen3 = model_id == QWEN3
    assert tok.chat_template == qt.chat_template("qwen3" if qwen3 else "qwen2_5")
    assert supports_tool_calling(tok)
    # Qwen3's template gives the last assistant turn an empty think block that earlier turns lose
    assert is_chat_template_prefix_preserving(tok) is not qwen3
    assert get_training_chat_template(tok) == (qwen3_training_chat_template if qwen3 else qwen2_5_training_chat_template)
    text = tok.apply_chat_template([{"role": "user", "content": "2 + 2?"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n")


def test_built_once_then_loaded_from_the_cache(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from utils.constants import TINY_MODEL_DIR

    builds = []
    monkeypatch.setattr(qt, "build", lambda model_id: builds.append(model_id) or AutoTokenizer.from_pretrained(
        TINY_MODEL_DIR))
    first = qt.qwen_tokenizer(QWEN3, cache_dir=tmp_path)
    again = qt.qwen_tokenizer("Qwen/Qwen3-4B-Base", cache_dir=tmp_path)   # the same tokenizer: the same folder
    assert builds == [QWEN3] and len(first) == len(again)
    (folder,) = tmp_path.iterdir()                                      # no half-built folder left behind
    assert folder.name.startswith("qwen3-26-v1-transformers") and (folder.stat().st_mode & 0o777) == 0o755
    assert again.chat_template == qt.chat_template("qwen3")               # TRL's, set on loading


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match="no offline tokenizer for 'Qwen/Qwen9'; known: Qwen/Qwen2.5-0.5B-Instruct"):
        qt.qwen_tokenizer("Qwen/Qwen9")
