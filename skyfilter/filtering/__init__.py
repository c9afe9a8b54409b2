"""From Kafka bytes to filter verdicts: input schemas, decoding, SQL and Python filters, filter workers,
watchlists and watchmaps.
"""
