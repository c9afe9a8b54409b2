"""Avro schemas: the project's own and the alert streams', reading one version as another, compatibility,
the Confluent wire format."""
