"""The Envoy ext_proc front-end: ``slorouter epp``, an endpoint picker over the gateway's Director."""
