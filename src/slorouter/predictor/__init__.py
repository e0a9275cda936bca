"""The latency predictor: online-trained TTFT/TPOT models (features, sample store, trainer, model files,
predictor, per-endpoint correction). See docs/predictor.md."""

from slorouter.predictor.correction import EndpointCorrection
from slorouter.predictor.features import (
    ALL_FEATURES,
    DEFAULT_SCHEMA,
    MODEL_KINDS,
    SCHEMA_VERSION,
    TPOT_FEATURES,
    TTFT_FEATURES,
    FeatureError,
    FeatureSchema,
    ModelKind,
    SchemaMismatchError,
    columns_to_matrix,
    pod_class_code,
    rows_to_matrices,
    rows_to_matrix,
)
from slorouter.predictor.model_store import ModelFileError, ModelMetadata, ModelStore
from slorouter.predictor.predictor import Predictor, PredictorNotReady
from slorouter.predictor.store import SampleStore, StoreConfig
from slorouter.predictor.trainer import Trainer, TrainerConfig, TrainingReport

__all__ = [
    "ALL_FEATURES",
    "DEFAULT_SCHEMA",
    "MODEL_KINDS",
    "SCHEMA_VERSION",
    "TPOT_FEATURES",
    "TTFT_FEATURES",
    "EndpointCorrection",
    "FeatureError",
    "FeatureSchema",
    "ModelFileError",
    "ModelKind",
    "ModelMetadata",
    "ModelStore",
    "Predictor",
    "PredictorNotReady",
    "SampleStore",
    "SchemaMismatchError",
    "StoreConfig",
    "Trainer",
    "TrainerConfig",
    "TrainingReport",
    "columns_to_matrix",
    "pod_class_code",
    "rows_to_matrices",
    "rows_to_matrix",
]
