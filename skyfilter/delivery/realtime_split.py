"""Which brokers a stream delivers in Real-time Mode and which it leaves to micro-batches beside it, and why.

The rule is :func:`~skyfilter.plan.run_plan.realtime_refusal`; here it is applied to a settled stream plan,
whose filters that work are known (a quarantined or broken filter no longer counts).
"""

from __future__ import annotations

from skyfilter.core.brokers import BrokerSpec
from skyfilter.core.config_types import Realtime
from skyfilter.plan.run_plan import BrokerNeeds, realtime_refusal
from skyfilter.plan.stream_plan import StreamPlan


def broker_refusal(broker: BrokerSpec, plan: StreamPlan, settings: Realtime) -> str | None:
    """Why a broker is not delivered in Real-time Mode under ``plan`` (None when it is): the rule of
    :func:`~skyfilter.plan.run_plan.realtime_refusal` on the filters that work."""
    return realtime_refusal(BrokerNeeds.in_plan(broker, plan.filters), settings)


def split_line(plan: StreamPlan, settings: Realtime) -> str:
    """One line saying which brokers go in Real-time Mode and which in micro-batches, and why."""
    live = [b for b in plan.brokers if b.enabled_filters]
    reasons = {b.name: broker_refusal(b, plan, settings) for b in live}
    fast = [b.name for b in live if reasons[b.name] is None]
    slow = [f"{name} ({why})" for name, why in reasons.items() if why is not None]
    line = f"realtime: {len(fast)} of {len(live)} broker(s) in Real-time Mode" + (f": {', '.join(fast)}" if fast
                                                                                     else "")
    if slow:
        line += f"; in micro-batches beside it: {', '.join(slow)}"
    return line
