"""aprof: a profiler for async Python that follows the work its context spawns.

Start with::

    async with aprof.profile() as prof:
        await serve_one_request()
    print(prof.key_averages().table())
    prof.export_chrome_trace("trace.json")

Everything public is re-exported here; the engine lives in private modules.
"""

from ._core._callbacks import (
    AprofWarning,
    CallbackHandle,
    RecordFunctionCallback,
    RecordScope,
    add_context_callback,
    add_global_callback,
    clear_callbacks,
    clear_context_callbacks,
    clear_global_callbacks,
    disable_callback,
    has_callbacks,
    has_context_callbacks,
    has_global_callbacks,
    reenable_callback,
    remove_callback,
    set_record_function_seed_for_testing,
)
from ._core._debug_info import ContextState, DebugInfoGuard, DebugInfoKind, get_debug_info
from ._core._flight import flight_recorder
from ._core._profiler import profile
from ._core._propagation import install_propagation, launch, propagating, uninstall_propagation, wrap
from ._core._record_function import (
    DisableRecordFunctionGuard,
    RecordFunction,
    RecordFunctionGuard,
    enable_record_function,
    get_default_node_id,
    is_record_function_enabled,
    mark,
    record_function,
    set_default_node_id,
)
from ._core._schedule import ProfilerAction, schedule, trace_handler
from ._core._threads import current_thread_id
from ._integrations._asgi import ProfilerMiddleware
from ._integrations._control import disable_remote_control, enable_remote_control
from ._post._analysis import EventAverages, FunctionEventAvg
from ._post._events import FunctionEvent, Track
from ._post._memory import Memory, MemoryStats
from ._post._merge import merge
from ._post._samples import Samples
from ._post._session import Session, load
from ._util import fixup_module_metadata
from ._version import __version__

__all__ = [
    "AprofWarning",
    "CallbackHandle",
    "ContextState",
    "DebugInfoGuard",
    "DebugInfoKind",
    "DisableRecordFunctionGuard",
    "EventAverages",
    "FunctionEvent",
    "FunctionEventAvg",
    "Memory",
    "MemoryStats",
    "ProfilerAction",
    "ProfilerMiddleware",
    "RecordFunction",
    "RecordFunctionCallback",
    "RecordFunctionGuard",
    "RecordScope",
    "Samples",
    "Session",
    "Track",
    "__version__",
    "add_context_callback",
    "add_global_callback",
    "clear_callbacks",
    "clear_context_callbacks",
    "clear_global_callbacks",
    "current_thread_id",
    "disable_callback",
    "disable_remote_control",
    "enable_record_function",
    "enable_remote_control",
    "flight_recorder",
    "get_debug_info",
    "get_default_node_id",
    "has_callbacks",
    "has_context_callbacks",
    "has_global_callbacks",
    "install_propagation",
    "is_record_function_enabled",
    "launch",
    "load",
    "merge",
    "mark",
    "profile",
    "propagating",
    "record_function",
    "reenable_callback",
    "remove_callback",
    "schedule",
    "set_default_node_id",
    "set_record_function_seed_for_testing",
    "trace_handler",
    "uninstall_propagation",
    "wrap",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
