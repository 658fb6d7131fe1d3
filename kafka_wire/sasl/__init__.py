"""SASL authentication for Kafka clients (SaslHandshake / SaslAuthenticate): the server side of
PLAIN (RFC 4616), SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677) and OAUTHBEARER (RFC 7628,
JWTs checked against a JWKS as Kafka's KIP-768) as Kafka's SASL servers behave, and the PLAIN
credentials file. The mechanisms and one connection's state (`session`) are pure cores without
I/O: every failure is `SaslAuthenticationFailed`. `gate` puts them in front of a request loop
(it answers SaslHandshake and SaslAuthenticate and lets nothing else through before
authentication); `jwks` fetches and refreshes OAUTHBEARER's keys.
"""
