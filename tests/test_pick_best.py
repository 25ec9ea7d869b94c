"""The run's best engine: highest dev speedup over vanilla, unless its own retained child beat it in one gate."""
from seis.session import pick_best
from seis.session.spec import SessionOutcome
from seis.workspace import Report


def outcome(chain: str, session: int, parent: str, snapshot: str, vs_vanilla: float, vs_parent: float,
            retained: bool = True) -> SessionOutcome:
    return SessionOutcome(
        chain=chain, session=session, parent_snapshot=parent, snapshot=snapshot if retained else parent,
        retained=retained, verdict="pass" if retained else "fail", reasons=(), dev_speedup_vs_vanilla=vs_vanilla,
        dev_speedup_vs_parent=vs_parent, synced_from=(), agent="offline", applied=(), adopted=(), tokens_in=0,
        tokens_out=0, cost_usd=0.0, wall_s=1.0, report=Report(chain, session, "report"))


def test_a_parent_its_child_beat_in_one_gate_is_not_the_best_whatever_other_gates_said():
    # the shape the second sync-3 run on the H200 had: s4 measured 6.32x in its gate, s5 5.90x in another, and
    # s5's gate timed s5 at 1.05x s4 itself
    s3 = outcome("c0", 3, "p2", "five", 2.83, 1.5)
    s4 = outcome("c0", 4, "five", "ngram", 6.32, 2.12)
    s5 = outcome("c2", 5, "ngram", "ngram+epilogue", 5.90, 1.05)
    assert pick_best([s3, s4, s5]) is s5


def test_without_a_faster_child_the_highest_ratio_over_vanilla_wins():
    s4 = outcome("c0", 4, "five", "ngram", 6.32, 2.12)
    slower_child = outcome("c0", 5, "ngram", "ngram+x", 5.90, 0.97)
    other_lineage = outcome("c1", 5, "other", "y", 3.00, 1.20)
    rejected = outcome("c2", 5, "ngram", "ngram+z", 9.00, 1.50, retained=False)
    assert pick_best([s4, slower_child, other_lineage, rejected]) is s4
    assert pick_best([rejected]) is None


def test_ties_go_to_the_earliest_and_a_child_that_kept_its_parents_tree_outdoes_nothing():
    first = outcome("c0", 0, "e0", "a", 1.5, 1.5)
    second = outcome("c1", 0, "e0", "b", 1.5, 1.5)
    same_tree = outcome("c0", 1, "a", "a", 1.4, 1.1)   # e.g. a fan-in that adopted nothing new
    assert pick_best([first, second, same_tree]) is first


def test_a_lineage_that_returned_to_an_earlier_tree_still_has_a_best():
    # a -> b beat a, then a later session went back to a's tree and beat b: neither is left out
    a = outcome("c0", 0, "e0", "a", 1.8, 1.8)
    b = outcome("c0", 1, "a", "b", 1.7, 1.02)
    back_to_a = outcome("c0", 2, "b", "a", 1.9, 1.01)
    weaker_elsewhere = outcome("c1", 0, "e0", "c", 1.2, 1.2)
    assert pick_best([a, b, back_to_a, weaker_elsewhere]) is back_to_a
