"""The archive lane and the night archive: Delta tables of alerts, matches and metrics, written exactly once, and
read back by nights.
"""
