"""The control plane never stalls the data plane: GraphQL requests are bounded in the work they
can ask for, and say so clearly when refused. Over real HTTP against the real server."""

from __future__ import annotations

from tests.server_process import ServerProcess

BIG = "sim://waveform?length=1000001&rate=1"


def test_large_arrays_are_refused_with_a_pointer_to_the_stream(server: ServerProcess) -> None:
    aliases = " ".join(f'a{i}: channel(id: "{BIG}") {{ value }}' for i in range(5))
    doc = server.graphql(f"query {{ {aliases} }}")
    errors = doc["errors"]  # `channel` is non-null: the first error nulls the whole answer
    assert errors and {e["extensions"]["code"] for e in errors} == {"TOO_LARGE"}
    assert "1,000,001 elements" in errors[0]["message"] and "stream" in errors[0]["message"]
    small = server.graphql('query { channel(id: "sim://waveform?length=1000") { value } }')
    assert len(small["data"]["channel"]["value"]) == 1000


def test_one_response_carries_a_bounded_number_of_elements(server: ServerProcess) -> None:
    # Four 40,000-element arrays: the first two fit the 100,000-element budget, then no more.
    ids = [f"sim://waveform/{i}?length=40000&rate=1" for i in range(4)]
    doc = server.graphql(
        "query($ids: [String!]!) { channels(ids: $ids) { value errorCode connection } }",
        {"ids": ids},
    )
    got = doc["data"]["channels"]
    assert [c["errorCode"] for c in got].count("TOO_LARGE") == 2
    # Read, connected, only too large for this answer: not CONNECTING, which waiting would fix.
    assert {c["connection"] for c in got} == {"CONNECTED"}
    assert sum(len(c["value"]) for c in got if c["value"] is not None) == 80_000


def test_query_cost_counts_ids_and_aliases(server: ServerProcess) -> None:
    ids = [f"sim://counter/{i}" for i in range(30_000)]
    doc = server.graphql("query($ids: [String!]!) { channels(ids: $ids) { id } }", {"ids": ids})
    (err,) = doc["errors"]
    assert err["extensions"]["code"] == "QUERY_TOO_COSTLY" and "30,002" in err["message"]
    aliases = " ".join(f'a{i}: search(pattern: "x") ' for i in range(2_000))
    fragment = "fragment F on Query { " + aliases + " }"
    spreads = " ".join("...F" for _ in range(13))
    doc = server.graphql(f"query {{ {spreads} }} {fragment}")
    assert doc["errors"][0]["extensions"]["code"] == "QUERY_TOO_COSTLY"
    assert server.graphql('query { search(pattern: "sim://sine") }')["data"]["search"]


def test_sim_limits_are_clear(server: ServerProcess) -> None:
    doc = server.graphql(
        'query { channel(id: "sim://waveform?length=10000000&rate=1000") { value } }'
    )
    (err,) = doc["errors"]
    assert err["extensions"]["code"] == "BAD_CHANNEL_ID"
    assert "4194304" in err["message"]
    doc = server.graphql('query { channel(id: "sim://waveform?length=1000000&rate=1000") { id } }')
    assert "MB/s" in doc["errors"][0]["message"]
