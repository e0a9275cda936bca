"""Pool discovery: the pool's endpoints follow the Ready pods of a Kubernetes InferencePool (or a label
selector), through list and watch on the API server."""
