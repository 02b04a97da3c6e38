import json

import pytest
from typer.testing import CliRunner

from workflows.cli import app
from xh.eval.fever import METRIC_KEYS, evaluate_fever, evaluate_fever_files
from xh.storage.jsonfiles import InputFileError as EvalInputError

NEI = "NOT ENOUGH INFO"


def claim(cid: int, label: str, *groups: list[tuple[str, int]]) -> dict:
    """A gold claim in paper_dev.jsonl's shape: groups of [annotation_id, evidence_id, page, line]."""
    if label == NEI:
        return {"id": cid, "label": label, "evidence": [[[cid, None, None, None]]]}
    return {
        "id": cid,
        "label": label,
        "evidence": [[[cid, i, page, line] for i, (page, line) in enumerate(g)] for g in groups],
    }


def verdict(label: str, *evidence: tuple[str, int]) -> dict:
    return {"predicted_label": label, "predicted_evidence": [list(e) for e in evidence]}


@pytest.mark.shared_data
def test_known_answer_pair_equals_the_official_scorer(shared_data):
    folder = shared_data / "fever"
    official = json.loads((folder / "predictions_first3000.official_metrics.json").read_text())
    result = evaluate_fever_files(
        str(folder / "paper_dev_first3000.jsonl"), str(folder / "predictions_first3000.jsonl")
    )
    assert set(result) == set(official) == set(METRIC_KEYS)
    for key, value in official.items():
        assert result[key] == pytest.approx(value, abs=1e-9), key


@pytest.mark.shared_data
def test_known_answer_slices_partition_the_claims(shared_data):
    folder = shared_data / "fever"
    gold = [json.loads(line) for line in (folder / "paper_dev_first3000.jsonl").read_text().splitlines()]
    result = evaluate_fever_files(
        str(folder / "paper_dev_first3000.jsonl"), str(folder / "predictions_first3000.jsonl"), slices=True
    )
    slices = result["slices"]
    assert set(slices) == {"single_evidence", "multi_evidence", "not_enough_info"}
    assert slices["not_enough_info"]["claims"] == sum(g["label"] == NEI for g in gold)
    assert sum(s["claims"] for s in slices.values()) == 3000
    weighted = sum(s["claims"] * s["label_accuracy"] for s in slices.values()) / 3000
    assert weighted == pytest.approx(result["label_accuracy"], abs=1e-12)
    assert slices["not_enough_info"]["evidence_precision"] is None
    # a claim that needs two sentences is harder to cover than one that needs one
    assert slices["multi_evidence"]["evidence_recall"] < slices["single_evidence"]["evidence_recall"]


def test_strict_needs_the_right_label_and_a_complete_group():
    gold = [
        claim(1, "SUPPORTS", [("A", 0)], [("B", 1), ("C", 2)]),  # either A0, or B1 with C2
        claim(2, "REFUTES", [("B", 1), ("C", 2)]),
        claim(3, "SUPPORTS", [("A", 0)]),
    ]
    predictions = [
        verdict("supports", ("C", 2), ("B", 1)),  # labels compare in upper case; order does not matter
        verdict("REFUTES", ("B", 1), ("X", 0)),  # half a group: the label is right, the claim is not
        verdict("REFUTES", ("A", 0)),  # evidence right, label wrong
    ]
    result = evaluate_fever(gold, predictions)
    assert result["label_accuracy"] == pytest.approx(2 / 3)
    assert result["fever_score"] == pytest.approx(1 / 3)
    assert result["evidence_recall"] == pytest.approx(2 / 3)  # recall does not look at the label
    assert result["evidence_precision"] == pytest.approx((1.0 + 0.5 + 1.0) / 3)


def test_not_enough_info_is_right_with_or_without_evidence_and_outside_evidence_measures():
    gold = [claim(1, NEI), claim(2, NEI), claim(3, NEI), claim(4, "SUPPORTS", [("A", 0)])]
    predictions = [
        verdict(NEI),
        verdict(NEI, ("Anything", 3), ("Else", 0)),
        verdict("SUPPORTS", ("Anything", 3)),
        verdict("SUPPORTS", ("A", 0), ("B", 0)),
    ]
    result = evaluate_fever(gold, predictions)
    assert result["fever_score"] == result["label_accuracy"] == 0.75
    # precision and recall are averaged over the one verifiable claim only
    assert (result["evidence_precision"], result["evidence_recall"]) == (0.5, 1.0)
    assert result["evidence_f1"] == pytest.approx(2 * 0.5 / 1.5)


def test_evidence_beyond_the_fifth_is_ignored():
    gold = [claim(1, "SUPPORTS", [("A", 0)])]
    wrong_five = [("X", i) for i in range(5)]
    late = evaluate_fever(gold, [verdict("SUPPORTS", *wrong_five, ("A", 0))])
    assert (late["fever_score"], late["evidence_recall"], late["evidence_precision"]) == (0.0, 0.0, 0.0)
    fifth = evaluate_fever(gold, [verdict("SUPPORTS", *wrong_five[:4], ("A", 0), ("X", 9))])
    assert (fifth["fever_score"], fifth["evidence_recall"], fifth["evidence_precision"]) == (1.0, 1.0, 0.2)


def test_empty_predicted_evidence_has_precision_one_and_recall_zero():
    result = evaluate_fever([claim(1, "REFUTES", [("A", 0)])], [verdict("REFUTES")])
    assert (result["fever_score"], result["label_accuracy"]) == (0.0, 1.0)
    assert (result["evidence_precision"], result["evidence_recall"]) == (1.0, 0.0)
    assert result["evidence_f1"] == 0.0


def test_all_zero_evidence_gives_f1_zero_where_the_official_divides_by_zero():
    result = evaluate_fever([claim(1, "REFUTES", [("A", 0)])], [verdict("REFUTES", ("B", 0))])
    assert (result["evidence_precision"], result["evidence_recall"], result["evidence_f1"]) == (0.0, 0.0, 0.0)


def test_slices_by_evidence_count():
    gold = [
        claim(1, "SUPPORTS", [("A", 0), ("B", 0)], [("C", 0)]),
        claim(2, "REFUTES", [("A", 0), ("B", 0)]),
        claim(3, NEI),
    ]
    predictions = [verdict("SUPPORTS", ("C", 0)), verdict("REFUTES", ("A", 0)), verdict(NEI)]
    slices = evaluate_fever(gold, predictions, slices=True)["slices"]
    assert slices["single_evidence"] == {
        "claims": 1,
        "fever_score": 1.0,
        "label_accuracy": 1.0,
        "evidence_precision": 1.0,
        "evidence_recall": 1.0,
        "evidence_f1": 1.0,
    }
    assert slices["multi_evidence"]["claims"] == 1 and slices["multi_evidence"]["fever_score"] == 0.0
    assert slices["not_enough_info"]["fever_score"] == 1.0


@pytest.mark.parametrize(
    "gold, predictions, message",
    [
        ([claim(1, NEI)], [], "0 predictions for 1 gold claims"),
        ([claim(1, NEI)], [{"id": 2, **verdict(NEI)}], "line 1: id 2 differs from the gold line's 1"),
        ([claim(1, NEI)], [{"label": "SUPPORTS", **verdict(NEI)}], "label 'SUPPORTS' differs"),
        ([claim(1, NEI)], [verdict("SUPPORTED")], "predicted_label 'SUPPORTED' is not one of"),
        ([claim(1, NEI)], [{"predicted_label": NEI}], "'predicted_evidence' is not a list"),
        ([claim(1, NEI)], [verdict(NEI, ("A", "0"))], "'predicted_evidence' is not a list"),
        ([{"id": 1, "label": "TRUE", "evidence": []}], [verdict(NEI)], "label 'TRUE' is not one of"),
        (
            [{"id": 1, "label": "SUPPORTS", "evidence": [["A", 0]]}],
            [verdict(NEI)],
            "'evidence' is not a list of groups",
        ),
        ([], [], "no claims"),
    ],
)
def test_malformed_input_is_a_one_line_error(gold, predictions, message):
    with pytest.raises(EvalInputError, match=message) as caught:
        evaluate_fever(gold, predictions)
    assert "\n" not in str(caught.value)


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_cli_prints_one_json_object(tmp_path):
    gold = write_jsonl(tmp_path / "gold.jsonl", [claim(1, "SUPPORTS", [("A", 0)]), claim(2, NEI)])
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"id": 1, **verdict("SUPPORTS", ("A", 0))}, verdict("REFUTES")])
    result = CliRunner().invoke(app, ["eval", "fever", "--gold", gold, "--pred", pred])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "fever_score": 0.5,
        "label_accuracy": 0.5,
        "evidence_precision": 1.0,
        "evidence_recall": 1.0,
        "evidence_f1": 1.0,
    }


def test_cli_wrong_path_and_malformed_file_exit_2_with_one_line(tmp_path):
    gold = write_jsonl(tmp_path / "gold.jsonl", [claim(1, NEI), claim(2, NEI)])
    broken = tmp_path / "pred.jsonl"
    broken.write_text(json.dumps(verdict(NEI)) + "\n" + '{"predicted_label": \n')
    short = write_jsonl(tmp_path / "short.jsonl", [verdict(NEI)])
    for args, message in [
        (["--gold", str(tmp_path / "absent.jsonl"), "--pred", short], "no such file"),
        (["--gold", gold, "--pred", str(broken)], "pred.jsonl line 2 is not valid JSON"),
        (["--gold", gold, "--pred", short], "short.jsonl: 1 predictions for 2 gold claims"),
    ]:
        result = CliRunner().invoke(app, ["eval", "fever", *args])
        assert result.exit_code == 2
        assert result.stdout == ""
        assert result.stderr.startswith("error: ") and message in result.stderr
        assert result.stderr.count("\n") == 1
