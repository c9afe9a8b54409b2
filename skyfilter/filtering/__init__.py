"""From Kafka bytes to filter verdicts: input schemas, decoding, SQL and Python filters, filter workers (the
watchlists and watchmaps they read are ``skyfilter.watch``'s).
"""
