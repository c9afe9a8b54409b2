"""skyfilter: the streaming filter stage of an astronomical alert stream.

Filter authors need only :func:`alert_filter`; everything else is used by the
command line (``skyfilter``), the producers and the Spark jobs in ``pipelines/``.
"""

from skyfilter.core.filter_api import alert_filter

__all__ = ["alert_filter"]
