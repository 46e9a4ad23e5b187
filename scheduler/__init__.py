"""Audio items, an utterance's timeline, and the per-step scheduler."""

from scheduler.items import AudioItem, PlaceholderRange, append_item, get_items_in_window
from scheduler.request import PLACEHOLDER, Request, RequestKind, RequestUpdate
from scheduler.scheduler import ScheduledRequest, Scheduler, SchedulerConfig, SchedulerOutput

__all__ = [
    "PLACEHOLDER",
    "AudioItem",
    "PlaceholderRange",
    "Request",
    "RequestKind",
    "RequestUpdate",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "append_item",
    "get_items_in_window",
]
