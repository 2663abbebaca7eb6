"""Workflow policy that needs no database: checking a step graph (what a
workflow's steps do as they end is :mod:`qftrio.server.transitions`').

The schema (:class:`~qftrio.models.WorkflowCreateRequest`) already checks
each field; :func:`check_graph` checks what only the whole graph can show:
unique step names, dependencies that name a step, no cycle, and the size
caps. Every problem is an :class:`~qftrio.errors.InvalidInput` (422) naming
the step, so that nothing is stored for a graph that could never finish.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from .. import errors
from ..models import (
    MAX_WORKFLOW_DEPENDENCIES,
    MAX_WORKFLOW_GROWN,
    MAX_WORKFLOW_STEPS,
    StepsAddRequest,
    WorkflowCreateRequest,
)
from .store.base import NewStep, NewSteps, NewWorkflow

__all__ = ["check_graph", "new_workflow", "new_steps", "Existing", "check_added"]


def check_graph(names: Sequence[str], depends_on: Sequence[Sequence[str]]) -> None:
    """Raise :class:`~qftrio.errors.InvalidInput` unless the steps *names*
    (``depends_on[i]`` being the dependencies of ``names[i]``) form a DAG
    within the caps. Linear in steps plus dependencies."""
    if not names:
        raise errors.InvalidInput("steps: a workflow needs at least one step")
    if len(names) > MAX_WORKFLOW_STEPS:
        raise errors.InvalidInput(f"steps: at most {MAX_WORKFLOW_STEPS} steps, got {len(names)}")
    total = sum(len(deps) for deps in depends_on)
    if total > MAX_WORKFLOW_DEPENDENCIES:
        raise errors.InvalidInput(f"steps: at most {MAX_WORKFLOW_DEPENDENCIES} dependencies in all, got {total}")
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in index:
            raise errors.InvalidInput(f"steps.{i}.name: duplicate step name {name!r} (also steps.{index[name]})")
        index[name] = i
    for i, deps in enumerate(depends_on):
        seen: set[str] = set()
        for dep in deps:
            if dep not in index:
                raise errors.InvalidInput(f"steps.{i}.depends_on: step {names[i]!r} depends on unknown step {dep!r}")
            if dep == names[i]:
                raise errors.InvalidInput(f"steps.{i}.depends_on: step {dep!r} depends on itself")
            if dep in seen:
                raise errors.InvalidInput(f"steps.{i}.depends_on: step {names[i]!r} lists {dep!r} twice")
            seen.add(dep)
    cycle = _find_cycle(names, depends_on, index)
    if cycle:
        raise errors.InvalidInput(
            f"steps: dependency cycle {' -> '.join(cycle)} (each step depends on the next)"
        )


def _find_cycle(names: Sequence[str], depends_on: Sequence[Sequence[str]], index: dict[str, int]) -> list[str]:
    """A cycle as a list of names (first == last), or ``[]``.

    An iterative depth-first search over the dependency edges: a 1,000-step
    chain would overflow Python's recursion limit with the recursive form.
    """
    WHITE, GREY, BLACK = 0, 1, 2
    colour = [WHITE] * len(names)
    for root in range(len(names)):
        if colour[root] != WHITE:
            continue
        path: list[int] = [root]
        edges = [iter(depends_on[root])]
        colour[root] = GREY
        while path:
            nxt = next(edges[-1], None)
            if nxt is None:
                colour[path.pop()] = BLACK
                edges.pop()
                continue
            j = index[nxt]
            if colour[j] == GREY:
                # ``path`` follows "depends on" edges; show it in that order
                cycle = [names[k] for k in path[path.index(j) :]] + [names[j]]
                return cycle
            if colour[j] == WHITE:
                colour[j] = GREY
                path.append(j)
                edges.append(iter(depends_on[j]))
    return []


def new_workflow(tenant: str, body: WorkflowCreateRequest) -> NewWorkflow:
    """The checked graph of a validated request, ready for the store."""
    check_graph([s.name for s in body.steps], [s.depends_on for s in body.steps])
    return NewWorkflow(
        tenant=tenant,
        name=body.name,
        context=dict(body.context),
        steps=_steps(body.steps),
    )


def _steps(body: Sequence[Any]) -> tuple[NewStep, ...]:
    return tuple(
        NewStep(
            name=s.name, kind=s.kind, payload=dict(s.payload), depends_on=tuple(s.depends_on),
            max_attempts=s.max_attempts,
        )
        for s in body
    )


def new_steps(job_id: str, body: StepsAddRequest) -> NewSteps:
    """The steps of a validated add request, ready for the store (which
    checks them against the workflow with :func:`check_added`)."""
    return NewSteps(job_id=job_id, lease_token=body.lease_token, steps=_steps(body.steps), collect=body.collect)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Existing:
    """What :func:`check_added` needs of a step already in the workflow."""

    step: NewStep
    added_by: str | None
    collect: str | None
    completed: bool


def check_added(
    added: NewSteps,
    adding: str,
    existing: Mapping[str, Existing],
    *,
    steps_added: int,
    dependents: int,
    collect_owner: str | None,
) -> bool:
    """Check the steps that the step *adding* adds against its workflow:
    *existing* holds the workflow's steps named by the request (as names
    or dependencies), *steps_added* counts the steps added to it so far, *dependents* the steps
    waiting for *adding*, and *collect_owner* is the step that added the
    steps collected under the request's key so far, if any.

    Returns True for a replay: these very steps were added by *adding*
    already (nothing to write). Raises :class:`~qftrio.errors.Conflict` when
    *adding* added steps of these names with other fields, and
    :class:`~qftrio.errors.InvalidInput` (422) for any other problem.

    An added step may depend only on the steps added with it and on steps
    that completed: so no cycle can pass through the workflow's existing
    steps, and the graph of the new ones is checked as at creation.
    """
    names = [s.name for s in added.steps]
    taken = [name for name in names if name in existing]
    if taken:
        mine = [name for name in taken if existing[name].added_by == adding]
        by_name = {s.name: s for s in added.steps}
        if len(mine) == len(names) and all(
            existing[n].step == by_name[n] and existing[n].collect == added.collect for n in names
        ):
            return True
        if mine:
            raise errors.Conflict(
                f"steps: step {adding!r} already added a step {mine[0]!r}, with other fields, another collect key or"
                " other steps beside it; a retried add must send the same steps"
            )
        raise errors.InvalidInput(f"steps.{names.index(taken[0])}.name: the workflow already has a step {taken[0]!r}")
    if steps_added + len(names) > MAX_WORKFLOW_GROWN:
        raise errors.InvalidInput(
            f"steps: at most {MAX_WORKFLOW_GROWN} steps are added to a workflow; {steps_added} were,"
            f" {len(names)} more asked"
        )
    if added.collect is not None and collect_owner not in (None, adding):
        raise errors.InvalidInput(
            f"collect: step {collect_owner!r} collects under {added.collect!r} already; choose another key"
        )
    inner = set(names)
    for i, s in enumerate(added.steps):
        for dep in s.depends_on:
            if dep in inner:
                continue
            if dep not in existing:
                raise errors.InvalidInput(f"steps.{i}.depends_on: step {s.name!r} depends on unknown step {dep!r}")
            if not existing[dep].completed:
                raise errors.InvalidInput(
                    f"steps.{i}.depends_on: step {s.name!r} depends on {dep!r}, which has not completed; an added"
                    " step depends only on the steps added with it and on completed ones"
                )
    check_graph(names, [[dep for dep in s.depends_on if dep in inner] for s in added.steps])
    edges = sum(len(s.depends_on) for s in added.steps) + len(names) * (1 + dependents)
    if edges > MAX_WORKFLOW_DEPENDENCIES:
        raise errors.InvalidInput(
            f"steps: {len(names)} steps waited on by the {dependents} steps waiting for {adding!r} make {edges}"
            f" dependencies, more than {MAX_WORKFLOW_DEPENDENCIES}; add fewer steps a call"
        )
    return False
