"""What the trainers do for callbacks that need the trainer itself."""

from __future__ import annotations

from typing import Any


def bind_callbacks(trainer: Any) -> None:
    """Hand the trainer to callbacks that generate with its model or log through it.

    Such callbacks (e.g. `align.eval.callback.GenerationEvalCallback`) define
    ``bind_trainer``; transformers passes callbacks the model but not the accelerator or
    the logger they need under DeepSpeed.
    """
    for callback in trainer.callback_handler.callbacks:
        if hasattr(callback, "bind_trainer"):
            callback.bind_trainer(trainer)
