"""One trainer foundation: the keys SFT and preference training share have one definition,
one default and one set of checks (`align.trainers.common`); pair rows are prepared by
`datasets.map` on the main process first (`align.trainers.preference_data`)."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest

from align.trainers.common import LoraFields, ModelFields, OptimizerFields
from align.trainers.preference_config import PreferenceConfig
from align.trainers.sft_config import SFTConfig, apertus_sft_defaults

SHARED = [f.name for mixin in (ModelFields, LoraFields, OptimizerFields) for f in dataclasses.fields(mixin)]


def sft(tmp_path, **kwargs) -> SFTConfig:
    return SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], **kwargs)


def preference(tmp_path, **kwargs) -> PreferenceConfig:
    return PreferenceConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs)


def test_shared_keys_have_one_default_and_one_help_text_in_both_configs(tmp_path):
    a, b = sft(tmp_path), preference(tmp_path)
    assert {k: getattr(a, k) for k in SHARED} == {k: getattr(b, k) for k in SHARED}
    assert (a.optimizer, a.ademamix_beta3, a.ademamix_alpha) == ("ademamix", 0.99, 8.0)  # docs/method.md, AdEMAMix
    helps = [{f.name: f.metadata.get("help") for f in dataclasses.fields(cls) if f.name in SHARED}
             for cls in (SFTConfig, PreferenceConfig)]
    assert helps[0] == helps[1] and all(helps[0].values())


@pytest.mark.parametrize("make", [sft, preference])
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"optim": "adafactor"}, "set optimizer=None to use transformers' optimizers"),
        ({"optimizer": "sgd"}, "optimizer='sgd': choose one of"),
        ({"ademamix_beta3": 1.0}, r"ademamix_beta3=1.0: must be in \[0, 1\)"),
        ({"ademamix_t_beta3": -1}, "ademamix_t_beta3=-1: must be >= 0"),
        ({"lora_r": 0}, "lora_r=0"),
        ({"dtype": "int8"}, "dtype='int8'"),
    ],
)
def test_both_configs_refuse_the_same_settings(make, kwargs, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        make(tmp_path, **kwargs)


@pytest.mark.parametrize("make", [sft, preference])
def test_transformers_optim_counts_only_without_an_align_optimizer(make, tmp_path):
    assert getattr(make(tmp_path, optimizer=None, optim="adafactor").optim, "value", None) == "adafactor"
    assert make(tmp_path, optimizer="AdamW").optimizer == "adamw"


def test_apertus_sft_preset_cleans_the_data():
    assert apertus_sft_defaults("8b")["identity_filter"] and apertus_sft_defaults("70b")["strip_boxed"]


def test_pair_rows_are_prepared_by_a_map_in_turn_only_when_file_backed(tiny_tokenizer, tmp_path, monkeypatch):
    import datasets
    from test_preference_trainer import DATE, make_rows

    from align.trainers.preference_data import prepare_dataset, prepare_row

    config = preference(tmp_path, reference="model", chat_date=DATE, max_length=128)
    entered = []

    @contextlib.contextmanager
    def main_process_first(local=True, desc="work"):
        entered.append(desc)
        yield

    monkeypatch.setattr(config, "main_process_first", main_process_first)
    rows = make_rows(6)
    prepared = prepare_dataset(rows, tiny_tokenizer, config)
    assert entered == []  # rows in memory: no cache for other ranks to reuse, so no waiting
    assert prepared.to_list() == [prepare_row(row, i, tiny_tokenizer, config) for i, row in enumerate(rows)]
    datasets.Dataset.from_list(rows).save_to_disk(tmp_path / "pairs")
    prepared = prepare_dataset(datasets.load_from_disk(tmp_path / "pairs"), tiny_tokenizer, config)
    assert entered == ["preference dataset preparation"] and len(prepared) == len(rows)


def test_ranks_prepare_in_turn_only_when_there_is_a_cache_to_share(tmp_path):
    """File-backed data: the main process first, the others reuse its cache. Rows held in
    memory have no cache, so waiting would only make the other ranks repeat the work later."""
    import datasets

    from align.trainers.common import preparation_order

    calls = []

    class Args:
        @contextlib.contextmanager
        def main_process_first(self, desc):
            calls.append(desc)
            yield

    in_memory = datasets.Dataset.from_list([{"a": 1}, {"a": 2}])
    with preparation_order(Args(), in_memory, "prep"):
        pass
    assert calls == []
    in_memory.save_to_disk(tmp_path / "saved")
    file_backed = datasets.load_from_disk(tmp_path / "saved")
    assert file_backed.cache_files
    with preparation_order(Args(), file_backed, "prep"):
        pass
    assert calls == ["prep"]
