"""Bounds on what one GraphQL request may cost, so the control plane never stalls the data plane.

Both run on the event loop that also runs the tick, so each bound is a bound on how long any one
request can hold the loop:
- `QueryCost`: every field counts 1 (each alias separately, fragments at each use) and every id
  in a list argument counts 1, checked before anything executes. Depth and token limits alone let
  five aliases of one large channel through.
- `ValueBudget`: array elements in one response. JSON of 100,000 float64 takes ~15 ms with orjson
  here (~140 ms with the json module), about one tick; arrays larger than that belong on the
  stream, which carries them as raw bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from graphql import (
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    InlineFragmentNode,
    ListValueNode,
    OperationDefinitionNode,
    SelectionSetNode,
    VariableNode,
)
from strawberry.extensions import SchemaExtension

from ..access.identity import Identity
from ..access.ratelimit import RateLimiter
from ..errors import PvwireError
from ..limits import integer

__all__ = ["LIST_ARGUMENTS", "QueryCost", "ValueBudget", "ValueTooLarge", "elements"]

# Arguments whose length is work: one upstream get, put or channel per element.
LIST_ARGUMENTS = frozenset({"ids", "puts"})


class ValueTooLarge(PvwireError):
    code = "TOO_LARGE"


class ValueBudget:
    """Array elements left for one response."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit

    def take(self, channel_id: str, value: object) -> None:
        n = elements(value)
        if n > self.left:
            raise ValueTooLarge(
                f"{channel_id}: its value has {n:,} elements and this response can carry "
                f"{self.left:,} more (at most {self.limit:,} per GraphQL request); read large "
                "arrays on the stream (subscribe), which carries them as raw bytes"
            )
        self.left -= n


def elements(value: object) -> int:
    """How many elements a value holds, for the budget (a scalar or string is one)."""
    if isinstance(value, np.ndarray):
        return int(value.size)
    if isinstance(value, dict):
        return sum(elements(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(elements(v) for v in value) if value else 0
    return 1


class QueryCost(SchemaExtension):
    """Refuses a request whose cost exceeds `limit` before it executes."""

    limit = integer("max_query_cost")

    def on_validate(self) -> Iterator[None]:
        ctx = self.execution_context
        document = ctx.graphql_document
        if document is not None and ctx.pre_execution_errors is None:
            fragments = {
                d.name.value: d
                for d in document.definitions
                if isinstance(d, FragmentDefinitionNode)
            }
            variables = ctx.variables or {}
            cost = 0
            for definition in document.definitions:
                if isinstance(definition, OperationDefinitionNode):
                    cost += _cost(definition.selection_set, fragments, variables, set())
                    if cost > self.limit:
                        break
            if cost > self.limit:
                ctx.pre_execution_errors = [
                    GraphQLError(
                        f"query cost {cost:,} exceeds this server's limit of {self.limit:,} "
                        "(each field counts 1, each alias and fragment use again, each id in "
                        "`ids`/`puts` 1); split it into several requests",
                        extensions={"code": "QUERY_TOO_COSTLY"},
                    )
                ]
            elif not self._within_rate(cost):
                ctx.pre_execution_errors = [
                    GraphQLError(
                        f"more than {self._rate():g} query cost per second from this identity; "
                        "slow down",
                        extensions={"code": "RATE_LIMITED"},
                    )
                ]
        yield

    def _limiter(self) -> RateLimiter | None:
        context = self.execution_context.context
        limiter = context.get("cost_limiter") if isinstance(context, dict) else None
        return limiter if isinstance(limiter, RateLimiter) else None

    def _rate(self) -> float:
        limiter = self._limiter()
        return limiter.rate if limiter is not None else 0.0

    def _within_rate(self, cost: int) -> bool:
        """Each identity (user, else client address) spends from its own budget per second."""
        limiter = self._limiter()
        context = self.execution_context.context
        identity = context.get("identity") if isinstance(context, dict) else None
        if limiter is None or not isinstance(identity, Identity):
            return True
        return limiter.take(identity.rate_key, cost)


def _cost(
    selections: SelectionSetNode | None,
    fragments: Mapping[str, FragmentDefinitionNode],
    variables: Mapping[str, Any],
    expanding: set[str],
) -> int:
    if selections is None:
        return 0
    cost = 0
    for node in selections.selections:
        if isinstance(node, FieldNode):
            cost += 1 + _cost(node.selection_set, fragments, variables, expanding)
            for arg in node.arguments or ():
                if arg.name.value in LIST_ARGUMENTS:
                    cost += _list_length(arg.value, variables)
        elif isinstance(node, InlineFragmentNode):
            cost += _cost(node.selection_set, fragments, variables, expanding)
        elif isinstance(node, FragmentSpreadNode):
            name = node.name.value
            fragment = fragments.get(name)
            if fragment is not None and name not in expanding:  # a cycle fails validation anyway
                expanding.add(name)
                cost += _cost(fragment.selection_set, fragments, variables, expanding)
                expanding.discard(name)
    return cost


def _list_length(value: object, variables: Mapping[str, Any]) -> int:
    if isinstance(value, ListValueNode):
        return len(value.values)
    if isinstance(value, VariableNode):
        given = variables.get(value.name.value)
        return len(given) if isinstance(given, list) else 1
    return 1
