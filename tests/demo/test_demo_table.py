"""The demo's printed table, against a hand-written expectation: accuracy with intervals, the gain over
SFT, and each policy's KL to SFT beside them (before, KL was only in report.json)."""

from align.demo.report import summary_table


def interval(estimate: float) -> dict:
    return {"estimate": estimate, "low": estimate - 0.1, "high": estimate + 0.1}


def test_the_table_shows_each_policys_kl_to_sft():
    accuracy = {"sft": {"sampled": interval(0.5), "greedy": interval(0.6), "kl": None},
                "qrpo": {"sampled": interval(0.7), "greedy": interval(0.8), "kl": interval(1.234)}}
    table = summary_table(accuracy, {"qrpo": {"sampled": interval(0.2)}})
    assert table.splitlines()[0].endswith("sampled gain vs SFT        KL to SFT (nats)")
    assert table.splitlines()[2] == ("SFT                  50.0 [40.0, 60.0]         60.0 [50.0, 70.0]"
                                     "                (baseline)             (reference)")
    assert table.splitlines()[3] == ("QRPO                 70.0 [60.0, 80.0]         80.0 [70.0, 90.0]"
                                     "      +20.0 [+10.0, +30.0]       1.23 [1.13, 1.33]")
    graded = summary_table(accuracy, {}, measure="graded")  # the proxy's table: KL is said once, above
    assert "KL" not in graded
