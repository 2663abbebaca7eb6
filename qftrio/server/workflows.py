"""Workflow policy that needs no database: checking a step graph (what a
workflow's steps do as they end is :mod:`qftrio.server.transitions`').

The schema (:class:`~qftrio.models.WorkflowCreateRequest`) already checks
each field; :func:`check_graph` checks what only the whole graph can show:
unique step names, dependencies that name a step, no cycle, and the size
caps. Every problem is an :class:`~qftrio.errors.InvalidInput` (422) naming
the step, so that nothing is stored for a graph that could never finish.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import errors
from ..models import MAX_WORKFLOW_DEPENDENCIES, MAX_WORKFLOW_STEPS, WorkflowCreateRequest
from .store.base import NewStep, NewWorkflow

__all__ = ["check_graph", "new_workflow"]


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
        steps=tuple(
            NewStep(
                name=s.name,
                kind=s.kind,
                payload=dict(s.payload),
                depends_on=tuple(s.depends_on),
                max_attempts=s.max_attempts,
            )
            for s in body.steps
        ),
    )
