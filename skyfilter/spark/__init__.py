"""Spark plumbing in one place: the session, Spark's private APIs (py4j), steps kept in the JVM, the Python
worker daemon, and skyfilter's own JVM classes.
"""
