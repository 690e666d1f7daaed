"""The uplink: a process of its own that carries the agent's results and health from its
ZeroMQ stream to an MQTT broker, spooling to disk while the broker is out of reach."""
