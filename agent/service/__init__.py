"""The service: the agent that builds and runs every part (``runner``, ``assembly``,
``reloading``), its life under systemd (``supervisor``, ``sdnotify``), its HTTP endpoints
(``http_endpoint``, ``metrics``, the live view ``view``) and the MQTT uplink, a process of
its own (``uplink``)."""
