"""The delivery lane: micro-batches and Real-time Mode, caps, and the figures each batch reports.
"""
