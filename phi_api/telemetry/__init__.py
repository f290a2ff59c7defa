"""What the server tells its operators: Prometheus metrics, OpenTelemetry traces and log lines."""
