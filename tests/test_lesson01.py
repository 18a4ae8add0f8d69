"""Lesson 01 runs end to end on `tiny` under papermill and shows the SFT effect in its records."""
import pytest


@pytest.fixture(scope="module")
def records(lesson_runs):
    return lesson_runs.records("01")


def test_sft_teaches_the_chat_format(records):
    assert records["01/preset"] == "tiny"
    assert records["01/format_compliance_after"] >= 0.9
    assert records["01/format_compliance_after"] > records["01/format_compliance_before"]
    assert records["01/format_compliance_before"] <= 0.1, "the tiny model should not know the chat format before SFT"


def test_every_training_variant_recorded(records):
    for key in ("hand_format_compliance", "lora_format_compliance", "nomask_format_compliance",
                "accuracy_before", "accuracy_after", "answer_loss_masked", "answer_loss_unmasked"):
        value = records[f"01/{key}"]
        assert isinstance(value, float) and value >= 0, key
    assert 0 < records["01/lora_trainable_share"] < 0.5
    assert records["01/hand_format_compliance"] >= 0.8, "the hand-written loop should learn the format too"
