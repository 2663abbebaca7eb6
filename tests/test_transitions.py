"""The decisions of a job's life (``qftrio.server.transitions``), without a
database: each rule once. The store conformance suite checks that every
backend executes them."""

from __future__ import annotations

import pytest

from qftrio import errors
from qftrio.models import CompleteItem, FailItem, HeartbeatItem, Status, WorkflowStatus
from qftrio.server import transitions
from qftrio.server.engine import RetryPolicy
from qftrio.server.store.base import LEASE_EXPIRED, Outcome

T0 = 1_800_000_000.0
ALWAYS_RETRY = RetryPolicy(base_secs=10, cap_secs=10, jitter=0).retry_at

OK, CONFLICT, NOT_FOUND = Outcome.OK, Outcome.CONFLICT, Outcome.NOT_FOUND
S = Status

# The report table of the module docstring, row by row:
# (status, token current) -> (complete, fail, heartbeat) as (outcome, status after, applied)
TABLE = [
    ((None, False), ((NOT_FOUND, None, False), (NOT_FOUND, None, False), (NOT_FOUND, None, False))),
    ((S.RUNNING, False), ((CONFLICT, None, False), (CONFLICT, None, False), (CONFLICT, None, False))),
    ((S.RUNNING, True), ((OK, S.COMPLETED, True), (OK, S.PENDING, True), (OK, S.RUNNING, True))),
    ((S.COMPLETED, True), ((OK, S.COMPLETED, False), (CONFLICT, None, False), (OK, S.COMPLETED, False))),
    ((S.PENDING, True), ((CONFLICT, None, False), (OK, S.PENDING, False), (OK, S.PENDING, False))),
    ((S.FAILED, True), ((CONFLICT, None, False), (OK, S.FAILED, False), (OK, S.FAILED, False))),
    ((S.CANCELLED, True), ((CONFLICT, None, False), (CONFLICT, None, False), (OK, S.CANCELLED, False))),
]


@pytest.mark.parametrize(("row", "expected"), TABLE, ids=lambda v: str(v[0]) if isinstance(v[0], (S, type(None))) else "")
def test_report_table(row, expected) -> None:
    status, current = row
    done = transitions.complete(status, current, queue="q")
    failed = transitions.fail(status, current, queue="q", attempt=1, max_attempts=3, retry_at=ALWAYS_RETRY, now=T0)
    beat = transitions.heartbeat(status, current, extend_secs=30, now=T0)
    got = (
        (done.outcome, done.status, done.applied),
        (failed.result.outcome, failed.result.status, failed.result.applied),
        (beat.outcome, beat.status, beat.locked_until is not None),
    )
    assert got == expected


def test_a_heartbeat_extends_a_running_lease_from_now() -> None:
    beat = transitions.heartbeat(Status.RUNNING, True, extend_secs=30, now=T0)
    assert (beat.status, beat.locked_until) == (Status.RUNNING, T0 + 30)
    assert transitions.heartbeat(Status.CANCELLED, True, extend_secs=30, now=T0).locked_until is None


def test_fail_retries_with_attempts_left_then_dead_letters() -> None:
    retry = transitions.fail(Status.RUNNING, True, queue="q", attempt=1, max_attempts=2, retry_at=ALWAYS_RETRY, now=T0)
    assert (retry.result.status, retry.retry_at) == (Status.PENDING, T0 + 10)
    last = transitions.fail(Status.RUNNING, True, queue="q", attempt=2, max_attempts=2, retry_at=ALWAYS_RETRY, now=T0)
    assert (last.result.status, last.retry_at) == (Status.FAILED, None)
    permanent = transitions.fail(
        Status.RUNNING, True, queue="q", attempt=1, max_attempts=5, retryable=False, retry_at=ALWAYS_RETRY, now=T0
    )
    assert permanent.result.status is Status.FAILED


def test_a_lease_heartbeated_twice_in_a_batch_is_extended_once_by_the_longer_extension() -> None:
    items = [HeartbeatItem("j", "t", 30), HeartbeatItem("k", "t", 5), HeartbeatItem("j", "t", 40), HeartbeatItem("j", "u", 1)]
    unique, slot = transitions.one_per_lease(items)
    assert unique == [HeartbeatItem("j", "t", 40), HeartbeatItem("k", "t", 5), HeartbeatItem("j", "u", 1)]
    assert slot == [0, 1, 0, 2]


def test_a_lease_completed_or_failed_twice_in_a_batch_is_decided_once_and_the_repeat_is_its_replay() -> None:
    items = [CompleteItem("j", "t", {"n": 1}), CompleteItem("j", "t", {"n": 2}), CompleteItem("j", "u", {})]
    unique, slot = transitions.one_per_lease(items)
    assert (unique, slot) == ([items[0], items[2]], [0, 0, 1])
    first = transitions.complete(Status.RUNNING, True, queue="q")
    stale = transitions.complete(Status.RUNNING, False, queue="q")
    answered = transitions.answers([first, stale], slot)
    assert [(r.outcome, r.status, r.applied) for r in answered] == [
        (OK, S.COMPLETED, True), (OK, S.COMPLETED, False), (CONFLICT, None, False),
    ]  # fmt: skip
    # a repeat is answered as a replay of the job as it stands: what a later call would get
    assert answered[1] == transitions.complete(Status.COMPLETED, True, queue="q")
    failed = transitions.fail(Status.RUNNING, True, queue="q", attempt=1, max_attempts=1, retry_at=ALWAYS_RETRY, now=T0)
    unique, slot = transitions.one_per_lease([FailItem("j", "t", "a"), FailItem("j", "t", "b")])
    replay = transitions.answers([failed.result], slot)[1]
    assert replay == transitions.fail(S.FAILED, True, queue="q", retry_at=ALWAYS_RETRY, now=T0).result


def test_lease_order_is_priority_then_scheduled_then_created() -> None:
    jobs = [(0, 5.0, 1.0), (1, 9.0, 9.0), (0, 5.0, 0.5), (0, 4.0, 2.0)]
    assert sorted(jobs, key=lambda j: transitions.lease_order(*j)) == [(1, 9.0, 9.0), (0, 4.0, 2.0), (0, 5.0, 0.5), (0, 5.0, 1.0)]


@pytest.mark.parametrize("status", [WorkflowStatus.COMPLETED, WorkflowStatus.FAILED, WorkflowStatus.CANCELLED])
def test_only_running_workflows_can_be_cancelled(status: WorkflowStatus) -> None:
    with pytest.raises(errors.Conflict, match=f"is {status.value}; only running workflows"):
        transitions.workflow_cancel("w", status)
    transitions.workflow_cancel("w", WorkflowStatus.RUNNING)


@pytest.mark.parametrize("status", [Status.COMPLETED, Status.FAILED, Status.CANCELLED])
def test_only_unfinished_jobs_can_be_cancelled(status: Status) -> None:
    with pytest.raises(errors.Conflict, match=f"is {status.value}"):
        transitions.cancel("j", status)
    transitions.cancel("j", Status.PENDING)
    transitions.cancel("j", Status.RUNNING)


def test_retry() -> None:
    assert transitions.retry("j", Status.FAILED) is transitions.Retry.RESET
    assert transitions.retry("j", Status.CANCELLED) is transitions.Retry.RESET
    with pytest.raises(errors.Conflict, match="only failed or cancelled"):
        transitions.retry("j", Status.RUNNING)
    failed = {"workflow_id": "w", "workflow_status": WorkflowStatus.FAILED}
    assert transitions.retry("j", Status.FAILED, **failed) is transitions.Retry.RESUME
    assert transitions.retry("j", Status.CANCELLED, **failed) is transitions.Retry.NOT_THE_FAILED_STEP
    running = {"workflow_id": "w", "workflow_status": WorkflowStatus.RUNNING}
    assert transitions.retry("j", Status.CANCELLED, **running) is transitions.Retry.RESET
    with pytest.raises(errors.Conflict, match="cancelled workflow does not resume"):
        transitions.retry("j", Status.FAILED, workflow_id="w", workflow_status=WorkflowStatus.CANCELLED)


def expired(job_id: str, *, attempt: int = 1, max_attempts: int = 1, at: float = T0, workflow: str | None = None, position: int = 0):
    return transitions.Expired(
        job_id=job_id, queue="q", attempt=attempt, max_attempts=max_attempts, locked_until=at,
        workflow_id=workflow, step=None if workflow is None else f"s{position}", position=position,
    )  # fmt: skip


def test_reap_returns_jobs_with_attempts_left_and_dead_letters_the_rest() -> None:
    decided, failing = transitions.reap([expired("a", attempt=1, max_attempts=2), expired("b")], retry_at=ALWAYS_RETRY, now=T0)
    assert [(d.job_id, d.status, d.error) for d in decided] == [
        ("a", Status.PENDING, LEASE_EXPIRED),
        ("b", Status.FAILED, LEASE_EXPIRED),
    ]
    assert failing == {}


def test_reap_fails_a_workflow_at_the_step_whose_lease_ran_out_first() -> None:
    jobs = [
        expired("late", at=T0 + 2, workflow="w", position=0),
        expired("first", at=T0 + 1, workflow="w", position=1),
        expired("retryable", attempt=1, max_attempts=3, at=T0, workflow="w", position=2),
        expired("other", workflow="v", position=5),
    ]
    decided, failing = transitions.reap(jobs, retry_at=ALWAYS_RETRY, now=T0)
    assert failing == {"w": "first", "v": "other"}
    assert [(d.job_id, d.status) for d in decided] == [
        ("late", Status.CANCELLED),
        ("first", Status.FAILED),
        ("retryable", Status.CANCELLED),
        ("other", Status.FAILED),
    ]
    assert decided[0].error == transitions.sibling_cancelled("s1") == f"{LEASE_EXPIRED}; cancelled with its workflow, which failed at step 's1'"


def test_reap_breaks_ties_by_the_steps_order() -> None:
    decided, failing = transitions.reap(
        [expired("second", workflow="w", position=1), expired("first", workflow="w", position=0)], retry_at=ALWAYS_RETRY, now=T0
    )
    assert failing == {"w": "first"}
    assert [d.status for d in decided] == [Status.CANCELLED, Status.FAILED]


def test_advance_enqueues_the_unblocked_steps_in_workflow_order() -> None:
    unblocked = [(3, "d", 0, "waiting"), (1, "b", 0, "waiting"), (2, "c", 1, "waiting"), (4, "e", 0, "enqueued")]
    got = transitions.advance(WorkflowStatus.RUNNING, steps_completed=2, steps_total=5, unblocked=unblocked)
    assert (got.ready, got.completed) == (("b", "d"), False)
    assert transitions.advance(WorkflowStatus.RUNNING, steps_completed=5, steps_total=5, unblocked=[]).completed
    stopped = transitions.advance(WorkflowStatus.FAILED, steps_completed=5, steps_total=5, unblocked=unblocked)
    assert (stopped.ready, stopped.completed) == ((), False)


def test_heartbeat_never_extends_past_the_deadline() -> None:
    capped = transitions.heartbeat(S.RUNNING, True, extend_secs=60, now=T0, deadline=T0 + 10)
    assert capped.locked_until == T0 + 10
    assert transitions.heartbeat(S.RUNNING, True, extend_secs=5, now=T0, deadline=T0 + 10).locked_until == T0 + 5


@pytest.mark.parametrize(
    ("status", "current", "expected"),
    [
        (None, False, (NOT_FOUND, None, False)),
        (S.RUNNING, False, (CONFLICT, None, False)),
        (S.RUNNING, True, (OK, S.PENDING, True)),
        (S.PENDING, True, (OK, S.PENDING, False)),  # a replay
        (S.COMPLETED, True, (CONFLICT, None, False)),
        (S.FAILED, True, (CONFLICT, None, False)),
        (S.CANCELLED, True, (CONFLICT, None, False)),
    ],
)
def test_snooze(status, current, expected) -> None:
    result = transitions.snooze(status, current, queue="q")
    assert (result.outcome, result.status, result.applied) == expected


def test_retry_in_replaces_the_delay_not_the_decision() -> None:
    kw = {"queue": "q", "max_attempts": 2, "retry_at": ALWAYS_RETRY, "now": T0, "retry_in_secs": 300}
    assert transitions.fail(S.RUNNING, True, attempt=1, **kw).retry_at == T0 + 300
    assert transitions.fail(S.RUNNING, True, attempt=2, **kw).retry_at is None
    assert transitions.fail(S.RUNNING, True, attempt=1, retryable=False, **kw).retry_at is None
    assert transitions.fail(S.RUNNING, True, attempt=1, **{**kw, "retry_in_secs": 0}).retry_at == T0


def test_a_jobs_own_backoff() -> None:
    own = {"initial_secs": 3, "factor": 3, "max_secs": 20, "jitter": 0}
    kw = {"queue": "q", "max_attempts": 9, "retry_at": RetryPolicy().retry_at, "now": T0, "backoff": own}
    delays = [transitions.fail(S.RUNNING, True, attempt=n, **kw).retry_at - T0 for n in (1, 2, 3, 4)]
    assert delays == [3, 9, 20, 20]


def test_a_timed_out_job_fails_as_a_fail_would() -> None:
    def timed(job_id: str, attempt: int, **kw):
        return transitions.Expired(
            job_id=job_id, queue="q", attempt=attempt, max_attempts=2, locked_until=T0, deadline=T0, timeout_secs=7, **kw
        )

    lost = expired("lost", attempt=1, max_attempts=2)
    decided, _ = transitions.reap([timed("again", 1), timed("dead", 2), lost], retry_at=ALWAYS_RETRY, now=T0 + 1)
    assert [(d.job_id, d.status, d.error, d.retry_at) for d in decided] == [
        ("again", S.PENDING, "timed out after 7 s", T0 + 11),
        ("dead", S.FAILED, "timed out after 7 s", None),
        ("lost", S.PENDING, LEASE_EXPIRED, None),
    ]
    assert transitions.timed_out(T0, T0) and not transitions.timed_out(T0 - 1, T0) and not transitions.timed_out(T0, None)
    # a workflow step that timed out on its last attempt fails its workflow
    _, failing = transitions.reap([timed("step", 2, workflow_id="w", step="s")], retry_at=ALWAYS_RETRY, now=T0)
    assert failing == {"w": "step"}


@pytest.mark.parametrize(
    ("status", "current", "replay", "writes"),
    [
        (Status.RUNNING, True, False, True),
        (Status.RUNNING, True, True, False),
        (Status.COMPLETED, True, True, False),  # a retried add answered after the completion
        (Status.COMPLETED, True, False, None),
        (Status.CANCELLED, True, False, None),  # its workflow cancelled or failed meanwhile
        (Status.PENDING, True, False, None),
        (Status.RUNNING, False, False, None),
        (Status.RUNNING, False, True, None),  # another attempt's token: stale, replay or not
    ],
)
def test_steps_add_keeps_the_lease_token_rules_of_complete(
    status: Status, current: bool, replay: bool, writes: bool | None
) -> None:
    if writes is None:
        with pytest.raises(errors.Conflict) as raised:
            transitions.steps_add(status, current, replay=replay)
        assert raised.value.code == "lease_lost"
    else:
        assert transitions.steps_add(status, current, replay=replay) is writes
