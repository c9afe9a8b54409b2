"""The ground floor: configuration, Avro schemas and the schema registry, Kafka clients and the local
Kafka, filter loading.  Nothing here starts Spark or imports the floors above: ``skyfilter.producers``, the
Spark packages (``spark``, ``filtering``, ``plan``, ``lanes``, ``delivery``, ``archive``), ``skyfilter.tools``,
``skyfilter.jobs`` and the ``skyfilter`` command."""
