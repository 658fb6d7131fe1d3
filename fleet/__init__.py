"""Fleet: the top of the house. TOML configuration, the `zonefleet` command line, the local
launcher, node assembly and the admin HTTP endpoint. Nothing imports fleet.
"""
