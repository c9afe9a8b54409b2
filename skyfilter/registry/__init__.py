"""The schema registry: a client of a Confluent-compatible registry, or the registry kept in a Kafka topic
and the HTTP API that serves it."""
