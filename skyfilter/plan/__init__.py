"""What a run settles before it starts: the stream plan (schemas, filters, brokers, outputs), the run plan
(triggers, lanes, slots), and what swaps a new stream plan in (reload, quarantine).
"""
