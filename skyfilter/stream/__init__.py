"""The Spark side of the stream: the shared stream plan, the delivery lanes (micro-batch and Real-time
Mode), the archive lane and its Delta tables, filter evaluation, caps, monitoring.  Used by the jobs in
``skyfilter.jobs``; built on ``skyfilter.core`` only."""
