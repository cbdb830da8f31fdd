"""The evaluation callback in one process: SFT training, what it logs, and its arithmetic."""

from __future__ import annotations

import pytest

from align.eval.callback import GenerationEvalCallback

DATE = "2026-01-01"


def prompts(n: int = 5) -> list[dict]:
    return [{"id": f"q{i}", "messages": [{"role": "user", "content": f"{i}+{i}"}], "answer": str(2 * i)}
            for i in range(n)]


def sft_rows(n: int = 16) -> list[dict]:
    return [{"id": f"c{i}", "messages": [{"role": "user", "content": f"{i}+{i}"},
                                          {"role": "assistant", "content": str(2 * i)}]} for i in range(n)]


class ParityReward:
    """1 when the completion has an even number of characters: known without a model."""

    name, reference_field = "parity", None

    def score_groups(self, conversations, groups, *, references=None):
        from rewards.base import Score

        return [[Score(float(len(t) % 2 == 0)) for t in g] for g in groups]


def test_compare_counts_wins_ties_and_losses_by_hand(tokenizer):
    callback = GenerationEvalCallback(prompts(3), ParityReward(), tokenizer, eval_steps=1)
    callback.reference = {"q0": 1.0, "q1": 0.0, "q2": 1.0}
    metrics = callback.compare({"q0": (1.0, 4), "q1": (1.0, 2), "q2": (0.0, 6)})
    assert metrics == {"reward": pytest.approx(2 / 3), "win_rate": 0.5, "length": 4.0}  # tie, win, loss


def test_sft_trainer_logs_generation_metrics_at_start_and_every_eval_steps(tokenizer, tmp_path, one_torch_thread):
    from align.chat import install_format
    from align.testing.tiny import build_causal_lm
    from align.trainers.sft_config import SFTConfig
    from align.trainers.sft_trainer import train_sft
    from rewards.verifiable import VerifiableReward

    install_format(tokenizer)
    callback = GenerationEvalCallback(prompts(), VerifiableReward(), tokenizer, eval_steps=2, chat_date=DATE, max_tokens=4,
                                      also={"same": VerifiableReward(), "parity": ParityReward()})
    config = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], seed=0,
                       per_device_train_batch_size=4, max_steps=4, learning_rate=1e-3, logging_steps=1,
                       save_strategy="no", chat_date=DATE, max_length=512, disable_tqdm=True)
    trainer = train_sft(config, sft_rows(), build_causal_lm(tokenizer), tokenizer, callbacks=[callback])
    assert [entry["step"] for entry in callback.history] == [0, 2, 4]
    assert set(callback.history[0]) == {"step", "reward_start", "length", "also/same", "also/parity"}
    assert {"reward", "win_rate", "length", "also/same", "also/parity"} <= set(callback.history[1])
    # an ``also`` provider scores the same completions: the main reward again gives the same means
    assert callback.history[0]["also/same"] == callback.history[0]["reward_start"]
    assert [e["also/same"] for e in callback.history[1:]] == [e["reward"] for e in callback.history[1:]]
    assert all(0.0 <= e["also/parity"] <= 1.0 for e in callback.history)
    logged = [e for e in trainer.state.log_history if any(k.startswith("gen_eval/") for k in e)]
    assert [e["step"] for e in logged] == [0, 2, 4]
    assert "gen_eval/win_rate" in logged[-1]
    # the training losses were still logged at their own steps, apart from the callback's entries
    assert [e["step"] for e in trainer.state.log_history if "loss" in e] == [1, 2, 3, 4]


def test_unbound_callback_says_how_to_bind_it(tokenizer):
    callback = GenerationEvalCallback(prompts(2), ParityReward(), tokenizer, eval_steps=1)
    with pytest.raises(RuntimeError, match="bind_trainer"):
        callback._evaluate()


def test_prompts_without_the_providers_answer_are_refused(tokenizer):
    from align.data.records import RecordError
    from rewards.verifiable import VerifiableReward

    bad = prompts(2)
    del bad[1]["answer"]
    with pytest.raises(RecordError, match="record 'q1': field 'answer'"):
        GenerationEvalCallback(bad, VerifiableReward(), tokenizer, eval_steps=1)
    with pytest.raises(RecordError, match="record 'q1': field 'answer'"):  # an ``also`` provider's field too
        GenerationEvalCallback(bad, ParityReward(), tokenizer, eval_steps=1, also={"exact": VerifiableReward()})


def test_also_means_leave_out_skips_and_name_each_provider(tokenizer):
    callback = GenerationEvalCallback(prompts(3), ParityReward(), tokenizer, eval_steps=1,
                                      also={"a": ParityReward(), "b": ParityReward()})
    callback.also_scores = {"q0": {"a": 1.0, "b": None}, "q1": {"a": 0.0, "b": 0.5}, "q2": {"a": 0.5, "b": None}}
    assert callback.also_means() == {"also/a": pytest.approx(0.5), "also/b": 0.5}
    callback.also_scores = {"q0": {"a": None, "b": None}}
    assert callback.also_means() == {}
