"""The synthetic GSM8K-style generator, the converters and the GSM8K loader."""
import re

import pytest

from utils import data, rewards

STEP = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")


def test_deterministic_and_seeded():
    a = data.make_problems(50, "train", seed=3)
    assert a == data.make_problems(50, "train", seed=3)
    assert a != data.make_problems(50, "train", seed=4)


def test_splits_are_disjoint_by_construction():
    test_q = {p["question"] for p in data.make_problems(500, "test", seed=0)}
    for seed in (0, 1, 1234):
        train_q = {p["question"] for p in data.make_problems(2000, "train", seed=seed)}
        assert not train_q & test_q
        assert all(data.split_of(q) == "train" for q in train_q)
    assert all(data.split_of(q) == "test" for q in test_q)


@pytest.mark.parametrize("difficulty", [1, 2, 3, "mixed"])
def test_gsm8k_schema_and_correct_arithmetic(difficulty):
    """Every worked step is right and the final line is `#### <the last result>`."""
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a // b}
    for p in data.make_problems(200, "train", seed=1, difficulty=difficulty):
        assert set(p) == {"question", "answer", "difficulty"}
        *steps, last = p["answer"].split("\n")
        assert re.fullmatch(r"#### \d+", last)
        results = []
        for line in steps:
            a, op, b, c = STEP.search(line).groups()
            assert ops[op](int(a), int(b)) == int(c), line
            if op == "/":
                assert int(a) % int(b) == 0
            results.append(int(c))
        assert data.final_answer(p["answer"]) == str(results[-1])
        assert rewards.is_well_formatted(p["answer"])


def test_difficulty_knob_controls_steps_and_sizes():
    def mean_steps(d):
        ps = data.make_problems(300, "train", seed=0, difficulty=d)
        return sum(p["answer"].count("\n") for p in ps) / len(ps)
    assert mean_steps(1) < mean_steps(2) < mean_steps(3)
    assert all(int(data.final_answer(p["answer"])) <= 30 * 30
               for p in data.make_problems(300, "train", seed=0, difficulty=1))


def test_bad_arguments():
    with pytest.raises(ValueError, match="split"):
        data.make_problems(1, "validation")
    with pytest.raises(ValueError, match="difficulty"):
        data.make_problems(1, difficulty=7)


def test_converters():
    p = {"question": "Q?", "answer": "step\n#### 3"}
    assert data.to_plain_prompt(p) == "Question: Q?\nAnswer:\n"
    assert data.to_text(p) == "Question: Q?\nAnswer:\nstep\n#### 3"
    assert data.to_messages(p) == [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "step\n#### 3"}]
    assert data.to_messages(p, system="S")[0] == {"role": "system", "content": "S"}
    pc = data.to_prompt_completion(p)
    assert pc == {"prompt": [{"role": "user", "content": "Q?"}],
                  "completion": [{"role": "assistant", "content": "step\n#### 3"}]}
    pref = data.to_preference(p, chosen="a\n#### 3", rejected="b\n#### 4")
    assert pref["prompt"] == pc["prompt"]
    assert pref["chosen"][0]["content"] == "a\n#### 3" and pref["rejected"][0]["role"] == "assistant"
    assert data.pretraining_stream([p, p]) == data.to_text(p) + "\n\n" + data.to_text(p)


def _write_gsm8k_standin(root, n=12):
    """A local folder laid out like the Hub's openai/gsm8k repository (config `main`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    (root / "main").mkdir(parents=True)
    for split in ("train", "test"):
        rows = data.make_problems(n, split, seed=0)
        table = pa.table({"question": [r["question"] for r in rows], "answer": [r["answer"] for r in rows]})
        pq.write_table(table, root / "main" / f"{split}-00000-of-00001.parquet")

def test_shortcut_answers():
    p = data.make_problems(1, "train", seed=0, difficulty=2)[0]
    s = data.shortcut(p)
    truth = data.final_answer(p["answer"])
    assert s["answer"] == f"The answer is {truth}.\n#### {truth}" and s["question"] == p["question"]
    assert rewards.is_well_formatted(s["answer"]) and "answer" in p and p["answer"] != s["answer"], "input unchanged"
    assert data.is_shortcut(s["answer"]) and not data.is_shortcut(p["answer"])
    assert data.is_shortcut("Let me think step by step.\nThe answer is 7.\n#### 7")
    assert not data.is_shortcut("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 24"), "GSM8K working"
    for junk in ("", "####", None, 42, "#### 3 = 3"):
        assert data.is_shortcut(junk) is True



def test_load_gsm8k_from_a_local_standin(tmp_path):
    _write_gsm8k_standin(tmp_path)
    rows = data.load_gsm8k("test", source=str(tmp_path))
    assert len(rows) == 12 and set(rows[0]) == {"question", "answer"}
    assert data.load_gsm8k("train", n=5, source=str(tmp_path), seed=1) == data.load_gsm8k("train", n=5, source=str(tmp_path), seed=1)
    assert len(data.load_problems(str(tmp_path), "train", 5)) == 5
    with pytest.raises(FileNotFoundError):
        data.load_gsm8k("train", source=str(tmp_path / "main"))


def test_load_gsm8k_hub_unreachable_is_a_clear_error(monkeypatch):
    from utils import runtime
    monkeypatch.setattr(runtime, "hub_reachable", lambda *a, **k: False)
    with pytest.raises(RuntimeError, match="HF_ENDPOINT"):
        data.load_gsm8k("train")
