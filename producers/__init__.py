"""Alert producers: simulate visits of Rubin alerts, or replay Avro files, into Kafka."""
