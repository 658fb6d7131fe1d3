"""Zone router: works out which zone a client is in and rewrites broker-naming
responses so each client sees only its own zone. Pure logic, no I/O.
(Arrives with the proxy issue.)
"""
