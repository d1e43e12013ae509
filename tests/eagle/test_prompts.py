"""eagle/prompts.py: standard prompt suites read from local files in their published formats (each
test writes its own small file in that format: no hub), their format told from the first record,
each prompt's category; bad records named by file and line. Pure: no model is loaded."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from eagle.prompts import PromptFileError, metric_key, read_prompt_messages, read_prompt_suite


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


MT_BENCH = [  # FastChat llm_judge/data/mt_bench/question.jsonl
    {"question_id": 81, "category": "writing", "turns": ["Compose a travel blog post about Hawaii.",
                                                           "Rewrite it starting every sentence with A."]},
    {"question_id": 111, "category": "math", "turns": ["The vertices of a triangle are at (0, 0), (-1, 1) and (3, 3). "
                                                        "What is its area?", "What is the circle's area?"],
     "reference": ["3", "5 pi"]},
    {"question_id": 82, "category": "writing", "turns": ["Draft an email to your supervisor.", "Now shorter."]},
]
SPEED_BENCH = [  # nvidia/SPEED-Bench, qualitative config
    {"question_id": "q-0001", "category": "coding", "sub_category": "python", "turns": ["Write a quicksort."],
     "source": "humaneval", "src_id": "7", "difficulty": "easy", "multiturn": False},
    {"question_id": "q-0002", "category": "rag", "sub_category": "news", "turns": ["Summarise: ...", "And?"],
     "source": "x", "src_id": "8", "difficulty": "hard", "multiturn": True},
]
GSM8K = [  # openai/grade-school-math grade_school_math/data/test.jsonl
    {"question": "Janet's ducks lay 16 eggs per day. How many does she sell?", "answer": "... #### 18"},
    {"question": "A robe takes 2 bolts of blue fiber. How many bolts in total?", "answer": "... #### 3"},
]
HUMANEVAL = [  # openai/human-eval data/HumanEval.jsonl.gz
    {"task_id": "HumanEval/0", "prompt": "def has_close_elements(numbers, threshold):\n    \"\"\"...\"\"\"\n",
     "canonical_solution": "    return False\n", "test": "def check(candidate): pass\n",
     "entry_point": "has_close_elements"},
]


def test_each_published_format_is_told_from_its_fields(tmp_path: Path) -> None:
    mt = read_prompt_suite(_jsonl(tmp_path / "question.jsonl", MT_BENCH))
    assert mt.format == "mt-bench" and mt.categories == ["writing", "math", "writing"]
    assert mt.prompts[0].messages == [{"role": "user", "content": "Compose a travel blog post about Hawaii."}]
    speed = read_prompt_suite(_jsonl(tmp_path / "speed.jsonl", SPEED_BENCH))
    assert speed.format == "speed-bench" and speed.categories == ["coding", "rag"]
    assert speed.prompts[1].messages[0]["content"] == "Summarise: ..."  # the first turn
    gsm = read_prompt_suite(_jsonl(tmp_path / "test.jsonl", GSM8K))
    assert gsm.format == "gsm8k" and gsm.categories == ["gsm8k", "gsm8k"]
    assert gsm.prompts[0].messages[0]["content"].startswith("Janet's ducks")
    he_file = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(he_file, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in HUMANEVAL)
    he = read_prompt_suite(he_file)
    assert he.format == "humaneval" and he.prompts[0].messages[0]["content"].startswith("def has_close_elements")
    chat = read_prompt_suite(_jsonl(tmp_path / "chat.jsonl", [
        {"messages": [{"role": "user", "content": "hi"}], "category": "greet"}, {"prompt": "bye"}]))
    assert chat.format == "chat" and chat.categories == ["greet", None]
    assert read_prompt_messages(tmp_path / "question.jsonl", limit=1) == [mt.prompts[0].messages]


def test_speed_bench_parquet_and_a_json_array(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(SPEED_BENCH), tmp_path / "qualitative.parquet")
    suite = read_prompt_suite(tmp_path / "qualitative.parquet")
    assert suite.format == "speed-bench" and suite.categories == ["coding", "rag"]
    (tmp_path / "q.json").write_text(json.dumps(MT_BENCH))
    assert read_prompt_suite(tmp_path / "q.json", limit=2).categories == ["writing", "math"]


def test_a_forced_format_and_bad_records_are_named(tmp_path: Path) -> None:
    gsm = _jsonl(tmp_path / "g.jsonl", GSM8K)
    with pytest.raises(PromptFileError, match=r"g.jsonl:1: a mt-bench record needs 'turns'"):
        read_prompt_suite(gsm, suite_format="mt-bench")
    bad = _jsonl(tmp_path / "b.jsonl", [GSM8K[0], {"question": "", "answer": "1"}])
    with pytest.raises(PromptFileError, match=r"b.jsonl:2: a gsm8k record needs 'question' as a non-empty string"):
        read_prompt_suite(bad)
    odd = _jsonl(tmp_path / "o.jsonl", [{"text": "hello", "label": 1}])
    with pytest.raises(PromptFileError, match=r"o.jsonl:1: cannot tell the prompt format .*label, text.*--suite-format"):
        read_prompt_suite(odd)
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(PromptFileError, match="not a readable Parquet file"):
        read_prompt_suite(tmp_path / "broken.parquet")
    (tmp_path / "broken.jsonl.gz").write_bytes(b"\x1f\x8b\x08garbage")
    with pytest.raises(PromptFileError, match="broken.jsonl.gz: cannot read it"):
        read_prompt_suite(tmp_path / "broken.jsonl.gz")
    assert metric_key("Math Reasoning") == "math_reasoning" and metric_key("mt-bench") == "mt_bench"


def test_the_cli_names_a_bad_suite_format_without_loading_a_model(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from eagle.cli import cli

    res = CliRunner().invoke(cli, ["evaluate", "--model", str(tmp_path), "--draft", str(tmp_path), "--prompts",
                                   str(tmp_path / "p.jsonl"), "--suite-format", "alpaca"])
    assert res.exit_code == 2 and "--suite-format" in res.output and "mt-bench" in res.output
