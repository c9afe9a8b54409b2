"""What every room needs: the configuration and its typed sections, errors, lane names, the filter API and
filter loading, broker files, alert columns, the figures of a batch.  Nothing here starts Spark or Kafka."""
