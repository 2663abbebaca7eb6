"""qftrio: a durable job server and a Trio worker runtime."""
