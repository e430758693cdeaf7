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

from collections.abc import Iterator
from pathlib import Path

import graphql
import httpx
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis_graphql import Mode, mutations, nodes, queries

from tests.server_process import ServerProcess

SCHEMA = (Path(__file__).resolve().parents[1] / "protocol" / "schema.graphql").read_text()
REQUEST_TIMEOUT_S = 60.0  # generous on a busy machine; no request here should take a second
EXAMPLES = 150  # per test: each is one HTTP request


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


SCALARS = {"JSON": json_values()}
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


@hypothesis_settings(max_examples=EXAMPLES)
@given(data=st.data(), mode=MODES)
def test_generated_queries_get_an_answer_never_a_server_error(
    http: httpx.Client, data: st.DataObject, mode: Mode
) -> None:
    answered(http, data.draw(queries(SCHEMA, custom_scalars=SCALARS, mode=mode)))


@hypothesis_settings(max_examples=EXAMPLES)
@given(data=st.data(), mode=MODES)
def test_generated_mutations_get_an_answer_never_a_server_error(
    http: httpx.Client, data: st.DataObject, mode: Mode
) -> None:
    answered(http, data.draw(mutations(SCHEMA, custom_scalars=SCALARS, mode=mode)))


def test_the_server_is_well_after_the_fuzzing(server: ServerProcess) -> None:
    """Run last in this module: what the fuzzing sent left the server serving."""
    assert server.graphql('{ search(pattern: "sim://*", limit: 1) }').get("errors") is None
    with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S) as client:
        assert client.get("/readyz").json()["ready"] is True
