"""The evaluation plots say what they show: bars labelled in words, the legend beside the
bars (never over one), and short answers (a few distinct lengths) drawn as bars per length
instead of one spike."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from align.eval.report import plot_reward_vs_length, win_label, win_rates_figure


def _win(wins: int, ties: int, losses: int) -> dict:
    n = wins + ties + losses
    rate = (wins + ties / 2) / n
    return {"wins": wins, "ties": ties, "losses": losses,
            "rate": {"estimate": rate, "low": max(0.0, rate - 0.1), "high": min(1.0, rate + 0.1)}}


def _report() -> dict:
    comparisons = {name: {"win_rate_reward_sampled": _win(w, 2, 10 - w)} for name, w in (("qrpo", 7), ("dpo", 5))}
    return {"baseline": "sft", "overall": {"policies": {"sft": {}, "qrpo": {}, "dpo": {}}, "comparisons": comparisons},
            "breakdowns": {"language": {"de": {"comparisons": comparisons}}}}


def test_bars_are_labelled_in_words():
    assert win_label("qrpo", "sft", "reward", "all") == "qrpo vs sft\nby reward, all prompts"
    assert win_label("dpo", "sft", "judge", "de") == "dpo vs sft\nby judge, language de"


def test_the_legend_sits_beside_the_bars():
    fig = win_rates_figure(_report())
    try:
        fig.canvas.draw()
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert labels[0] == "qrpo vs sft\nby reward, all prompts" and len(labels) == 4
        renderer = fig.canvas.get_renderer()
        legend, axes = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
        assert legend.x0 >= axes.x1, "the legend overlaps the axes, where the bars are"
    finally:
        plt.close(fig)


def _rows(lengths: list[int]) -> list[dict]:
    samples = [{"num_tokens": n, "score": float(n % 2)} for n in lengths]
    return [{"policies": {"sft": {"samples": samples}, "qrpo": {"samples": samples}}}]


def test_a_few_distinct_lengths_are_bars_per_length(tmp_path, monkeypatch):
    drawn = {}
    original = plt.Figure.savefig

    def keep(fig, path, **kwargs):
        ax = fig.axes[0]
        drawn["bars"] = len(ax.patches)
        drawn["ticks"] = [t.get_text() for t in ax.get_xticklabels()]
        drawn["title"] = ax.get_title()
        return original(fig, path, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    report = {"overall": {"policies": {"sft": {}, "qrpo": {}}}}
    plot_reward_vs_length(tmp_path / "few.png", _rows([2, 2, 3, 3, 3]), report)
    assert drawn["bars"] == 4 and drawn["ticks"] == ["2", "3"] and "bars" in drawn["title"]
    plot_reward_vs_length(tmp_path / "many.png", _rows(list(range(1, 40))), report)
    assert drawn["bars"] == 0 and "length bin" in drawn["title"]
    assert (tmp_path / "few.png").stat().st_size > 0 and (tmp_path / "many.png").stat().st_size > 0
