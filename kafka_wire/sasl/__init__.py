"""SASL authentication for Kafka clients (SaslHandshake / SaslAuthenticate): the server side of
PLAIN (RFC 4616) and SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka's SASL servers
behave, and the PLAIN credentials file. Pure cores without I/O: a listener feeds them the
client's SASL bytes and sends back what they return; every failure is `SaslAuthenticationFailed`.
"""
