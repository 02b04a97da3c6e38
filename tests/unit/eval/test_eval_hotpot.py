import json

import pytest
from typer.testing import CliRunner

from workflows.cli import app
from xh.eval.hotpot import METRIC_KEYS, answer_scores, evaluate_hotpot, evaluate_hotpot_files, normalize_answer
from xh.storage.jsonfiles import InputFileError as EvalInputError


def question(qid: str, answer: str, facts: list, kind: str = "bridge") -> dict:
    return {"_id": qid, "answer": answer, "supporting_facts": facts, "type": kind}


@pytest.mark.shared_data
def test_known_answer_pair_equals_the_official_script(shared_data):
    folder = shared_data / "hotpotqa"
    official = json.loads((folder / "pred_train_sample500.official_metrics.json").read_text())
    result = evaluate_hotpot_files(
        str(folder / "hotpot_train_sample500.json"), str(folder / "pred_train_sample500.json")
    )
    assert set(result) == set(official) == set(METRIC_KEYS)
    for key, value in official.items():
        assert result[key] == pytest.approx(value, abs=1e-9), key


@pytest.mark.shared_data
def test_known_answer_slices_add_up_to_the_whole(shared_data):
    folder = shared_data / "hotpotqa"
    result = evaluate_hotpot_files(
        str(folder / "hotpot_train_sample500.json"), str(folder / "pred_train_sample500.json"), slices=True
    )
    bridge, comparison = result["slices"]["bridge"], result["slices"]["comparison"]
    assert (bridge["questions"], comparison["questions"]) == (409, 91)  # as the data README says
    # the file's deliberately missing predictions: 24 answers, 27 supporting-fact lists
    assert bridge["missing_answer"] + comparison["missing_answer"] == 24
    assert bridge["missing_sp"] + comparison["missing_sp"] == 27
    for key in METRIC_KEYS:
        weighted = (409 * bridge[key] + 91 * comparison[key]) / 500
        assert weighted == pytest.approx(result[key], abs=1e-12), key


def test_normalize_answer_is_the_official_one():
    assert normalize_answer("The  Beatles!") == "beatles"
    assert normalize_answer("An apple, a pear & THE plum.") == "apple pear plum"
    assert normalize_answer("theatre") == "theatre"  # articles are whole words only
    assert normalize_answer("U.S.A.") == "usa"


def test_token_f1_counts_repeated_tokens_once_per_match():
    em, f1, prec, recall = answer_scores("the big red dog", "Red dog")
    assert (em, prec, recall) == (0.0, 2 / 3, 1.0)
    assert f1 == pytest.approx(0.8)
    assert answer_scores("dog dog", "dog")[1:] == (pytest.approx(2 / 3), 0.5, 1.0)
    assert answer_scores("", "dog") == (0.0, 0.0, 0.0, 0.0)


def test_yes_no_noanswer_rule_zeroes_partial_overlap():
    assert answer_scores("yes", "no") == (0.0, 0.0, 0.0, 0.0)
    assert answer_scores("Yes.", "yes") == (1.0, 1.0, 1.0, 1.0)
    # the tokens overlap, but the gold is "yes": no partial credit
    assert answer_scores("yes indeed", "yes") == (0.0, 0.0, 0.0, 0.0)
    assert answer_scores("no", "no way home") == (0.0, 0.0, 0.0, 0.0)
    assert answer_scores("noanswer", "paris") == (0.0, 0.0, 0.0, 0.0)


def test_joint_metrics_multiply_answer_and_supporting_fact_scores():
    gold = [question("q1", "red dog", [["A", 0], ["B", 1]])]
    # answer: precision 1/2, recall 1; supporting facts: precision 1/2, recall 1/2
    prediction = {"answer": {"q1": "red dog house cat"}, "sp": {"q1": [["A", 0], ["C", 2]]}}
    result = evaluate_hotpot(gold, prediction)
    assert (result["prec"], result["recall"]) == (0.5, 1.0)
    assert (result["sp_prec"], result["sp_recall"], result["sp_em"]) == (0.5, 0.5, 0.0)
    assert result["joint_prec"] == 0.25 and result["joint_recall"] == 0.5
    assert result["joint_f1"] == pytest.approx(2 * 0.25 * 0.5 / 0.75)
    assert result["joint_em"] == 0.0


def test_supporting_facts_are_sets_of_pairs_and_not_checked_against_paragraphs():
    # a repeated fact counts once; sentence 99 is past any paragraph's end and still matches
    gold = [question("q1", "x", [["A", 0], ["B", 99]])]
    prediction = {"answer": {"q1": "x"}, "sp": {"q1": [["B", 99], ["A", 0], ["A", 0]]}}
    result = evaluate_hotpot(gold, prediction)
    assert result["sp_em"] == result["joint_em"] == result["joint_f1"] == 1.0


def test_missing_predictions_score_zero_and_averages_cover_all_gold_questions():
    gold = [
        question("q1", "Paris", [["A", 0]]),
        question("q2", "yes", [["B", 0]], "comparison"),
        question("q3", "Rome", [["C", 1]]),
    ]
    prediction = {
        "answer": {"q1": "Paris", "q3": "Rome", "other": "ignored"},  # q2 has no answer
        "sp": {"q1": [["A", 0]], "q2": [["B", 0]]},  # q3 has no supporting facts
    }
    result = evaluate_hotpot(gold, prediction, slices=True)
    assert result["em"] == pytest.approx(2 / 3)
    assert result["sp_em"] == pytest.approx(2 / 3)
    assert result["joint_em"] == pytest.approx(1 / 3)  # only q1 has both
    assert result["slices"]["comparison"] == {
        "questions": 1,
        "missing_answer": 1,
        "missing_sp": 0,
        **dict.fromkeys(METRIC_KEYS, 0.0),
        "sp_em": 1.0,
        "sp_f1": 1.0,
        "sp_prec": 1.0,
        "sp_recall": 1.0,
    }
    assert result["slices"]["bridge"]["questions"] == 2 and result["slices"]["bridge"]["missing_sp"] == 1


@pytest.mark.parametrize(
    "gold, prediction, message",
    [
        ([], {"answer": {}, "sp": {}}, "non-empty JSON array"),
        ([question("q1", "x", [])], {"answer": {}}, '"sp"'),
        ([question("q1", "x", [])], {"answer": {"q1": 3}, "sp": {}}, "answer for q1 is not a string"),
        ([question("q1", "x", [])], {"answer": {}, "sp": {"q1": [["A", "0"]]}}, "sp for q1"),
        ([{"_id": "q1", "supporting_facts": []}], {"answer": {}, "sp": {}}, "no string 'answer'"),
    ],
)
def test_malformed_input_is_a_one_line_error(gold, prediction, message):
    with pytest.raises(EvalInputError, match=message) as caught:
        evaluate_hotpot(gold, prediction)
    assert "\n" not in str(caught.value)


def write(path, value) -> str:
    path.write_text(json.dumps(value))
    return str(path)


def test_cli_prints_one_json_object(tmp_path):
    gold = write(tmp_path / "gold.json", [question("q1", "red dog", [["A", 0]])])
    pred = write(tmp_path / "pred.json", {"answer": {"q1": "the red dog"}, "sp": {"q1": [["A", 0]]}})
    result = CliRunner().invoke(app, ["eval", "hotpot", "--gold", gold, "--pred", pred, "--slices"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert {k: printed[k] for k in METRIC_KEYS} == dict.fromkeys(METRIC_KEYS, 1.0)
    assert printed["slices"]["bridge"]["questions"] == 1


def test_cli_wrong_path_and_malformed_file_exit_2_with_one_line(tmp_path):
    gold = write(tmp_path / "gold.json", [question("q1", "x", [])])
    broken = tmp_path / "pred.json"
    broken.write_text('{"answer": {"q1": "x"}, "sp": ')
    for args, message in [
        (["--gold", str(tmp_path / "absent.json"), "--pred", str(broken)], "no such file"),
        (["--gold", gold, "--pred", str(broken)], "is not valid JSON"),
        (["--gold", gold, "--pred", write(tmp_path / "list.json", [])], "list.json: expected {"),
    ]:
        result = CliRunner().invoke(app, ["eval", "hotpot", *args])
        assert result.exit_code == 2
        assert result.stdout == ""
        assert result.stderr.startswith("error: ") and message in result.stderr
        assert result.stderr.count("\n") == 1
