"""The systemd unit files, shipped as package data of edge_agent (read by edge_agent.service.supervisor)."""
