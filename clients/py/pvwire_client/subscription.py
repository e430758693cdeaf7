"""One subscription's state in the session core: an enum of states and one transition table.

The TypeScript client's session core has the same states, events and table
(clients/ts/src/subscription.ts); PROTOCOL.md section 12 shows it. A subscription is:

- ``REGISTERING``: it has no token; a fresh one is being registered (after :class:`Renew`, or
  added without one); :meth:`Session.set_token` hands it over.
- ``WAITING``: it holds a token and waits for a connection's HELLO to attach it.
- ``ATTACHING``: its ATTACH was sent and has no answer yet.
- ``ATTACHED``: the server attached it as ``att``; its entries are routed to it.
- ``ABANDONED``: removed while its ATTACH had no answer: an ATTACHED answering it is detached.
- ``CLOSED``: removed, or ended for good (:class:`Failed`); nothing leaves this state.

Events: ``token`` (a token arrives), ``expiring`` (the token expires within 1 s: Renew before
attaching), ``attach`` (ATTACH sent), ``attached`` (ATTACHED with the token's channels, or any
ATTACHED for an abandoned one), ``mismatch`` (ATTACHED naming other channels), ``renew`` (ERROR
4401/4402 for the first time: register again), ``refused`` (any other ERROR answering the ATTACH),
``ended`` (the server's DETACHED), ``lost`` (the connection ended), ``closed`` (a terminal close,
or a HELLO of another version), ``remove`` (the application ends it).

``token`` is held exactly from WAITING to ATTACHED and ``att`` exactly in ATTACHED: :meth:`move`
sets both with the state, so they cannot disagree with it.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from .held import Held

__all__ = [
    "SUBSCRIPTION_EVENTS",
    "TRANSITIONS",
    "Subscription",
    "SubscriptionEvent",
    "SubscriptionState",
    "TransitionError",
    "transition",
]


class SubscriptionState(enum.Enum):
    REGISTERING = "REGISTERING"
    WAITING = "WAITING"
    ATTACHING = "ATTACHING"
    ATTACHED = "ATTACHED"
    ABANDONED = "ABANDONED"
    CLOSED = "CLOSED"


SubscriptionEvent: TypeAlias = Literal[
    "token", "expiring", "attach", "attached", "mismatch", "renew", "refused", "ended", "lost",
    "closed", "remove",
]  # fmt: skip
SUBSCRIPTION_EVENTS: Final[tuple[SubscriptionEvent, ...]] = (
    "token", "expiring", "attach", "attached", "mismatch", "renew", "refused", "ended", "lost",
    "closed", "remove",
)  # fmt: skip

_S = SubscriptionState
# (state, event) -> next state; a pair not listed is a bug of the caller or of the session.
TRANSITIONS: Final[Mapping[tuple[SubscriptionState, SubscriptionEvent], SubscriptionState]] = {
    (_S.REGISTERING, "token"): _S.WAITING,
    (_S.REGISTERING, "lost"): _S.REGISTERING,
    (_S.REGISTERING, "closed"): _S.CLOSED,
    (_S.REGISTERING, "remove"): _S.CLOSED,
    (_S.WAITING, "attach"): _S.ATTACHING,
    (_S.WAITING, "expiring"): _S.REGISTERING,
    (_S.WAITING, "lost"): _S.WAITING,
    (_S.WAITING, "closed"): _S.CLOSED,
    (_S.WAITING, "remove"): _S.CLOSED,
    (_S.ATTACHING, "attached"): _S.ATTACHED,
    (_S.ATTACHING, "mismatch"): _S.CLOSED,
    (_S.ATTACHING, "renew"): _S.REGISTERING,
    (_S.ATTACHING, "refused"): _S.CLOSED,
    (_S.ATTACHING, "lost"): _S.WAITING,
    (_S.ATTACHING, "remove"): _S.ABANDONED,
    (_S.ATTACHED, "ended"): _S.CLOSED,
    (_S.ATTACHED, "lost"): _S.WAITING,
    (_S.ATTACHED, "remove"): _S.CLOSED,
    (_S.ABANDONED, "attached"): _S.CLOSED,
    (_S.ABANDONED, "refused"): _S.CLOSED,
    (_S.ABANDONED, "lost"): _S.CLOSED,
}
_HOLDS_TOKEN = frozenset({_S.WAITING, _S.ATTACHING, _S.ATTACHED})


class TransitionError(RuntimeError):
    """An event the subscription's state does not allow (a bug of the caller or the session)."""


def transition(state: SubscriptionState, event: SubscriptionEvent) -> SubscriptionState:
    """The state after ``event`` in ``state``; :class:`TransitionError` when the table has none."""
    try:
        return TRANSITIONS[state, event]
    except KeyError:
        raise TransitionError(
            f"illegal subscription transition: {event} in state {state.value}"
        ) from None


@dataclass(eq=False, slots=True)
class Subscription:
    """What the session knows of one subscription (``key``)."""

    key: Hashable
    ids: tuple[str, ...] | None  # the token's channels, when the client knows them
    expires_at: float | None  # the token's expiry, on the clock of ``now``
    renewable: bool
    backfill: bool  # the token asked for `backfill`: re-attach with `since`
    state: SubscriptionState = _S.REGISTERING
    token: str | None = None  # held in WAITING, ATTACHING and ATTACHED only
    att: int | None = None  # the attachment, in ATTACHED only
    count: int = 0  # channels of the attachment (len(ATTACHED ids))
    # A token was refused (4401/4402) and registered again: one more refusal before an
    # ATTACHED ends the subscription, so a server refusing every token causes no loop.
    renewed: bool = False
    # What it holds of the past of each channel of the last ATTACHED (held.py): the rows it
    # lacks of a HISTORY, the next ATTACH's `since` (section 2.8). None: not tracked.
    held: Held | None = None

    def move(
        self, event: SubscriptionEvent, *, token: str | None = None, att: int | None = None
    ) -> SubscriptionState:
        """Take ``event`` (:func:`transition`): ``token`` comes with the event ``token``, ``att``
        with ``attached``; the state's fields change with it, and nothing changes when it raises."""
        state = transition(self.state, event)
        token = token if event == "token" else self.token if state in _HOLDS_TOKEN else None
        att = att if state is _S.ATTACHED else None
        if (token is None) == (state in _HOLDS_TOKEN) or (att is None) == (state is _S.ATTACHED):
            raise TransitionError(f"{event} in state {self.state.value} without a token or att")
        self.state, self.token, self.att = state, token, att
        return state
