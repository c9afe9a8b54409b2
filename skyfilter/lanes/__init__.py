"""What every lane of a stream job shares: the lane base, the monitor, the totals, Kafka offsets, the delivery
log.
"""
