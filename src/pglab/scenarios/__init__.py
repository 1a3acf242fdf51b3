"""Faults and operations under load (failover, backup, rolling changes) and what measures them from the client's
side: the witness writer, whose log of acknowledged, failed and in-doubt writes gives a fault's RTO and RPO."""
