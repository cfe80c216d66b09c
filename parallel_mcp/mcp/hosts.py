"""DNS-rebinding protection of the HTTP transport: which ``Host`` and ``Origin`` headers a server
bound to a given address accepts.

A web page can make a browser send requests to a server on the user's machine by pointing its
own host name at 127.0.0.1 ("DNS rebinding"); such requests carry the page's host name in
``Host`` (and ``Origin``). The server therefore accepts only host names it knows it is reached
by: the loopback names when it listens on loopback (or on every address), the address and name
it was bound to, and the names given with ``--allowed-host``. Every spelling is normalized first
(case, a trailing dot, brackets, IPv4 forms such as ``127.1``, IPv4-mapped IPv6 addresses), so
``--host LOCALHOST`` protects exactly like ``--host 127.0.0.1``.

``auth.HostOriginMiddleware`` applies the policy before authentication, so a rebinding page
can neither probe tokens nor use up the client address's failed-authentication allowance.
This module needs nothing but the standard library (the command imports it before the SDK).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# The names of the loopback interface that no DNS answer can hijack.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})

# IPv4 in the forms inet_aton() (and so the OS and browsers) accept: 127.1, 0x7f.0.0.1,
# 2130706433, 0177.0.0.1. Checked first because inet_aton() ignores trailing garbage.
_IPV4_LEGACY = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}$")
_HOST_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*$")
_PORT = re.compile(r"^[0-9]{1,5}$")


def canonical_ip(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) is the IPv4 address it maps."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def parse_ip(text: str) -> IPAddress | None:
    """An IP address in any spelling the OS accepts, or None."""
    try:
        return canonical_ip(ipaddress.ip_address(text))
    except ValueError:
        pass
    if _IPV4_LEGACY.match(text):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    return None


def normalize_host(value: str) -> str | None:
    """The canonical spelling of a host name or IP address (brackets allowed around IPv6), or
    None when ``value`` is neither: lower case without a trailing dot for names, the compressed
    form for addresses, IPv4 for an IPv4-mapped IPv6 address."""
    text = value.strip().lower()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
        if ":" not in text:  # brackets are for IPv6 only
            return None
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]
    if not text:
        return None
    address = parse_ip(text)
    if address is not None:
        return str(address)
    if ":" in text or not _HOST_NAME.match(text) or len(text) > 253:
        return None
    return text


def is_loopback(host: str) -> bool:
    """Whether ``host`` (any spelling, no DNS lookup) names the loopback interface."""
    name = normalize_host(host)
    if name is None:
        return False
    if name == "localhost":
        return True
    address = parse_ip(name)
    return address is not None and address.is_loopback


def split_host_port(value: str) -> tuple[str, str | None] | None:
    """``host[:port]`` as in a ``Host`` header (IPv6 in brackets), or None when malformed."""
    text = value.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None
        host, rest = text[: end + 1], text[end + 1 :]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            return None
        port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    elif ":" in text:  # an IPv6 address without brackets is not a valid Host
        return None
    else:
        return text, None
    return (host, port) if _PORT.match(port) else None


@dataclass(frozen=True)
class HostPolicy:
    """The normalized host names a server accepts in ``Host`` and ``Origin`` (any port)."""

    names: frozenset[str]

    @classmethod
    def of(cls, names: Iterable[str]) -> HostPolicy:
        normalized = set()
        for name in names:
            canonical = normalize_host(name)
            if canonical is None:
                raise ValueError(f"{name!r} is not a host name or IP address")
            normalized.add(canonical)
        return cls(frozenset(normalized))

    def allows_host(self, header: str | None) -> bool:
        """A ``Host`` header: required, and naming one of the allowed hosts."""
        parts = split_host_port(header) if header else None
        return parts is not None and normalize_host(parts[0]) in self.names

    def allows_origin(self, header: str | None) -> bool:
        """An ``Origin`` header: absent (not a browser, or same-origin), or an http(s) origin
        on one of the allowed hosts. ``null`` (sandboxed frames, files) is refused."""
        if header is None:
            return True
        try:
            origin = urlsplit(header.strip())
        except ValueError:
            return False
        if origin.scheme not in ("http", "https") or origin.path or origin.query:
            return False
        if "@" in origin.netloc:
            return False
        parts = split_host_port(origin.netloc)
        return parts is not None and normalize_host(parts[0]) in self.names


@dataclass(frozen=True)
class Bind:
    """Where ``--host`` makes the server listen: the address the OS resolves it to."""

    host: str  # as given
    address: IPAddress  # canonical (IPv4 for an IPv4-mapped address)
    family: int
    proto: int  # IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so
    sockaddr: tuple

    @property
    def loopback(self) -> bool:
        return self.address.is_loopback

    @property
    def wildcard(self) -> bool:
        """Listening on every address (``0.0.0.0``, ``::``)."""
        return self.address.is_unspecified


def resolve_bind(host: str, port: int) -> Bind:
    """The address ``host`` binds to (what ``socket.getaddrinfo`` answers first, as the OS
    binds it); ``OSError`` when it does not resolve. A name's trailing dot and brackets around
    an IPv6 address are dropped first."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if text.endswith("."):
        text = text[:-1]  # the fully qualified spelling: resolvers may not know it
    family, _, proto, _, sockaddr = socket.getaddrinfo(
        text, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    ip = sockaddr[0]
    assert isinstance(ip, str)  # SOCK_STREAM: an AF_INET or AF_INET6 address
    address = canonical_ip(ipaddress.ip_address(ip.split("%")[0]))
    return Bind(host=host, address=address, family=family, proto=proto, sockaddr=sockaddr)


def host_policy(bind: Bind, allowed_hosts: Iterable[str] = ()) -> HostPolicy:
    """The hosts a server on ``bind`` accepts: the loopback names when it listens on loopback
    or on every address, the address it listens on and the name it was given (unless that is
    a wildcard), and ``allowed_hosts``."""
    names = set(allowed_hosts)
    if bind.loopback or bind.wildcard:
        names |= LOOPBACK_NAMES
    if not bind.wildcard:
        names.add(str(bind.address))
        given = normalize_host(bind.host)
        if given is not None:
            names.add(given)
    return HostPolicy.of(names)
