"""DeepSpeed optimizer offload with AdEMAMix is refused, naming the setting and the alternatives.

With ``offload_optimizer_device: cpu`` accelerate swaps a client optimizer for DeepSpeed's
CPU Adam (unless ``zero_force_ds_cpu_optimizer`` is false), so AdEMAMix would silently not
run. The DeepSpeed config dict is built here as accelerate builds it from the recipes'
accelerate configs; no GPU is needed.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from align.trainers.common import check_optimizer_offload, create_optimizer

ACCELERATE = Path(__file__).resolve().parents[2] / "recipes" / "accelerate"


def deepspeed_config(name: str, **overrides) -> dict:
    """The DeepSpeed config dict accelerate builds from recipes/accelerate/NAME.yaml (with overrides)."""
    from accelerate.utils import DeepSpeedPlugin

    section = {**yaml.safe_load((ACCELERATE / name).read_text())["deepspeed_config"], **overrides}
    plugin = DeepSpeedPlugin(zero_stage=section["zero_stage"],
                             offload_optimizer_device=section.get("offload_optimizer_device"),
                             offload_param_device=section.get("offload_param_device"),
                             zero3_init_flag=section.get("zero3_init_flag"))
    return plugin.deepspeed_config


@pytest.mark.parametrize("name", ["zero2.yaml", "zero3.yaml"])
def test_the_shipped_configs_keep_ademamix(name):
    check_optimizer_offload(deepspeed_config(name), "ademamix")


@pytest.mark.parametrize("name", ["zero2.yaml", "zero3.yaml"])
@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_offload_with_ademamix_is_refused(name, device):
    config = deepspeed_config(name, offload_optimizer_device=device)
    assert config["zero_optimization"]["offload_optimizer"]["device"] == device
    with pytest.raises(ValueError, match=rf"offload_optimizer_device='{device}'.*ademamix.*CPU Adam.*"
                                         r"offload_optimizer_device: none.*optimizer=adamw"):
        check_optimizer_offload(config, "ademamix")
    check_optimizer_offload(config, "adamw")  # offloaded as DeepSpeed's CPU AdamW: the same update
    check_optimizer_offload({**config, "zero_force_ds_cpu_optimizer": False}, "ademamix")  # AdEMAMix kept


def test_the_trainers_optimizer_hook_refuses_it_before_building_the_optimizer():
    """``create_optimizer`` (both trainers' hook) reads the DeepSpeed config of the accelerator."""
    config = deepspeed_config("zero2.yaml", offload_optimizer_device="cpu")
    model = torch.nn.Linear(2, 2)
    trainer = SimpleNamespace(
        optimizer=None, model=model, args=SimpleNamespace(optimizer="ademamix"),
        accelerator=SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config=config))))
    with pytest.raises(ValueError, match="offload_optimizer_device='cpu'"):
        create_optimizer(trainer, model, fallback=lambda m: None)
