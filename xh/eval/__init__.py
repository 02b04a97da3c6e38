"""The official metrics of HotpotQA and FEVER, re-implemented so that they give the same numbers.

    hotpot.py   `hotpot_evaluate_v1.py`: answer EM / F1, supporting-fact EM / F1, joint; per question type
    fever.py    the FEVER scorer (`fever_score`, at most 5 evidence): FEVER score, label accuracy,
                evidence precision / recall / F1; per single- / multi-evidence claims

    from xh.eval.hotpot import evaluate_hotpot_files
    evaluate_hotpot_files("hotpot_dev_distractor_v1.json", "pred.json")   # {"em": ..., "joint_f1": ...}

Both read local paths or s3:// URIs. A file that cannot be read or does not have the expected shape
raises `InputFileError` (`xh.storage.jsonfiles`) with a one-line message (the `xh eval` CLI prints it and exits with 2).
Importing this package loads nothing; `hotpot` and `fever` load only the small JSON reader (`xh.storage.jsonfiles`).
"""
