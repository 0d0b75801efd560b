"""A tokenizer's memory of run starts it saw untracked: what a late Track is told."""

from actors.tokenizer.untracked_starts import UntrackedStarts


def test_a_track_after_its_run_started_is_told_once():
    starts = UntrackedStarts(keep_s=30)
    starts.saw("late", now=100.0)
    assert starts.claim("late")
    assert not starts.claim("late")  # tracked now: a second Track of it (a migration) starts no alarm
    assert not starts.claim("never-seen")


def test_starts_are_forgotten_after_keep_s():
    starts = UntrackedStarts(keep_s=30)
    starts.saw("old", now=100.0)
    starts.saw("restarted", now=100.0)
    starts.saw("new", now=120.0)
    starts.saw("restarted", now=125.0)  # a later run of the same request: remembered from then on
    starts.saw("newest", now=140.0)
    assert not starts.claim("old")
    assert starts.claim("restarted") and starts.claim("new") and starts.claim("newest")
