"""Recording: logical threads, context-local state, RecordFunction, callbacks, the profiler."""
