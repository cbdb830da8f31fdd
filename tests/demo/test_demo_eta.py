"""The demo's time left: the typical seconds of the steps to come, scaled by how fast the steps done went."""

from align.demo.eta import TYPICAL_SECONDS, announce, clock, pace


def test_before_any_step_the_estimate_is_the_typical_time():
    steps = ["SFT", "pairs", "round 2"]
    full = TYPICAL_SECONDS["full"]
    total = full["SFT"] + full["pairs"] + full["round k"]
    assert announce("full", steps, 0, {}) == (f"[align demo] SFT (step 1 of 3): about {clock(full['SFT'])}; "
                                             f"about {clock(total)} left in all")


def test_a_machine_twice_as_slow_doubles_what_is_left():
    steps = ["SFT", "pairs", "round 2"]
    full = TYPICAL_SECONDS["full"]
    done = {"SFT": 2 * full["SFT"]}
    assert pace("full", done) == 2.0
    left = 2 * (full["pairs"] + full["round k"])
    assert announce("full", steps, 1, done).endswith(f"about {clock(left)} left in all")


def test_the_clock_reads_as_people_read_it():
    assert [clock(s) for s in (0, 45.4, 200, 3725)] == ["0 s", "45 s", "3 min 20 s", "1 h 02 min"]
