"""The command-line tools of filter authors and operators: filter check and trial, schema registry, watchlists.
"""
