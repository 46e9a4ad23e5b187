"""What one client may take: per-connection limits, the event-rate bucket, the client's address."""

import ipaddress
import time
from dataclasses import dataclass, field

from realtime.settings import setting

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(kw_only=True)
class ConnectionLimits:
    outbox_events: int = field(default=256, metadata=setting("server events queued per slow client", least=1))
    idle_seconds: float = field(
        default=30.0, metadata=setting("close a connection without events (and owed no result)", least=1)
    )
    max_buffered_seconds: float = field(
        default=30.0,
        metadata=setting("audio received, not yet consumed by the engine: reads pause past it", least=1),
    )
    max_events_per_second: float = field(default=500.0, metadata=setting("client events per second", least=1))
    max_utterances: int = field(
        default=4,
        metadata=setting("live utterances per connection (OpenAI's manual commits each open one)", least=1),
    )


@dataclass
class EventRate:
    """A token bucket holding one second's worth of events; what it cannot pay for is dropped."""

    per_second: float
    tokens: float = field(init=False)
    refilled_at: float = field(default_factory=time.monotonic)
    dropped: int = 0  # events dropped since the bucket was last half full: one flood

    def __post_init__(self) -> None:
        self.tokens = self.per_second

    def allow(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.per_second, self.tokens + (now - self.refilled_at) * self.per_second)
        self.refilled_at = now
        if self.tokens >= 1:
            self.tokens -= 1
            if self.tokens >= self.per_second / 2:
                self.dropped = 0  # the client slowed down: the flood is over
            return True
        self.dropped += 1
        return False


def parse_networks(text: str) -> list[Network]:
    """`10.0.0.0/8,127.0.0.1`: addresses or networks, comma-separated."""
    return [ipaddress.ip_network(part.strip(), strict=False) for part in text.split(",") if part.strip()]


def client_address(peer: str, forwarded_for: list[str], trusted_proxies: list[Network]) -> str:
    """The peer, or behind trusted proxies the nearest untrusted address they forwarded for.

    `forwarded_for`, the `X-Forwarded-For` headers, is read from the right: each trusted
    proxy appended the address it saw, and anything left of the first untrusted one may be
    forged by the client.
    """
    chain = [peer] + [a.strip() for value in reversed(forwarded_for) for a in reversed(value.split(","))]
    for address in chain:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return address  # not an address: the hop that wrote it is the client as far as we know
        if not any(ip in network for network in trusted_proxies):
            return address
    return chain[-1]
