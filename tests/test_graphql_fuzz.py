"""The GraphQL API fuzzed over real HTTP: queries and mutations generated from the published
schema (protocol/schema.graphql) by hypothesis-graphql, valid ones and ones with one violation,
sent to a real server. Whatever a client asks, the answer is a GraphQL answer, never a 5xx, and
it comes (a request that takes longer than REQUEST_TIMEOUT_S is a stall and fails the test).

Bounded: the suite's hypothesis profile (tests/conftest.py: derandomized in CI) with its own
example count, each request bounded in time. The server's default scheme is sim://, so that a
generated id is answered at once (BAD_CHANNEL_ID, or a sim channel) rather than after a
Channel Access search times out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import graphql
import httpx
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis_graphql import Mode, mutations, nodes, queries

from tests.server_process import ServerProcess

# The time bound of each test: its examples take ~20 s on a quiet machine of this kind.
pytestmark = pytest.mark.timeout(300)

SCHEMA = (Path(__file__).resolve().parents[1] / "protocol" / "schema.graphql").read_text()
REQUEST_TIMEOUT_S = 60.0  # generous on a busy machine; no request here should take a second
EXAMPLES = 150  # per test: each is one HTTP request
JSON_TYPE = {"Content-Type": "application/json"}


def json_values() -> st.SearchStrategy[graphql.ValueNode]:
    """Values for the `JSON` scalar (a put's value): numbers, strings, booleans and lists."""
    scalars = st.one_of(
        st.integers().map(nodes.Int),
        st.floats(allow_nan=False, allow_infinity=False).map(nodes.Float),
        st.text(max_size=20).map(nodes.String),
        st.booleans().map(lambda b: graphql.BooleanValueNode(value=b)),
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=5).map(
            lambda items: graphql.ListValueNode(values=tuple(items))
        ),
        max_leaves=10,
    )


# Ids and patterns that reach the server's channels (the sim:// kinds, loc://, an array and an
# image of the largest kinds, writable values) among arbitrary text, for `String` arguments.
IDS = (
    "sim://sine", "sim://counter", "sim://value/fuzz", "sim://string/fuzz", "loc://fuzz",
    "sim://waveform?length=1000000", "sim://image?width=1024&height=1024", "sim://*", "*",
    "sim://sine?period=0", "sim://noise?rate=1e9", "sim://value/fuzz.DESC", "pva://",
)  # fmt: skip


def strings() -> st.SearchStrategy[graphql.ValueNode]:
    return st.one_of(st.sampled_from(IDS), st.text(max_size=30)).map(nodes.String)


SCALARS = {"JSON": json_values(), "String": strings()}
MODES = st.sampled_from([Mode.POSITIVE, Mode.NEGATIVE])


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(
        "--default-scheme", "sim", "--write-rule", "sim://value*", "--write-rule", "sim://string*",
        "--log-level", "warning",
    ) as s:  # fmt: skip
        yield s


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S) as client:
        yield client


def answered(http: httpx.Client, query: str) -> None:
    """One request: any status but 5xx, and a body that is a GraphQL answer."""
    try:
        r = http.post("/graphql", json={"query": query})
    except httpx.TimeoutException:
        pytest.fail(f"no answer within {REQUEST_TIMEOUT_S} s to:\n{query}")
    assert r.status_code < 500, f"{r.status_code} for:\n{query}\n{r.text[:2000]}"
    body = r.json()
    assert isinstance(body, dict) and ("data" in body or "errors" in body), r.text[:2000]


def still_serving(server: ServerProcess) -> None:
    """What a test's fuzzing sent left the server serving: each fuzzing test ends with this,
    so the check holds whatever order the tests run in, alone or together."""
    assert server.graphql('{ search(pattern: "sim://*", limit: 1) }').get("errors") is None
    with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S) as client:
        assert client.get("/readyz").json()["ready"] is True


@pytest.mark.parametrize("generated", [queries, mutations], ids=["queries", "mutations"])
def test_generated_operations_get_an_answer_never_a_server_error(
    server: ServerProcess, http: httpx.Client, generated: Any
) -> None:
    @hypothesis_settings(max_examples=EXAMPLES)
    @given(data=st.data(), mode=MODES)
    def fuzz(data: st.DataObject, mode: Mode) -> None:
        answered(http, data.draw(generated(SCHEMA, custom_scalars=SCALARS, mode=mode)))

    fuzz()
    still_serving(server)


def envelopes() -> st.SearchStrategy[object]:
    """Request bodies around a generated query: odd operation names and variables, and JSON
    that is no GraphQL request at all."""
    values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=8,
    )
    query = queries(SCHEMA, custom_scalars=SCALARS) | mutations(SCHEMA, custom_scalars=SCALARS)
    request = st.fixed_dictionaries(
        {"query": query | values},
        optional={"operationName": values, "variables": values, "extensions": values},
    )
    return request | values


def test_odd_requests_get_an_answer_never_a_server_error(
    server: ServerProcess, http: httpx.Client
) -> None:
    @hypothesis_settings(max_examples=EXAMPLES)
    @given(body=envelopes(), get=st.booleans())
    def fuzz(body: object, get: bool) -> None:
        try:
            if get and isinstance(body, dict):
                params = {k: v if isinstance(v, str) else str(v) for k, v in body.items()}
                r = http.get("/graphql", params=params, headers={"Accept": "application/json"})
            else:
                # NaN and Infinity too, as Python's json module writes and reads them.
                content = json.dumps(body).encode("utf-8", "surrogatepass")
                r = http.post("/graphql", content=content, headers=JSON_TYPE)
        except httpx.TimeoutException:
            pytest.fail(f"no answer within {REQUEST_TIMEOUT_S} s to:\n{body!r}")
        assert r.status_code < 500, f"{r.status_code} for:\n{body!r}\n{r.text[:2000]}"

    fuzz()
    still_serving(server)


@pytest.mark.parametrize("body", [b"false", b"0", b"null", b'"{ __typename }"'])
def test_a_body_of_json_that_is_no_object_is_the_clients_error(
    http: httpx.Client, body: bytes
) -> None:
    """Found by the fuzzing above: these were answered 500."""
    r = http.post("/graphql", content=body, headers=JSON_TYPE)
    assert r.status_code == 400, r.text
    assert "must be a JSON object" in r.text
