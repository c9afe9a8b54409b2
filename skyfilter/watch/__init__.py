"""Watchlists and watchmaps: files read and checked, versions stored, sources matched, and the columns filters
read."""
