"""Access rules in the spirit of EPICS access security: channel globs x users/groups/hosts ->
NONE, READ or WRITE; the first matching rule wins, else the default.

```toml
default = "READ"                      # when no rule matches (anonymous included)
[[rule]]
channels = ["ca://BL01:*:SP", "pva://BL01:*:SP"]
groups = ["operators"]                # or users = ["alice"]; hosts = ["10.1.0.0/16"]
access = "WRITE"
[[rule]]
channels = ["ca://BL01:*"]
groups = ["engineers"]
fields = ["PROC", "DISA"]             # field writes (NAME.FIELD) need a rule naming them
access = "WRITE"
```

A rule's `channels` match a channel id without its field (`ca://BL01:M1:SP.PROC` is matched as
`ca://BL01:M1:SP`), so a rule that hides a record hides its fields too. A WRITE rule grants writes
to the record's value only; a write to any other field (`.PROC`, `.DISA`, `.SCAN`...) needs a rule
that lists the field in `fields` (or `"*"`), or a glob naming the field (`ca://BL01:*.PROC`). A
WRITE rule that matches the record but not the field makes it readable, and a later WRITE rule
naming the field may still grant it. Empty `users`, `groups` and `hosts` match everyone.
`--write-rule GLOB` flags are a shorthand for WRITE rules for everyone, after the file's rules.

A rule with `hosts` matches no client whose address is a `--trusted-proxy`'s own: such a
request came through the proxy from someone it did not name (a frontend in TCP mode, a proxy
that does not append to `X-Forwarded-For`), so its address says nothing of where it came from.
"""

from __future__ import annotations

import enum
import fnmatch
import ipaddress
import logging
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .forwarded import Address, TrustedProxies, parse_node
from .identity import Identity

__all__ = ["Access", "AccessRules", "Rule", "RulesError", "RulesFile", "split_field"]

log = logging.getLogger("pvwire.access")

# An EPICS field name after the last dot: VAL, PROC, DISA, HIHI, VAL$ (long string form).
_FIELD = re.compile(r"^(?P<base>.+)\.(?P<field>[A-Z][A-Z0-9]{0,3})\$?$")
# A glob that names a field itself: `ca://BL01:*.PROC`, `ca://X.[PD]*` (not `ca://X:*`).
_FIELD_GLOB = re.compile(r"\.[A-Z0-9*?\[\]]{1,8}$")


class Access(enum.IntEnum):
    NONE = 0
    READ = 1
    WRITE = 2


class RulesError(ValueError):
    """A rules file that cannot be used, with the place and reason."""


def split_field(channel_id: str) -> tuple[str, str]:
    """(id without field, FIELD or ""); `NAME.VAL` counts as the record's value, no field."""
    m = _FIELD.match(channel_id)
    if m is None or m["field"] == "VAL":
        return (m["base"] if m else channel_id), ""
    return m["base"], m["field"]


@dataclass(frozen=True, slots=True)
class Rule:
    channels: tuple[str, ...]
    access: Access
    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    hosts: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()  # client networks
    fields: frozenset[str] = frozenset()  # field writes this rule grants; "*" = all

    def matches(
        self, identity: Identity, base_id: str, full_id: str, host: Address | None = None
    ) -> tuple[bool, bool]:
        """(whether the rule applies, whether a glob named the field itself: a glob such as
        `ca://BL01:*.PROC` matches the field's id and grants writes to that field). `host` is
        the client's address for `hosts` (None: it matches none)."""
        if self.users and identity.user not in self.users:
            return False, False
        if self.groups and not self.groups & identity.groups:
            return False, False
        if self.hosts and (host is None or not any(host in n for n in self.hosts)):
            return False, False
        if full_id != base_id and any(
            _FIELD_GLOB.search(g) and fnmatch.fnmatchcase(full_id, g) for g in self.channels
        ):
            return True, True
        return any(fnmatch.fnmatchcase(base_id, g) for g in self.channels), False


class AccessRules:
    def __init__(
        self,
        rules: Sequence[Rule],
        default: Access = Access.READ,
        proxies: TrustedProxies | None = None,
    ) -> None:
        self.rules = tuple(rules)
        self.default = default
        self.proxies = proxies or TrustedProxies()
        self._hosts = any(r.hosts for r in self.rules)

    def host(self, address: str) -> Address | None:
        """The address `hosts` rules see of a client at `address`: None for no address or a
        trusted proxy's own."""
        ip = parse_node(address)
        return None if ip is None or self.proxies.holds(ip) else ip

    def access(self, identity: Identity, channel_id: str) -> Access:
        """What `identity` may do with `channel_id` (a canonical id, maybe with a field)."""
        base, field = split_field(channel_id)
        capped: Access | None = None  # a WRITE rule matched the record but not this field
        host = self.host(identity.address) if self._hosts else None
        for rule in self.rules:
            applies, names_field = rule.matches(identity, base, channel_id, host)
            if not applies:
                continue
            grants = rule.access == Access.WRITE and (names_field or _grants_field(rule, field))
            if capped is None:
                if rule.access == Access.WRITE and field and not grants:
                    capped = Access.READ  # readable; a later rule may still grant the field
                    continue
                return rule.access
            if grants:
                return Access.WRITE
        if capped is not None:
            return capped
        if self.default == Access.WRITE and field:
            return Access.READ  # a default never grants field writes
        return self.default

    def may_write_somewhere(self) -> bool:
        return self.default == Access.WRITE or any(r.access == Access.WRITE for r in self.rules)

    @classmethod
    def parse(
        cls,
        text: str,
        extra_write_globs: Iterable[str] = (),
        where: str = "rules",
        proxies: TrustedProxies | None = None,
    ) -> AccessRules:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise RulesError(f"{where}: not valid TOML: {exc}") from None
        unknown = set(doc) - {"default", "rule"}
        if unknown:
            raise RulesError(f"{where}: unknown keys {sorted(unknown)} (known: default, rule)")
        default = _access(doc.get("default", "READ"), f"{where}: default")
        raw = doc.get("rule", [])
        if not isinstance(raw, list):
            raise RulesError(f"{where}: `rule` must be an array of tables ([[rule]])")
        rules = [_rule(r, f"{where}: rule {i + 1}") for i, r in enumerate(raw)]
        rules += [Rule(channels=(g,), access=Access.WRITE) for g in extra_write_globs]
        return cls(rules, default, proxies)


def _grants_field(rule: Rule, field: str) -> bool:
    return "*" in rule.fields or field in rule.fields


def _access(value: object, where: str) -> Access:
    if not isinstance(value, str) or value.upper() not in Access.__members__:
        raise RulesError(f"{where}: access must be NONE, READ or WRITE, got {value!r}")
    return Access[value.upper()]


def _strings(rule: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = rule.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RulesError(f"{where}: `{key}` must be a list of non-empty strings")
    return tuple(value)


def _rule(raw: object, where: str) -> Rule:
    if not isinstance(raw, dict):
        raise RulesError(f"{where}: must be a table")
    unknown = set(raw) - {"channels", "users", "groups", "hosts", "fields", "access"}
    if unknown:
        raise RulesError(f"{where}: unknown keys {sorted(unknown)}")
    channels = _strings(raw, "channels", where)
    if not channels:
        raise RulesError(f"{where}: needs `channels` (globs of channel ids such as ca://BL01:*)")
    try:
        hosts = tuple(ipaddress.ip_network(h, strict=False) for h in _strings(raw, "hosts", where))
    except ValueError as exc:
        raise RulesError(f"{where}: hosts: {exc}") from None
    fields = frozenset(f.upper() for f in _strings(raw, "fields", where))
    return Rule(
        channels=channels,
        access=_access(raw.get("access"), f"{where}: access"),
        users=frozenset(_strings(raw, "users", where)),
        groups=frozenset(_strings(raw, "groups", where)),
        hosts=hosts,
        fields=fields,
    )


class RulesFile:
    """The rules in force, reloaded when the file changes (checked once a second by the hub) or
    on SIGHUP. A reload that fails keeps the old rules and logs why; connections stay."""

    def __init__(
        self, path: str, write_globs: Sequence[str] = (), proxies: TrustedProxies | None = None
    ) -> None:
        self.path = Path(path) if path else None
        self._write_globs = tuple(write_globs)
        self._proxies = proxies
        self._stamp: tuple[float, int] | None = None
        self.rules = (
            self._load() if self.path else AccessRules.parse("", self._write_globs, proxies=proxies)
        )

    def _load(self) -> AccessRules:
        assert self.path is not None
        stat = self.path.stat()
        self._stamp = (stat.st_mtime, stat.st_size)
        return AccessRules.parse(
            self.path.read_text(), self._write_globs, str(self.path), self._proxies
        )

    def reload_if_changed(self, force: bool = False) -> bool:
        """True if new rules took effect. A version that fails is reported once and not tried
        again until the file changes."""
        if self.path is None:
            return False
        try:
            stat = self.path.stat()
            stamp = (stat.st_mtime, stat.st_size)
        except OSError:
            stamp = (0.0, -1)
        if not force and stamp == self._stamp:
            return False
        try:
            rules = self._load()
        except (OSError, RulesError) as exc:
            self._stamp = stamp
            log.error("access rules not reloaded, the previous rules stay in force: %s", exc)
            return False
        self.rules = rules
        log.info("access rules reloaded from %s (%d rules)", self.path, len(rules.rules))
        return True
