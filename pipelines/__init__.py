"""Spark jobs (filter_stream.py, ...) and the Spark code they share."""
