"""What every front-end shares above the Director: the router's assembly from the config, turning a parsed
OpenAI request into an ``InferenceRequest``, and recording a finished request's outcome in the metrics."""
