"""OpenTelemetry tracing of the requests (the ``tracing`` section of the router's YAML), off by default.

``config.py`` is the section and never imports OpenTelemetry; ``tracer.py`` holds the spans and is imported
only when tracing is on (the SDK is the optional ``tracing`` extra), so a router without the extra starts
as long as tracing stays off.
"""
