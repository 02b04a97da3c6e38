"""xh.model.backbones.truncated_backbone: the first layers of a pretrained backbone, saved as a loadable folder."""

from __future__ import annotations

import torch
from transformers import AutoModel, AutoTokenizer

from xh.model.backbones import truncated_backbone


def test_truncated_backbone_keeps_the_first_layers_and_the_tokenizer(make_tiny_backbone, tmp_path):
    source = make_tiny_backbone(layers=3)
    folder = truncated_backbone(source, 2, tmp_path / "short")
    full, short = AutoModel.from_pretrained(source), AutoModel.from_pretrained(folder)
    assert short.config.num_hidden_layers == 2 and len(short.encoder.layer) == 2
    for name, weight in short.state_dict().items():
        assert torch.equal(weight, full.state_dict()[name]), name
    assert AutoTokenizer.from_pretrained(folder).vocab == AutoTokenizer.from_pretrained(source).vocab
    # as many layers as it has, or 0: the whole backbone; half: fp16 weights
    whole = AutoModel.from_pretrained(truncated_backbone(source, 0, tmp_path / "whole", half=True))
    assert len(whole.encoder.layer) == 3
    assert {w.dtype for w in whole.state_dict().values() if w.is_floating_point()} == {torch.float16}
