"""Kafka clients: settings and security, topics, offsets and lag, reading topics back."""
