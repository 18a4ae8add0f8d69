"""Lesson 06 runs end to end on `tiny` under papermill; its records show each effect it claims."""
import pytest


@pytest.fixture(scope="module")
def records(lesson_runs):
    return lesson_runs.records("06")


def test_from_scratch_nf4_is_bitsandbytes(records):
    assert records["06/nf4_same_bytes_as_bitsandbytes"] is True
    assert records["06/nf4_max_abs_diff_vs_bitsandbytes"] == 0


def test_error_of_each_method(records):
    err = {k.split("/")[-1]: v for k, v in records.items() if k.startswith("06/relative_error/")}
    assert err["int8_per_row"] < err["int8_per_tensor"]
    assert err["int8_blocks_of_64"] < err["int8_per_tensor"]
    assert err["nf4_blocks_of_64"] > err["int8_blocks_of_64"], "4 bits lose more than 8"
    assert err["nf4_double_quant."] < 1.05 * err["nf4_blocks_of_64"], "double quantization costs almost nothing"


def test_quantized_model_keeps_accuracy_and_shrinks(records):
    assert records["06/nf4_accuracy_drop"] <= 0.05, "NF4 at most 5 points below fp32 (the lesson's target)"
    fp = records["06/footprint_mb/fp32"]
    assert records["06/footprint_mb/nf4"] < records["06/footprint_mb/int8"] < fp / 2
    assert records["06/perplexity/nf4"] < 1.02 * records["06/perplexity/fp32"]
    assert records["06/perplexity/int8"] < 1.02 * records["06/perplexity/fp32"]


def test_qlora_trains_and_saves_memory(records):
    assert records["06/qlora_format_compliance"] >= 0.9, "QLoRA on the NF4 base learns the chat format"
    mb = {k.split("/")[-1]: v for k, v in records.items() if k.startswith("06/training_mb/")}
    assert mb["qlora_nf4_base"] < mb["lora_bf16_base"] < mb["full_fp32"]


def test_headline_is_declared_and_read_from_the_run(lesson_runs):
    assert len(lesson_runs.headline("06")) >= 2
