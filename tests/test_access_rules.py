"""Access rules: first match wins, groups/users/hosts, field writes only when named, reload."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pvwire.access.forwarded import TrustedProxies
from pvwire.access.identity import Identity
from pvwire.access.rules import Access, AccessRules, RulesError, RulesFile, split_field
from pvwire.config import Settings
from pvwire.core.hub import Hub
from pvwire.wire.tokens import TokenSigner

from .hub_doubles import KEYS, FakeBackend

RULES = """
default = "READ"
[[rule]]
channels = ["ca://BL01:*:SP", "pva://BL01:*:SP"]
groups = ["operators"]
access = "WRITE"
[[rule]]
channels = ["ca://BL01:*"]
users = ["eve"]
access = "NONE"
[[rule]]
channels = ["ca://BL01:M*"]
groups = ["engineers"]
fields = ["PROC"]
access = "WRITE"
[[rule]]
channels = ["ca://SECRET:*"]
access = "NONE"
[[rule]]
channels = ["ca://LAB:*"]
hosts = ["10.9.0.0/16"]
access = "WRITE"
"""

OPERATOR = Identity("olga", frozenset({"operators"}), "jwt", "10.0.0.1")
VIEWER = Identity("vic", frozenset({"viewers"}), "jwt", "10.0.0.2")
ENGINEER = Identity("enzo", frozenset({"engineers"}), "jwt", "10.9.1.1")
EVE = Identity("eve", frozenset({"operators"}), "jwt", "10.0.0.3")
ANON = Identity("", address="10.0.0.4")


@pytest.mark.parametrize(
    ("who", "channel", "access"),
    [
        (OPERATOR, "ca://BL01:M1:SP", Access.WRITE),
        (OPERATOR, "pva://BL01:M1:SP", Access.WRITE),
        (VIEWER, "ca://BL01:M1:SP", Access.READ),
        (ANON, "ca://BL01:M1:SP", Access.READ),
        (OPERATOR, "ca://BL01:M1:SP.PROC", Access.READ),  # a field write needs a rule naming it
        (OPERATOR, "ca://BL01:M1:SP.DISA", Access.READ),
        (OPERATOR, "ca://BL01:M1:SP.VAL", Access.WRITE),  # .VAL is the value itself
        (EVE, "ca://BL01:M1:SP", Access.WRITE),  # first match wins: the operators rule
        (EVE, "ca://BL01:M1:RBV", Access.NONE),
        (ENGINEER, "ca://BL01:M1:RBV.PROC", Access.WRITE),
        (ENGINEER, "ca://BL01:M1:RBV.SCAN", Access.READ),
        (VIEWER, "ca://SECRET:KEY", Access.NONE),
        (VIEWER, "ca://SECRET:KEY.DESC", Access.NONE),  # hiding a record hides its fields
        (ENGINEER, "ca://LAB:X", Access.WRITE),  # from 10.9.0.0/16
        (OPERATOR, "ca://LAB:X", Access.READ),
    ],
)
def test_rules(who: Identity, channel: str, access: Access) -> None:
    assert AccessRules.parse(RULES).access(who, channel) == access


def test_write_rule_flags_are_a_shorthand_after_the_file() -> None:
    rules = AccessRules.parse('default = "NONE"', ["sim://value*"])
    assert rules.access(ANON, "sim://value/x") == Access.WRITE
    assert rules.access(ANON, "sim://sine") == Access.NONE
    assert AccessRules.parse("", ["ca://X:*"]).access(ANON, "ca://X:A.PROC") == Access.READ
    named = AccessRules.parse("", ["ca://X:*.PROC"])  # a glob that names the field grants it
    assert named.access(ANON, "ca://X:A.PROC") == Access.WRITE
    assert named.access(ANON, "ca://X:A") == Access.READ


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("default = 'MAYBE'", "NONE, READ or WRITE"),
        ("[[rule]]\naccess = 'READ'", "needs `channels`"),
        ("[[rule]]\nchannels = ['x']\naccess = 'READ'\ncolour = 1", "unknown keys"),
        ("[[rule]]\nchannels = ['x']\naccess = 'READ'\nhosts = ['nonsense']", "hosts"),
        ("default = ", "not valid TOML"),
        ("defualt = 'READ'", "unknown keys"),
    ],
)
def test_bad_rules_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(RulesError, match=message):
        AccessRules.parse(text)


def test_split_field() -> None:
    assert split_field("ca://A:B.PROC") == ("ca://A:B", "PROC")
    assert split_field("ca://A:B.VAL") == ("ca://A:B", "")
    assert split_field("ca://A:B.VAL$") == ("ca://A:B", "")
    assert split_field("ca://A:B") == ("ca://A:B", "")
    assert split_field("sim://sine?period=0.5") == ("sim://sine?period=0.5", "")


def test_reload_on_change_keeps_old_rules_when_the_new_file_is_bad(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(RULES)
    rules = RulesFile(str(path))
    assert not rules.reload_if_changed()
    path.write_text('default = "NONE"\n')
    os.utime(path, (1, 1))  # a new stamp even within the file system's time resolution
    assert rules.reload_if_changed()
    assert rules.rules.access(VIEWER, "ca://ANY") == Access.NONE
    path.write_text("default = [broken")
    os.utime(path, (2, 2))
    assert not rules.reload_if_changed()
    assert rules.rules.access(VIEWER, "ca://ANY") == Access.NONE  # the old rules stay
    assert not rules.reload_if_changed()  # a bad version is not retried until it changes


def test_a_hosts_rule_matches_no_client_known_only_as_a_trusted_proxy(tmp_path: Path) -> None:
    """A request from a trusted proxy that names nobody behind it (a TCP-mode frontend, a proxy
    that does not append) has the proxy's address: a rule for the network the proxy sits in
    does not take it for a client there; the proxy's neighbours (an IPv4-mapped one too) are
    matched as ever, and so is the proxy's address where it is listed as no proxy."""
    proxy, neighbour = Identity("", address="10.9.9.9"), Identity("", address="10.9.9.8")
    proxies = TrustedProxies(["10.9.9.9/32"])
    rules = AccessRules.parse(RULES, proxies=proxies)
    assert rules.access(proxy, "ca://LAB:X") == Access.READ
    assert rules.access(neighbour, "ca://LAB:X") == Access.WRITE
    assert rules.access(Identity("", address="::ffff:10.9.9.8"), "ca://LAB:X") == Access.WRITE
    assert AccessRules.parse(RULES).access(proxy, "ca://LAB:X") == Access.WRITE
    path = tmp_path / "rules.toml"
    path.write_text(RULES)  # and so from a file, as the hub reads them
    assert RulesFile(str(path), (), proxies).rules.access(proxy, "ca://LAB:X") == Access.READ


@pytest.mark.parametrize(
    ("address", "admin"),
    [("127.0.0.1", True), ("::1", True), ("127.0.0.2", False), ("10.0.0.1", False)],
)
def test_the_admin_views_take_no_trusted_proxy_for_this_machine(address: str, admin: bool) -> None:
    """Without an admin group, a request from this machine sees who is connected; one whose
    client is a trusted proxy's own address (on this machine too) came from whoever the proxy
    did not name."""
    settings = Settings(default_scheme="fake", trusted_proxies=["127.0.0.2/32"])
    hub = Hub({"fake": FakeBackend()}, settings, TokenSigner(KEYS, "k1"))
    assert hub.is_admin(Identity("", address=address)) is admin
