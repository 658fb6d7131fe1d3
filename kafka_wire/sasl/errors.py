"""The one exception of a failed SASL exchange: a reason for the broker's log, and what the
client may be told."""

from __future__ import annotations

from kafka_wire.errors import ErrorCode

__all__ = ["SaslAuthenticationFailed"]


class SaslAuthenticationFailed(Exception):
    """A SASL exchange that failed, and is over.

    `str(exc)` names the mechanism, the user once the client has named one, and the reason:
    it is meant for the broker's log and never holds a password, a proof or a key, nor the
    client's raw bytes (a PLAIN message sent to a SCRAM listener would carry a password).
    `client_message` is what the SaslAuthenticate response may say: Kafka's generic text
    unless Kafka tells the client more for this failure; `error_code` is
    SASL_AUTHENTICATION_FAILED, or ILLEGAL_SASL_STATE for a message out of order.
    """

    def __init__(
        self,
        mechanism: str,
        reason: str,
        *,
        user: str | None = None,
        client_message: str | None = None,
        error_code: ErrorCode = ErrorCode.sasl_authentication_failed,
    ) -> None:
        who = "" if user is None else f" of user {user!r}"
        super().__init__(f"{mechanism} authentication{who} failed: {reason}")
        self.mechanism = mechanism
        self.reason = reason
        self.user = user
        self.error_code = error_code
        # SaslServerAuthenticator's text for a SaslException: it says nothing of the cause.
        self.client_message = client_message or (
            "Authentication failed during authentication due to invalid credentials with SASL "
            f"mechanism {mechanism}"
        )
