import pytest

from xh.config import ConfigError, XHConfig, flatten, load_config, parse_override, stage_dict


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_defaults_then_file_then_overrides(tmp_path):
    path = write(tmp_path, "synth:\n  num_docs: 500\n  seed: 3\n")
    cfg = load_config(path, ["synth.seed=7", "storage.root=s3://b/p"])
    assert (cfg.synth.num_docs, cfg.synth.seed, cfg.storage.root) == (500, 7, "s3://b/p")
    assert cfg.synth.docs_per_shard == XHConfig().synth.docs_per_shard


def test_override_values_keep_their_type():
    assert parse_override("synth.num_docs=500") == ("synth.num_docs", 500)
    # YAML 1.1 reads "2e-5" as a string; the typed field converts it
    assert load_config(None, ["synth.comparison_fraction=2e-1"]).synth.comparison_fraction == 0.2
    assert parse_override("synth.fever_pages=false") == ("synth.fever_pages", False)
    assert parse_override("ray.address=null") == ("ray.address", None)
    assert parse_override("mlflow.experiment=my run") == ("mlflow.experiment", "my run")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["synth.num_doc=5"], "unknown config key 'synth.num_doc'"),
        (["nosuch.key=1"], "unknown config key 'nosuch'"),
        (["graphs.ir_keep=3"], "unknown config key 'graphs.ir_keep'"),  # node choice is the retrieve section's
        (["synth.num_docs=many"], "config key 'synth.num_docs': input should be a valid integer"),
        (["synth.num_docs=5"], "config key 'synth.num_docs': input should be greater than or equal to 20"),
        (["synth=3"], "config key 'synth'"),
        (["synth.seed.x=3"], "config key 'synth.seed': input should be a valid integer"),
        (["novalue"], "override 'novalue' is not of the form section.key=value"),
    ],
)
def test_bad_keys_and_types_are_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "synth: [\n"))
    with pytest.raises(ConfigError, match="unknown config key 'synth.bogus'"):
        load_config(write(tmp_path, "synth:\n  bogus: 1\n"))


def test_flatten_gives_dotted_scalars_for_a_stage():
    flat = flatten(load_config(None, ["synth.num_docs=600"]), "synth")
    assert flat["synth.num_docs"] == 600
    assert flat["storage.root"] == "runs/demo"
    assert all(not isinstance(v, (dict, list)) for v in flat.values())
    assert set(stage_dict(XHConfig(), "synth")) == {"storage", "ray", "mlflow", "synth"}
    with pytest.raises(ConfigError, match="unknown stage 'nope'"):
        stage_dict(XHConfig(), "nope")


def test_the_demo_and_the_question_type_stage_have_sections_of_their_own():
    assert set(stage_dict(XHConfig(), "qtype")) == {"storage", "ray", "mlflow", "model", "qtype"}
    assert "demo" in stage_dict(XHConfig(), "demo")
    cfg = load_config(None, ["demo.train_path_scorer=true", "qtype.dev_fraction=0.3"])
    assert cfg.demo.train_path_scorer and not cfg.demo.train_reranker and cfg.qtype.dev_fraction == 0.3
    with pytest.raises(ConfigError, match="unknown config key 'demo.path_scorer'"):
        load_config(None, ["demo.path_scorer=auto"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["synth.num_doc=5"], "unknown config key 'synth.num_doc' (did you mean 'synth.num_docs'?)"),
        (["trian.epochs=2"], "unknown config key 'trian' (did you mean 'train'?)"),
        (["score.incremntal=true"], "unknown config key 'score.incremntal' (did you mean 'score.incremental'?)"),
        (["graphs.ir_keep=3"], "unknown config key 'graphs.ir_keep'"),  # no key of graphs is near
    ],
)
def test_an_unknown_key_names_the_nearest_known_one(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert str(err.value) == message


def test_describe_gives_each_setting_its_description_as_a_comment_or_a_table_row():
    from xh.config import describe

    sections = stage_dict(XHConfig(), "score")
    text = describe(sections)
    assert "  incremental: false  # skip input files this model version has scored already" in text
    assert "# `xh score`: new questions through one registered model version" in text
    table = describe(sections, markdown=True)
    assert '| `edge_mode` | `"hyperlink"` |' in table and "(one of: hyperlink, bidirectional, full" in table
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) == sum(len(values) for values in sections.values())


def test_config_show_redacts_credentials_inside_values_and_secret_named_settings():
    from xh.tracking import redact_tree

    tree = {"mlflow": {"tracking_uri": "http://u:pw@h/"}, "x": {"api_token": "abc", "items": ["s3://b?token=t"]}}
    assert redact_tree(tree) == {
        "mlflow": {"tracking_uri": "http://***@h/"},
        "x": {"api_token": "***", "items": ["s3://b?token=***"]},
    }
