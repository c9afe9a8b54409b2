"""The Spark jobs that operators run (``spark-submit pipelines/<job>.py``): the stream, the night replay,
table maintenance, the trigger report.  The scripts in ``pipelines/`` are thin entry points to these."""
