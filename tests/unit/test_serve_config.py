"""The `serve` section: its settings are read like every other section's, an unknown key is refused in one
line, and `xh config show serve` prints what `xh serve` reads (the retrieval and graph locations too)."""

import pytest

from xh.config import ConfigError, load_config, stage_dict


def test_serve_settings_are_read_and_an_unknown_or_bad_one_is_refused_in_one_line():
    cfg = load_config(None, ["serve.model=models:/xh-fever@champion", "serve.port=8100", "serve.max_batch_size=32"])
    assert (cfg.serve.model, cfg.serve.port, cfg.serve.max_batch_size) == ("models:/xh-fever@champion", 8100, 32)
    with pytest.raises(ConfigError, match=r"^unknown config key 'serve.prot' \(did you mean 'serve.port'\?\)$"):
        load_config(None, ["serve.prot=8100"])
    with pytest.raises(ConfigError, match=r"^config key 'serve.alias_check_s'"):
        load_config(None, ["serve.alias_check_s=0"])


def test_the_serve_stage_reads_the_locations_of_retrieval_and_graphs():
    assert list(stage_dict(load_config(), "serve")) == ["storage", "ray", "mlflow", "retrieve", "graphs", "serve"]
