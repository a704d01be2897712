"""The sidecar's orchestration: the capture service and what runs after a capture
(conversion, push, report), the bounded job child that runs the use cases, and the
memory-profile watcher."""
