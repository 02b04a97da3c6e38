"""A model version's pipeline record (`xh.pipeline_record.pipeline_record`) applied to a scoring config
(`apply_pipeline`): the version's prediction-affecting settings win over the config's defaults, a
setting the config changes is refused in one line naming it unless drift is allowed (then it is
returned), resources are the config's, and a moved index or model with the same content is accepted."""

from __future__ import annotations

import json

import pytest

from xh.config import ConfigError, load_config
from xh.pipeline_record import PipelineDrift, apply_pipeline, pipeline_record
from xh.storage.store import Store


def _index(folder, num_docs: int = 800) -> str:
    folder.mkdir(parents=True)
    manifest = {"analyzer": {"fingerprint": "a1"}, "stats": {"num_docs": num_docs}, "shards": [], "docs": str(folder)}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return str(folder)


def _scorer(folder, weights: list[float]) -> str:
    folder.mkdir(parents=True)
    (folder / "path_scorer.json").write_text(json.dumps({"weights": weights}))
    return str(folder)


@pytest.fixture
def version(tmp_path):
    """The record of a model trained on typed graphs with ir_keep 3 and a path scorer, against an index; the
    graphs were built keeping 9 expanded documents (their summary's node choice wins over the config's)."""
    index = _index(tmp_path / "index")
    scorer = _scorer(tmp_path / "scorer", [1.0, 2.0])
    cfg = load_config(
        None,
        [f"storage.root={tmp_path}", f"retrieve.index={index}", f"retrieve.path_scorer={scorer}", "retrieve.ir_keep=3"],
    )
    summary = {
        "task": "hotpot",
        "edge_mode": "typed",
        "settings": {"edge_mode": "typed", "retrieve": {"expansion_keep": 9}},
    }
    record, copies = pipeline_record(cfg, summary)
    return {"record": record, "copies": copies, "index": index, "scorer": scorer, "root": tmp_path}


def _apply(version, *overrides: str, allow_drift: bool = False):
    cfg = load_config(None, [f"storage.root={version['root']}", *overrides])
    copies = Store.from_config(cfg).at(str(version["root"] / "copies"))
    return apply_pipeline(cfg, version["record"], copies, allow_drift=allow_drift)


def test_the_record_holds_the_graphs_own_settings_the_knobs_the_copied_scorer_and_the_index_snapshot(version):
    record = version["record"]
    assert record["graphs"]["edge_mode"] == "typed" and record["retrieve"]["expansion_keep"] == 9
    assert record["retrieve"]["ir_keep"] == 3 and "expansion_keep" not in record["graphs"]
    assert record["models"]["retrieve.path_scorer"]["copy"] == "retrieve.path_scorer"
    assert version["copies"] == {"retrieve.path_scorer": version["scorer"]}
    assert record["models"]["retrieve.reranker"] is None
    assert record["index"]["uri"] == version["index"] and record["index"]["snapshot"].startswith("sha256:")
    assert "workers" not in record["graphs"] and "batch_size" not in record["retrieve"]


def test_a_config_that_sets_nothing_gets_the_versions_pipeline(version):
    cfg, drift = _apply(version)
    assert drift == {}
    assert cfg.graphs.edge_mode == "typed" and cfg.retrieve.expansion_keep == 9 and cfg.retrieve.ir_keep == 3
    assert cfg.retrieve.path_scorer == str(version["root"] / "copies" / "retrieve.path_scorer")
    assert cfg.retrieve.index == version["index"]


def test_resources_and_the_versions_own_values_are_accepted(version):
    cfg, drift = _apply(
        version, "graphs.workers=4", "score.batch_size=7", "retrieve.workers=3", "graphs.edge_mode=typed"
    )
    assert drift == {} and cfg.graphs.workers == 4 and cfg.score.batch_size == 7 and cfg.graphs.edge_mode == "typed"


def test_a_graph_setting_unlike_the_versions_is_refused_in_one_line_naming_it(version):
    with pytest.raises(PipelineDrift) as refused:
        _apply(version, "graphs.edge_mode=hyperlink")
    message = str(refused.value)
    assert isinstance(refused.value, ConfigError) and "\n" not in message
    assert message.startswith("graphs.edge_mode='hyperlink' differs from the model version's 'typed'")
    assert "score.allow_drift=true" in message
    with pytest.raises(PipelineDrift, match=r"^retrieve\.ir_keep=2 "):
        _apply(version, "retrieve.ir_keep=2")


def test_opting_in_uses_the_configs_setting_and_returns_the_drift(version):
    cfg, drift = _apply(version, "graphs.edge_mode=hyperlink", "retrieve.ir_keep=2", allow_drift=True)
    assert cfg.graphs.edge_mode == "hyperlink" and cfg.retrieve.ir_keep == 2
    assert drift == {
        "graphs.edge_mode": {"version": "typed", "used": "hyperlink"},
        "retrieve.ir_keep": {"version": 3, "used": 2},
    }
    assert cfg.retrieve.expansion_keep == 9  # the settings not changed still come from the version


def test_a_version_recorded_with_the_node_choice_in_its_graphs_too_still_scores(version):
    """Records written while the graphs section also held ir_keep, el_per_surface and expansion_keep: the same
    values as the retrieve section's are that pipeline; other ones are drift, refused unless allowed."""
    old = json.loads(json.dumps(version["record"]))
    old["graphs"] |= {key: old["retrieve"][key] for key in ("ir_keep", "el_per_surface", "expansion_keep")}
    cfg, drift = _apply({**version, "record": old})
    assert drift == {} and (cfg.retrieve.ir_keep, cfg.retrieve.expansion_keep) == (3, 9)

    old["graphs"]["ir_keep"] = 2  # its graphs kept 2 BM25 documents, its retrieval seeded expansion with 3
    with pytest.raises(PipelineDrift) as refused:
        _apply({**version, "record": old})
    assert str(refused.value).startswith("graphs.ir_keep=2 of the model version differs from its retrieve.ir_keep=3")
    assert "\n" not in str(refused.value)
    cfg, drift = _apply({**version, "record": old}, allow_drift=True)
    assert cfg.retrieve.ir_keep == 3 and drift == {"graphs.ir_keep": {"version": 2, "used": 3}}


def test_a_moved_index_with_the_same_snapshot_is_used_and_another_snapshot_is_refused(version):
    moved = _index(version["root"] / "elsewhere" / "index")  # the same manifest bytes but its docs location
    cfg, drift = _apply(version, f"retrieve.index={moved}")
    assert cfg.retrieve.index == moved and drift == {}
    other = _index(version["root"] / "rebuilt", num_docs=801)
    with pytest.raises(PipelineDrift, match=r"^retrieve\.index=.* \(snapshot sha256:\w+, not sha256:\w+\)"):
        _apply(version, f"retrieve.index={other}")


def test_a_path_scorer_with_other_weights_is_drift_and_a_copy_of_the_same_one_is_not(version):
    same = _scorer(version["root"] / "copy-of-scorer", [1.0, 2.0])
    cfg, drift = _apply(version, f"retrieve.path_scorer={same}")
    assert drift == {}
    other = _scorer(version["root"] / "retrained", [1.0, 3.0])
    with pytest.raises(PipelineDrift, match=r"^retrieve\.path_scorer="):
        _apply(version, f"retrieve.path_scorer={other}")
    with pytest.raises(PipelineDrift, match=r"^retrieve\.reranker="):  # the version had no re-ranker
        _apply(version, f"retrieve.reranker={same}")


def test_graphs_of_the_distractor_setting_record_no_index(version):
    cfg = load_config(None, [f"storage.root={version['root']}", f"retrieve.index={version['index']}"])
    record, _ = pipeline_record(cfg, {"task": "hotpot", "setting": "distractor", "settings": {}})
    assert record["index"] is None
    cfg, drift = apply_pipeline(cfg, record, Store.from_config(cfg).at(str(version["root"] / "copies")))
    assert cfg.retrieve.index == version["index"] and drift == {}  # the config's, unchecked


@pytest.mark.parametrize("relative", [True, False], ids=["relative", "absolute"])
def test_registration_copies_the_path_scorer_where_scoring_reads_it(tmp_path, monkeypatch, relative):
    """The demo names its path scorer by a relative path, which the listing gives back absolute."""
    from xh.registry.register import with_pipeline
    from xh.storage.store import Store

    monkeypatch.chdir(tmp_path)
    scorer = _scorer(tmp_path / "models" / "path-scorer", [1.0, 2.0])
    (tmp_path / "graphs").mkdir()
    (tmp_path / "graphs" / "_summary.json").write_text(json.dumps({"task": "hotpot", "edge_mode": "hyperlink"}))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights").write_text("w")
    named = "models/path-scorer" if relative else scorer
    cfg = load_config(None, [f"storage.root={tmp_path}", f"retrieve.path_scorer={named}"])
    folder = with_pipeline(
        str(tmp_path / "model"), str(tmp_path / "staging"), cfg, Store.from_config(cfg).at(str(tmp_path / "graphs"))
    )
    copied = tmp_path / "staging" / "model" / "pipeline" / "retrieve.path_scorer" / "path_scorer.json"
    assert json.loads(copied.read_text()) == {"weights": [1.0, 2.0]}
    assert folder == str(tmp_path / "staging" / "model")
