"""The streaming daemon: one session's COPY loop, the supervisor that reconnects and stops,
settings, and what it tells the outside (state file and the health verdict `status` gives,
metrics, systemd notifications).
"""
