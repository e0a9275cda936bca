"""What the tests share; test modules import from here, never from one another.

- ``processes``: free ports, ``slorouter`` commands as child processes, waiting for their output or their
  port, stopping them.
- ``epp``, ``serve``: ``slorouter epp`` with simulated pods and a real Envoy; ``slorouter serve``.
- ``predictor_models``: synthetic samples, trained models on disk, the predictor servers' fixtures.
- ``scheduling``, ``vllm_prompts``, ``bench_requests``: pools, requests and plugin contexts; the prompts of
  the ``hash: vllm`` tests; requests for the cluster simulator.
- ``chart``: the Helm chart's paths, cases and manifest checks.
- ``http_app``: the HTTP server tests' app and raw client.
- ``scripted``: fake model servers that play a script by call order (deadlines and hedges).
- Fakes: an in-test Kubernetes API server (``kube_apiserver``), an OTLP receiver (``otlp_receiver``), and the
  docs' shell commands read and checked (``doc_commands``).
- ``source``: reading test modules' imports (the marker and import checks).
"""
