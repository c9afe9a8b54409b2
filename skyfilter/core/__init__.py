"""The ground floor: configuration, Avro schemas and the schema registry, Kafka clients and the local
Kafka, filter loading.  Nothing here starts Spark or imports the floors above (``skyfilter.producers``,
``skyfilter.stream``, ``skyfilter.jobs``, the ``skyfilter`` command)."""
