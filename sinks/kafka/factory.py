"""Build a Kafka sink from a ``kafka://`` URI."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

from reconcile.core.contract import ConfigurationError
from sinks.base import redact_uri

from .sink import DEFAULT_MARKER_TOPIC, KafkaSink

__all__ = ["brokers_of", "open_uri"]


def brokers_of(name: str, dsn: str) -> tuple[str, str]:
    """The brokers and the marker topic of ``kafka://host:port[,host:port][?marker_topic=M]``.

    Raises:
        ConfigurationError: not a kafka:// URI with brokers, or an unknown option.
    """
    parts = urlsplit(dsn)
    _no_credentials(name, dsn, parts.netloc)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    marker_topic = options.pop("marker_topic", DEFAULT_MARKER_TOPIC)
    if parts.scheme != "kafka" or not parts.netloc or parts.path.strip("/") or options:
        raise ConfigurationError(
            f"sink {name!r}: {redact_uri(dsn)!r} is not kafka://host:port[,host:port]"
            "[?marker_topic=NAME] (the topic is the table it names)"
        )
    return parts.netloc, marker_topic


def open_uri(name: str, uri: str) -> KafkaSink:
    """``kafka://host:port[,host:port]/TOPIC?key=a,b[&marker_topic=M]``: a KafkaSink.

    Raises:
        ConfigurationError: no topic, no key, or an option the sink does not know.
    """
    parts = urlsplit(uri)
    _no_credentials(name, uri, parts.netloc)
    topic = parts.path.lstrip("/")
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    key = [k for k in options.pop("key", "").split(",") if k]
    marker_topic = options.pop("marker_topic", DEFAULT_MARKER_TOPIC)
    if not parts.netloc or not topic or "/" in topic:
        raise ConfigurationError(
            f"sink {name!r}: {redact_uri(uri)!r} is not kafka://host:port/TOPIC?key=COLUMNS"
        )
    if not key:
        raise ConfigurationError(
            f"sink {name!r}: {redact_uri(uri)!r} names no key columns (?key=a,b)"
        )
    if options:
        raise ConfigurationError(
            f"sink {name!r}: {redact_uri(uri)!r} has options the Kafka sink does not know: "
            f"{sorted(options)}"
        )
    return KafkaSink(parts.netloc, topic, name=name, key=key, marker_topic=marker_topic)


def _no_credentials(name: str, uri: str, netloc: str) -> None:
    """Refuse user info in a ``kafka://`` URI, shown redacted.

    The netloc is the bootstrap list as it is: a ``user:password@`` in it would
    become part of a broker's address (and of every client error that names
    it). SASL and TLS settings are given in code, as librdkafka settings.
    """
    if "@" in netloc:
        raise ConfigurationError(
            f"sink {name!r}: {redact_uri(uri)!r}: a kafka:// URI takes no credentials; "
            "give SASL or TLS settings to KafkaSink(..., **config) in code"
        )
