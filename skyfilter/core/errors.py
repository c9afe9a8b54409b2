"""The one exception type a user sees as a single line, and how it is printed."""


class SkyfilterError(Exception):
    """A problem the user can fix (bad config, unreachable Kafka, broken filter...).

    The message is one line saying what is wrong and where; command-line tools
    print it without a traceback and exit non-zero.
    """
