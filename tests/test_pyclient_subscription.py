"""The subscription state table of the Python client's session core (pvwire_client.subscription).

The shared cases of protocol/cases/ take every listed transition, every unlisted one raises, and
the fields that belong to a state follow it. The TypeScript client's table
(clients/ts/src/subscription.ts, tested by clients/ts/test/subscription.test.ts) and the one in
PROTOCOL.md section 12 must be this one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable
from pathlib import Path
from typing import get_args

import msgpack
import pytest
from pvwire_client.session import Session
from pvwire_client.subscription import (
    SUBSCRIPTION_EVENTS,
    TRANSITIONS,
    Subscription,
    SubscriptionEvent,
    SubscriptionState,
    TransitionError,
    transition,
)

from .test_pyclient_cases import CASES, Runner

ROOT = Path(__file__).resolve().parents[1]
S = SubscriptionState
LIVE = {S.REGISTERING, S.WAITING, S.ATTACHING, S.ATTACHED}
Table = dict[tuple[str, str], str]


def _check_session(session: Session) -> None:
    """The session's own maps agree with its subscriptions' states."""
    subs = list(session._subs.values())
    for sub in subs:
        assert sub.state in LIVE, sub
        assert (sub.att is not None) == (sub.state is S.ATTACHED), sub
        assert (sub.token is not None) == (sub.state in {S.WAITING, S.ATTACHING, S.ATTACHED}), sub
    attached = {id(s) for s in subs if s.state is S.ATTACHED}
    assert {id(s) for s in session._by_att.values()} == attached


def test_the_cases_take_every_listed_transition_and_no_other() -> None:
    taken: set[tuple[SubscriptionState, SubscriptionEvent]] = set()

    def hook(
        key: Hashable, state: SubscriptionState, event: SubscriptionEvent, nxt: SubscriptionState
    ) -> None:
        assert TRANSITIONS[state, event] is nxt, (key, state, event, nxt)
        taken.add((state, event))

    for path in CASES:
        case = json.loads(path.read_text())
        runner = Runner(case.get("options", {}))
        runner.session.on_transition = hook
        for i, step in enumerate(case["steps"]):
            try:
                runner.step(step)
                _check_session(runner.session)
            except AssertionError as e:
                raise AssertionError(f"{path.name} step {i}: {e}") from e
    assert sorted(taken, key=str) == sorted(TRANSITIONS, key=str)


@pytest.mark.parametrize("state", list(SubscriptionState), ids=lambda s: s.value)
def test_an_unlisted_transition_raises(state: SubscriptionState) -> None:
    for event in SUBSCRIPTION_EVENTS:
        if (state, event) in TRANSITIONS:
            assert transition(state, event) is TRANSITIONS[state, event]
        else:
            why = f"^illegal .*: {event} in state {state.value}$"
            with pytest.raises(TransitionError, match=why):
                transition(state, event)
    if state is S.CLOSED:
        assert not [pair for pair in TRANSITIONS if pair[0] is S.CLOSED]


def test_move_sets_the_fields_of_the_state_and_nothing_when_it_raises() -> None:
    sub = Subscription("k", ("ca://X",), None, True, False)
    with pytest.raises(TransitionError):
        sub.move("token")  # WAITING holds a token
    assert (sub.state, sub.token) == (S.REGISTERING, None)
    sub.move("token", token="t")
    with pytest.raises(TransitionError):
        sub.move("attached", att=1)
    sub.move("attach")
    with pytest.raises(TransitionError):
        sub.move("attached")  # ATTACHED has an att
    assert (sub.state, sub.token, sub.att) == (S.ATTACHING, "t", None)
    sub.move("attached", att=3)
    assert (sub.state, sub.token, sub.att) == (S.ATTACHED, "t", 3)
    sub.move("lost")
    assert (sub.state, sub.token, sub.att) == (S.WAITING, "t", None)
    sub.move("remove")
    assert (sub.state, sub.token, sub.att) == (S.CLOSED, None, None)


def test_a_token_for_a_subscription_not_registering_is_refused_and_changes_nothing() -> None:
    session = Session()
    session.add("a", "tok-a", ("ca://X",))
    assert session.state("a") is S.WAITING
    with pytest.raises(TransitionError, match="token in state WAITING"):
        session.set_token("a", "tok-a2")
    session.connection_made(0.0)
    session.receive(msgpack.packb([0, 1, "test", 20, 15000, 65536]), 0.0)
    assert [msgpack.unpackb(d) for d in session.data_to_send()] == [[16, 1, "tok-a"]]
    assert session.state("a") is S.ATTACHING
    assert session.state("b") is None


def _python_table() -> Table:
    return {(s.value, e): n.value for (s, e), n in TRANSITIONS.items()}


def _typescript_table() -> Table:
    source = (ROOT / "clients" / "ts" / "src" / "subscription.ts").read_text()
    body = source.split("SUBSCRIPTION_TRANSITIONS", 1)[1].split("\n};", 1)[0]
    table: Table = {}
    for state, row in re.findall(r"^  ([A-Z]+): \{(.*)\},$", body, re.M):
        for event, nxt in re.findall(r'(\w+): "([A-Z]+)"', row):
            table[state, event] = nxt
    return table


def _protocol_table() -> Table:
    spec = (ROOT / "protocol" / "PROTOCOL.md").read_text()
    section = spec.split("**Subscription states.**", 1)[1].split("\n\n**", 1)[0]
    table: Table = {}
    for state, row in re.findall(r"^\| ([A-Z]+) \| [^|]+ \| ([^|]*) \|$", section, re.M):
        for part in filter(None, row.split("; ")):
            events, nxt = part.split(": ")
            for event in events.split(", "):
                table[state, event] = nxt
    return table


def _typescript_names(const: str) -> list[str]:
    source = (ROOT / "clients" / "ts" / "src" / "subscription.ts").read_text()
    listed = re.search(rf"^export const {const} = \[(.*)\] as const;$", source, re.M)
    assert listed is not None, const
    return re.findall(r'"(\w+)"', listed.group(1))


def test_the_typescript_client_and_the_spec_have_these_states_events_and_table() -> None:
    assert _typescript_names("SUBSCRIPTION_STATES") == [s.value for s in SubscriptionState]
    assert _typescript_names("SUBSCRIPTION_EVENTS") == list(SUBSCRIPTION_EVENTS)
    assert get_args(SubscriptionEvent) == SUBSCRIPTION_EVENTS
    assert _typescript_table() == _python_table()
    assert _protocol_table() == _python_table()
