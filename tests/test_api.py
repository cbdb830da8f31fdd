"""The top-level Python API names resolve to the stage functions they document."""

from __future__ import annotations

import pytest

import align
import rewards


@pytest.mark.parametrize("name", align.__all__)
def test_every_lazy_name_resolves(name):
    assert getattr(align, name) is not None


def test_sample_and_train_are_the_stage_functions():
    from align.sampling.stages import sample_references
    from align.trainers.preference_trainer import train

    assert align.sample is sample_references and align.train is train


def test_rewards_annotate_is_the_function_even_after_its_module_is_imported():
    import rewards.annotate as module  # noqa: F401  (binds the submodule name on the package)

    assert callable(rewards.annotate) and rewards.annotate.__name__ == "annotate"


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        align.nope  # noqa: B018
