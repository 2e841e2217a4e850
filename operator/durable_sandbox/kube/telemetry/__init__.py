"""The operator's Prometheus metrics and the small HTTP server that serves them with the health probes."""
