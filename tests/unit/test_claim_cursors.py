"""The claim cursor's bookkeeping (ultimat3.drivers.postgres.cursors), without a database: which
statement a claim runs, where the cursor goes, and what moves it back."""

from __future__ import annotations

from ultimat3.core.clock import to_datetime
from ultimat3.drivers.postgres.cursors import (
    CATCH_UP,
    LAPSE_FULL_EVERY,
    RS,
    STUCK,
    ClaimCursors,
    parse_notice,
)
from ultimat3.drivers.protocol import CLAIM_STARVATION_BOUND

T0 = 1_700_000_000.0


def key(seconds: float, job_id: str, priority: int = 0) -> tuple[int, object, str]:
    return priority, to_datetime(seconds), job_id


def test_notices_parse_and_plain_queue_names_stay_queue_names() -> None:
    assert parse_notice(f"{RS}J{RS}5{RS}1700000000123{RS}mail") == ("J", "mail", 5, to_datetime(1700000000.123))
    assert parse_notice(f"{RS}R{RS}billing") == ("R", "billing", None, None)
    assert parse_notice("mail") == ("Q", "mail", None, None)
    assert parse_notice(f"{RS}J{RS}x{RS}y{RS}q") == ("Q", f"{RS}J{RS}x{RS}y{RS}q", None, None)  # unparsable: a name
    assert parse_notice(f"{RS}J{RS}1{RS}2{RS}a{RS}b")[1] == f"a{RS}b"  # the queue is the rest, separators and all


def test_the_first_claim_walks_from_the_head_then_from_the_cursor_until_the_catch_up() -> None:
    cursors = ClaimCursors()
    plan = cursors.plan(["q"], None, T0, 30, heard=True)
    assert plan.query == "claim_queue" and plan.look_for_lapsed
    cursors.claimed(plan, key(T0 - 5, "a"), key(T0 - 5, "a"), ["a"], T0)
    plan = cursors.plan(["q"], None, T0 + 0.1, 30, heard=True)
    assert plan.query == "claim_queue_from"
    assert (plan.params["c_priority"], plan.params["c_run_at"], plan.params["c_id"]) == key(T0 - 5, "a")
    assert not plan.look_for_lapsed  # looked for at T0, next within a second
    assert cursors.plan(["q"], None, T0 + CATCH_UP, 30, heard=True).query == "claim_queue"


def test_without_notices_the_catch_up_comes_within_the_starvation_bound() -> None:
    cursors = ClaimCursors()
    plan = cursors.plan(None, None, T0, 30, heard=False)
    assert plan.query == "claim_any"
    cursors.claimed(plan, key(T0, "a"), key(T0, "a"), ["a"], T0)
    assert cursors.plan(None, None, T0 + 0.5, 30, heard=False).query == "claim_any_from"
    assert cursors.plan(None, None, T0 + CLAIM_STARVATION_BOUND, 30, heard=False).query == "claim_any"


def test_a_ready_notice_behind_the_cursor_moves_it_back_and_one_ahead_does_not() -> None:
    cursors = ClaimCursors()
    plan = cursors.plan(["q"], None, T0, 30, heard=True)
    cursors.claimed(plan, key(T0, "m"), key(T0, "m"), ["m"], T0)
    cursors.notice(f"{RS}J{RS}0{RS}{int((T0 + 10) * 1000)}{RS}q")  # ahead: nothing to do
    assert cursors.plan(["q"], None, T0 + 0.1, 30, heard=True).params["c_run_at"] == to_datetime(T0)
    cursors.notice(f"{RS}J{RS}0{RS}{int((T0 - 60) * 1000)}{RS}other")  # another queue
    assert cursors.plan(["q"], None, T0 + 0.2, 30, heard=True).params["c_run_at"] == to_datetime(T0)
    cursors.notice(f"{RS}J{RS}0{RS}{int((T0 - 60) * 1000)}{RS}q")
    plan = cursors.plan(["q"], None, T0 + 0.3, 30, heard=True)
    assert (plan.params["c_run_at"], plan.params["c_id"]) == (to_datetime(T0 - 60), "")


def test_a_rescan_notice_or_a_lost_listener_sends_the_next_claim_to_the_head_from_the_start() -> None:
    cursors = ClaimCursors()
    plan = cursors.plan(None, None, T0, 30, heard=True)
    cursors.claimed(plan, key(T0, "a"), key(T0, "a"), ["a"], T0)
    assert cursors.notice(f"{RS}R{RS}billing") == "billing"
    plan = cursors.plan(None, None, T0 + 0.1, 30, heard=True)
    assert plan.query == "claim_any" and plan.look_for_lapsed
    assert plan.lapsed_floor.year == 1  # unfloored: what lapsed while the queue was paused comes back
    cursors.claimed(plan, key(T0, "b"), key(T0, "b"), ["b"], T0 + 0.1)
    assert cursors.notice("*") == "*"
    assert cursors.plan(None, None, T0 + 0.2, 30, heard=True).query == "claim_any"


def test_a_row_held_by_another_transaction_keeps_the_cursor_then_is_passed_and_looked_up_by_key() -> None:
    cursors = ClaimCursors()
    plan = cursors.plan(["q"], None, T0, 30, heard=True)
    held, taken = key(T0, "held"), key(T0 + 1, "next")
    cursors.claimed(plan, held, taken, ["next"], T0)
    plan = cursors.plan(["q"], None, T0 + 0.1, 30, heard=True)
    assert plan.params["c_id"] == "held" and plan.passed == []
    cursors.claimed(plan, held, key(T0 + 2, "later"), ["later"], T0 + STUCK)
    plan = cursors.plan(["q"], None, T0 + STUCK + 0.1, 30, heard=True)
    assert plan.params["c_id"] == "later" and plan.passed == ["held"]
    cursors.claimed(plan, key(T0 + 3, "x"), key(T0 + 3, "x"), ["held", "x"], T0 + STUCK + 0.1)
    assert cursors.plan(["q"], None, T0 + STUCK + 0.2, 30, heard=True).passed == []


def test_lapsed_claims_are_looked_for_from_the_previous_look_and_from_the_start_each_minute() -> None:
    cursors = ClaimCursors()
    first = cursors.plan(["q"], None, T0, 30, heard=True)
    assert first.look_for_lapsed and first.lapsed_floor.year == 1
    assert not cursors.plan(["q"], None, T0 + 0.5, 30, heard=True).look_for_lapsed
    second = cursors.plan(["q"], None, T0 + 1, 30, heard=True)
    assert second.look_for_lapsed and second.lapsed_floor == to_datetime(T0 - 1)
    # A short visibility timeout looks more often than once a second.
    assert cursors.plan(["q"], None, T0 + 1.3, 0.2, heard=True).look_for_lapsed is False
    assert cursors.plan(["q"], None, T0 + 2.0, 0.2, heard=True).look_for_lapsed
    assert cursors.plan(["q"], None, T0 + 2.2, 0.2, heard=True).look_for_lapsed
    assert cursors.plan(["q"], None, T0 + LAPSE_FULL_EVERY, 30, heard=True).lapsed_floor.year == 1


def test_a_claim_that_failed_looks_for_lapsed_claims_again_from_the_start() -> None:
    cursors = ClaimCursors()
    cursors.plan(["q"], None, T0, 30, heard=True)
    plan = cursors.plan(["q"], None, T0 + 1, 30, heard=True)
    assert plan.look_for_lapsed
    cursors.failed(plan)
    again = cursors.plan(["q"], None, T0 + 1.1, 30, heard=True)
    assert again.look_for_lapsed and again.lapsed_floor.year == 1
